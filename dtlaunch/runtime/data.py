"""Batches of record indices cut from a stream of DDS leases, and when to ack a lease.

A worker reads leases (a shard, or the remainder of one) one after another and
cuts their records into batches of its local batch size; a batch crosses lease
boundaries when a lease runs out mid-batch. A lease is DONE only once the step
that trained its last record has applied its gradients, so each batch remembers
which leases it completed, and ``step()`` acks those of the batches it covers.

Which batches a ``step()`` covers:

* ``returned`` (the default): every batch handed out before the call. Exact for
  ``for idx in job.batches(): ...; job.step()``, also with gradient accumulation
  (several batches per step).
* ``one_per_step``: the oldest batch not yet covered. For consumers that read
  batches ahead of training (a torch ``DataLoader`` with worker processes keeps
  several index batches in flight), where "handed out" is not "trained"; exact
  when ``step()`` is called once per batch.

Nothing here does I/O: the lease source does (``client`` or ``standalone``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Literal, Protocol

from dtlaunch.errors import ConfigError
from dtlaunch.runtime.steps import TimedReport
from dtlaunch.sharding import DatasetSpec, shard_records
from dtlaunch.wire.messages import Lease, Message

__all__ = [
    "DATA_WAIT_AGAIN_S",
    "DATA_WAIT_FIRST_S",
    "AckMode",
    "BatchStream",
    "DataWaitListener",
    "LeaseSource",
    "lease_fits",
    "lease_records",
    "local_batch_size",
]

logger = logging.getLogger(__name__)

AckMode = Literal["returned", "one_per_step"]


class NotReady:
    """No lease has arrived yet (not the end of data): see ``poll_lease``."""

    def __repr__(self) -> str:
        return "NOT_READY"


NOT_READY = NotReady()
# How long a batch that already holds records waits for the next lease before it
# is handed out short (see BatchStream.next_batch). Prefetching keeps the next
# lease at hand in mid-data, so a miss mostly means the queue has run dry (the
# end of an epoch, when the others hold the last shards): waiting then only
# stretches every synchronous step, so the wait is short.
SHORT_BATCH_WAIT_S = 0.1


# How long batches() waits for a lease before its listeners hear that it waits for
# data, and how often they hear it again while it still does.
DATA_WAIT_FIRST_S = 0.1
DATA_WAIT_AGAIN_S = 0.5


class DataWaitListener(Protocol):
    """Told when ``Job.batches()`` waits for data and when data comes again.

    ``dtlaunch.ps.Client`` is one: a BSP parameter server must not hold its step
    for a worker that waits for shards the other workers hold (the end of an
    epoch or of the data set), so the client steps aside while its worker waits.
    Both are called from the thread that iterates ``batches()``.
    """

    def waiting_for_data(self) -> None:
        """No lease at hand; called again every ``DATA_WAIT_AGAIN_S`` while none comes."""
        ...

    def data_arrived(self) -> None:
        """A batch is about to be handed out after a wait (not at the end of data)."""
        ...


class LeaseSource(Protocol):
    """Where leases come from and where their acks go."""

    def next_lease(self) -> Lease | None:
        """The next lease to read (blocks until there is one); None at the end of data."""
        ...

    def poll_lease(self, timeout: float) -> Lease | NotReady | None:
        """Like ``next_lease`` but waits at most ``timeout`` s (then ``NOT_READY``)."""
        ...

    def ack(self, lease_ids: Sequence[int], step: int) -> None:
        """These leases' records are all applied, as of ``step``; must not block."""
        ...

    def release(self, lease_ids: Sequence[int], step: int) -> None:
        """Give these leases back to be read again (their step was dropped); must
        not block."""
        ...

    def give_back_queued(self, step: int) -> None:
        """Fetch no more leases, and give back those fetched ahead and not taken
        yet (the worker leaves the job); must not block."""
        ...

    def close(self, timeout: float) -> None:
        """Flush acks (waiting up to ``timeout`` seconds) and release resources."""
        ...

    def report(self, reports: list[TimedReport]) -> None:
        """Hand step measurements over for the Monitor (sent within the report
        interval); must not block."""
        ...

    def flush_reports(self) -> None:
        """Send the measurements handed over so far now (a worker leaving a group,
        or closing); must not block."""
        ...

    def actions(self) -> list[Message]:
        """Actions (AdjustBatchSize, AdjustLR) received since the last call."""
        ...


def local_batch_size(spec: DatasetSpec, rank: int, world_size: int) -> int:
    """B_i = B // n + (1 if rank < B % n else 0); the shard size when B is 0.

    Raises:
        ConfigError: the global batch is smaller than the number of workers, so
            some worker would get empty batches.
    """
    if spec.global_batch == 0:
        return spec.shard_size
    if spec.global_batch < world_size:
        raise ConfigError(
            f"global batch {spec.global_batch} is smaller than the {world_size} workers: "
            "every worker needs at least one record per batch. Fix: raise global_batch "
            "(--global-batch) to at least the number of workers, or pass 0 to use the "
            "shard size as each worker's batch"
        )
    base, extra = divmod(spec.global_batch, world_size)
    return base + (1 if rank < extra else 0)


def lease_fits(spec: DatasetSpec, lease: Lease) -> bool:
    """Whether ``lease`` names records of ``spec`` (a bad grant is dropped, not read)."""
    return (
        lease.epoch < spec.epochs
        and lease.shard < spec.num_shards
        and 0 <= lease.start <= lease.end <= spec.shard_length(lease.shard)
    )


def lease_records(spec: DatasetSpec, lease: Lease) -> list[int]:
    """The record indices of ``lease``, in reading order."""
    return shard_records(spec, lease.epoch, lease.shard)[lease.start : lease.end]


class BatchStream:
    """Cuts leases into batches and decides which leases each ``step()`` acks."""

    def __init__(self, source: LeaseSource, spec: DatasetSpec, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        self._source = source
        self._spec = spec
        self._batch_size = batch_size
        self._mode: AckMode = "returned"
        self._lease_id = -1
        self._records: list[int] = []
        self._pos = 0
        self._ended = False
        # Per handed-out batch not yet covered by a step: the leases it completed,
        # and every lease it read from.
        self._uncovered: deque[tuple[list[int], set[int]]] = deque()
        self._steps = 0
        self._leaving = False  # no lease after the one being read (LeaveJob)

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def set_batch_size(self, batch_size: int) -> None:
        """ADJUST_BS: batches from now on have this many records."""
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        self._batch_size = batch_size

    @property
    def steps(self) -> int:
        """How many times ``step()`` was called."""
        return self._steps

    def continue_at(self, steps: int) -> None:
        """A newcomer joining a running group counts steps from where it stands."""
        if steps < self._steps:
            raise ValueError(f"cannot go back from step {self._steps} to {steps}")
        self._steps = steps

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def mode(self) -> AckMode:
        return self._mode

    def set_mode(self, mode: AckMode) -> None:
        if mode not in ("returned", "one_per_step"):
            raise ValueError(f"unknown ack mode {mode!r}")
        self._mode = mode

    def next_batch(self, first_wait: float | None = None) -> list[int] | None:
        """The next batch of up to ``batch_size`` records; None at the end of data.

        With ``first_wait`` it never blocks longer than that for data it does not
        hold yet: it returns an empty list when no lease came (not the end).
        """
        batch: list[int] = []
        completed: list[int] = []
        touched: set[int] = set()
        while len(batch) < self._batch_size:
            exhausted = self._pos >= len(self._records)
            # A batch that holds the last record of a lease must not wait long for
            # the next lease: that lease's ack comes only with this batch's step(),
            # and at the end of the data the queue finishes only after that ack.
            # So a batch that would cross into a lease that is not there yet is
            # handed out short.
            wait = SHORT_BATCH_WAIT_S if batch else first_wait
            if exhausted and (self._ended or not self._open_next_lease(wait)):
                break
            take = min(self._batch_size - len(batch), len(self._records) - self._pos)
            batch.extend(self._records[self._pos : self._pos + take])
            self._pos += take
            touched.add(self._lease_id)
            if self._pos == len(self._records):
                completed.append(self._lease_id)
        if not batch:
            return [] if first_wait is not None and not self._ended else None
        self._uncovered.append((completed, touched))
        return batch

    def leave(self) -> None:
        """The worker leaves the job (``dtlaunch scale`` removed it): the batches
        end with the lease being read, and the leases fetched ahead go back to
        the queue untouched, so every record is trained once."""
        if self._leaving:
            return
        self._leaving = True
        self._source.give_back_queued(self._steps)

    @property
    def leaving(self) -> bool:
        """``leave()`` was called: the batches end with the lease being read."""
        return self._leaving

    @property
    def drained(self) -> bool:
        """A leaving worker has read its last lease and every batch it took is
        covered by a step (its leases are acked): it may go without losing data."""
        return self._leaving and self._ended and not self._uncovered

    def step(self) -> int:
        """One iteration's gradients are applied: ack the leases its batches finished."""
        self._steps += 1
        lease_ids = [lid for completed, _ in self._covered() for lid in completed]
        if lease_ids:
            self._source.ack(lease_ids, self._steps)
        return self._steps

    def drop_step(self) -> int:
        """One iteration's gradients were left out (BACKUP_WORKERS): every lease
        its batches read from goes back to the DDS whole, to be read again
        (at least once), and the one being read is abandoned. Returns the step."""
        self._steps += 1
        released = sorted({lid for _, touched in self._covered() for lid in touched})
        if self._lease_id in released:
            self._records, self._pos = [], 0  # the next batch opens the next lease
        if released:
            self._source.release(released, self._steps)
        return self._steps

    def _covered(self) -> list[tuple[list[int], set[int]]]:
        """The batches a ``step()`` now covers (see the module doc), taken off."""
        count = len(self._uncovered) if self._mode == "returned" else min(1, len(self._uncovered))
        return [self._uncovered.popleft() for _ in range(count)]

    def _open_next_lease(self, wait: float | None = None) -> bool:
        """Move to the next lease with records; False at the end of data, or when
        ``wait`` is given and no lease came within it."""
        while True:
            if self._leaving:
                self._ended = True
                return False
            polled = self._source.next_lease() if wait is None else self._source.poll_lease(wait)
            if isinstance(polled, NotReady):
                return False
            lease = polled
            if lease is None:
                self._ended = True
                return False
            records = lease_records(self._spec, lease)
            if records:
                self._lease_id, self._records, self._pos = lease.lease_id, records, 0
                return True
            # No records means no gradients to wait for: it is done already.
            logger.debug("lease %d is empty; acked at once", lease.lease_id)
            self._source.ack([lease.lease_id], self._steps)
