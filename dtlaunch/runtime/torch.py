"""``DDSBatchSampler``: feed a torch ``DataLoader`` from the job's data shards.

::

    job = dtlaunch.init(...)
    loader = DataLoader(dataset, batch_sampler=DDSBatchSampler(job), num_workers=2)
    for x, y in loader:
        loss = ...; loss.backward(); optimizer.step()
        job.step()          # once per batch, after the optimizer step

A ``DataLoader`` with worker processes reads index batches ahead of training,
so the sampler switches the job to one batch per ``step()`` (see
``Job.count_one_batch_per_step``): a lease is acked only once the step of the
batch holding its last record has run. torch is an optional dependency; only
this module imports it.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler

from dtlaunch.runtime.context import Job

__all__ = ["DDSBatchSampler"]


class DDSBatchSampler(Sampler[list[int]]):
    """Batches of record indices from ``job.batches()``, for ``batch_sampler=``.

    Has no length: shards are handed out as workers ask, so nobody knows in
    advance how many batches this worker gets. Iterating again continues the
    job's single stream (every epoch is already in it).
    """

    def __init__(self, job: Job) -> None:
        super().__init__()
        self._job = job
        job.count_one_batch_per_step()

    @property
    def job(self) -> Job:
        return self._job

    def __iter__(self) -> Iterator[list[int]]:
        return self._job.batches()
