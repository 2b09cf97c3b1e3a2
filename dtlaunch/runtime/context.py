"""The ``Job`` a training script drives (``dtlaunch.init()`` in ``start`` returns it).

::

    job = dtlaunch.init(dataset_size=50_000, shard_size=1_000, epochs=3, global_batch=256)
    for idx in job.batches():      # record indices, job.local_batch_size at a time
        ...train on idx...
        job.step()                 # gradients applied: leases finished so far are acked
    job.close()

Under ``dtlaunch run`` (``DTLAUNCH_SUPERVISOR`` set) the records come from the
supervisor's Stateful DDS; without it the script runs standalone over the whole
data set, for debugging with plain ``python train.py``.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import socket
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from dtlaunch.inject import parse_injections
from dtlaunch.runtime.client import SupervisorClient
from dtlaunch.runtime.data import (
    DATA_WAIT_AGAIN_S,
    DATA_WAIT_FIRST_S,
    BatchStream,
    DataWaitListener,
    LeaseSource,
    local_batch_size,
)
from dtlaunch.runtime.environ import (
    DEFAULT_INIT_TIMEOUT_S,
    ENV_INIT_TIMEOUT,
    ENV_RNA,
    ENV_ROLE,
    env_float,
)
from dtlaunch.runtime.steps import StepTimer
from dtlaunch.sharding import DatasetSpec
from dtlaunch.wire.messages import (
    AdjustBatchSize,
    AdjustLR,
    Attached,
    LeaveJob,
    PsPlacementMap,
    Regroup,
)

if TYPE_CHECKING:  # torch is optional: only attach() and bsp_batches() need it
    from dtlaunch.runtime.elastic import ElasticGroup

__all__ = ["DataWaitListener", "Job", "current_job"]

logger = logging.getLogger(__name__)

DEFAULT_CLOSE_TIMEOUT_S = 10.0
# The process's open Job (a training process has one, like torch.distributed's
# default group), so helpers such as dtlaunch.ps.Client find it without plumbing.
_current: Job | None = None


def current_job() -> Job | None:
    """The Job returned by the last ``dtlaunch.init()`` in this process, until closed."""
    return _current


class Job:
    """A training process's view of the job: who it is, and its data."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        restart_count: int,
        dataset: DatasetSpec,
        source: LeaseSource,
    ) -> None:
        self._rank = rank
        self._world_size = world_size
        self._restart_count = restart_count
        self._dataset = dataset
        self._source = source
        self._stream = BatchStream(source, dataset, local_batch_size(dataset, rank, world_size))
        self._timer = StepTimer(
            role=os.environ.get(ENV_ROLE, "worker"),
            rank=rank,
            host=os.environ.get("DTLAUNCH_HOST", socket.gethostname()),
            injections=parse_injections(
                t for t in os.environ.get("DTLAUNCH_INJECT", "").split(";") if t.strip()
            ),
            job_start_wall=env_float(os.environ, "DTLAUNCH_JOB_START", 0.0),
            seed=dataset.seed,
        )
        self._pending_actions: list[AdjustBatchSize | AdjustLR] = []
        self._regroups: list[Regroup] = []  # heard, not yet handed to the elastic group
        self._elastic: ElasticGroup | None = None
        self._lr_factor = 1.0
        self._ps_endpoints: list[str] = []  # the servers of the last ps_placement
        self._data_listeners: list[DataWaitListener] = []
        self._dropped = False  # mark_dropped(): the coming step() releases, not acks
        self._global_batch = dataset.global_batch
        # AntDT-DD (ADJUST_BS from --policy dd): passes per step in force, and the
        # micro-batches of the current step that bsp_batches() has yet to yield.
        self._accumulation = 1
        self._micro_weight = 1.0
        self._micro_left = 0
        self._closed = False
        self._pid = os.getpid()
        atexit.register(self.close)
        global _current
        _current = self

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def restart_count(self) -> int:
        """How many times this rank was restarted before this process (0 at first)."""
        return self._restart_count

    @property
    def dataset(self) -> DatasetSpec:
        return self._dataset

    @property
    def local_batch_size(self) -> int:
        return self._stream.batch_size

    @property
    def step_count(self) -> int:
        """How many times ``step()`` was called."""
        return self._stream.steps

    @property
    def data_ended(self) -> bool:
        """The data set is done: ``batches()`` has ended (nothing more will come)."""
        return self._stream.ended

    def batches(self, *, wait: float | None = None) -> Iterator[list[int]]:
        """Lists of record indices, ``local_batch_size`` long (the last may be shorter).

        Ends when the supervisor has nothing more for this worker and every held
        lease is read. Calling it again continues the same stream.

        With ``wait`` (seconds) a worker that holds no data yields an empty list
        after that long instead of blocking until some comes: a BSP parameter-server
        loop then pushes zero samples and steps, so the others' step is not held up
        by a worker waiting for shards that they hold (at the start and end of the
        data, or after a restart).

        Without ``wait``, the listeners of ``add_data_wait_listener`` (a
        ``dtlaunch.ps.Client`` registers itself) hear when it waits for data and
        when data comes again, so such a loop needs no empty batches.
        """
        if wait is not None and not wait >= 0:
            raise ValueError(f"batches(wait=...) must be 0 or more seconds, got {wait!r}")
        waited = False  # told the listeners this worker waits for data
        while not self._closed:
            if wait is None and self._data_listeners:
                batch = self._stream.next_batch(
                    first_wait=DATA_WAIT_AGAIN_S if waited else DATA_WAIT_FIRST_S
                )
                if batch == []:  # no lease yet (not the end of data)
                    waited = True
                    for listener in list(self._data_listeners):
                        listener.waiting_for_data()
                    continue
                if batch is not None and waited:
                    waited = False
                    for listener in list(self._data_listeners):
                        listener.data_arrived()
            else:
                batch = self._stream.next_batch(first_wait=wait)
            if batch is None:
                return
            if batch:
                self._timer.batch_taken(len(batch))
            yield batch

    def add_data_wait_listener(self, listener: DataWaitListener) -> None:
        """Tell ``listener`` when ``batches()`` (without ``wait``) waits for data."""
        if listener not in self._data_listeners:
            self._data_listeners.append(listener)

    def remove_data_wait_listener(self, listener: DataWaitListener) -> None:
        if listener in self._data_listeners:
            self._data_listeners.remove(listener)

    def step(self) -> None:
        """End of an iteration (gradients applied); never waits on the network.

        Acks the leases whose last record was in a batch returned before this
        call (after ``count_one_batch_per_step``: in the oldest batch not yet
        covered by a step).
        """
        if self._closed:
            raise RuntimeError("Job.step() after Job.close()")
        if self._micro_left:
            raise RuntimeError(
                f"Job.step() with {self._micro_left} micro-batch(es) of this step still to "
                f"come: the plan in force makes {self._accumulation} passes per step "
                "(--policy dd); accumulate the gradients and call allreduce_gradients(), "
                "the optimizer and step() only when job.is_accumulation_boundary is True"
            )
        dropped, self._dropped = self._dropped, False
        step = self._stream.drop_step() if dropped else self._stream.step()
        self._source.report([self._timer.end_step(step, self._stream.batch_size)])
        self._apply_actions(next_step=step + 1)

    def mark_dropped(self) -> None:
        """This step's gradients were left out of the update (BACKUP_WORKERS
        applied the step without this worker): the coming ``step()`` gives the
        shards its batches read back to the DDS, to be read again, instead of
        marking them done. ``dtlaunch.ps.Client.push`` calls it for you."""
        self._dropped = True

    def bsp_batches(self, *, wait: float = 0.05) -> Iterator[list[int]]:
        """Batches for a synchronous (BSP) loop over ``torch.distributed``.

        Every worker closes the same number of steps, so collectives stay paired:
        a worker with no data at the moment yields an empty batch (train nothing,
        still join the allreduce with zero samples and call ``step()``). All stop
        together once the data set is done. With dynamic sharding a plain
        ``batches()`` loop would hang at the end: a worker out of data leaves its
        loop while the others wait for it in a collective. This is also where a
        group re-forms around its survivors when a straggler is replaced (see
        ``dtlaunch.runtime.elastic``; needs ``attach()``).

        Under ``--policy dd`` (AntDT-DD) a step is ``accumulation`` passes: this
        yields up to that many micro-batches per step (fewer when the data runs
        short). Scale each micro-batch's mean loss by ``micro_batch_weight``
        before ``backward()``, and communicate and step only when
        ``is_accumulation_boundary`` is True::

            for batch in job.bsp_batches():
                loss = loss_fn(model(x[batch]), y[batch]) * job.micro_batch_weight
                loss.backward()
                if job.is_accumulation_boundary:
                    job.allreduce_gradients(model)
                    optimizer.step(); optimizer.zero_grad(); job.step()

        With one pass per step (every other policy) the weight is 1 and every
        batch is a boundary, so this loop is also the plain BSP loop.
        """
        if os.environ.get(ENV_RNA) and isinstance(self._source, SupervisorClient):
            yield from self.batches()  # --policy rna: no barrier; its rounds run aside
            return
        import torch.distributed as dist

        from dtlaunch.runtime.collective import agree

        alone = self._world_size == 1 and not dist.is_initialized()  # python script.py
        while not self._closed:
            batch = self._stream.next_batch(first_wait=wait)
            self._take_actions()
            if alone:
                done, gen = batch is None, self._heard_gen()
            else:
                done, gen = agree(self._out_of_data(batch), self._heard_gen())
            while self._elastic is not None and gen > self._elastic.gen:
                self._source.flush_reports()  # a leaving worker's last steps too
                counters = {"step": self.step_count, "global_batch": self._global_batch}
                self._elastic.regroup(gen, counters)
                if self._elastic.world_size != self._world_size:
                    self._resized(self._elastic.world_size)
                done, gen = agree(self._out_of_data(batch), self._heard_gen())
            if done:
                return  # every shard is DONE: everyone stops at this same step
            if self._accumulation > 1 and self._stream.mode == "one_per_step":
                raise RuntimeError(
                    f"the plan in force makes {self._accumulation} passes per step "
                    "(--policy dd), but count_one_batch_per_step() acks one batch per "
                    "step(): use bsp_batches() without it, or another --policy"
                )
            micro = [batch] if batch else []
            while micro and len(micro) < self._accumulation:
                more = self._stream.next_batch(first_wait=wait)
                if not more:  # the data ran out, or no lease at the moment
                    break
                micro.append(more)
            yield from self._micro_batches(micro)

    def _out_of_data(self, batch: list[int] | None) -> bool:
        """The data set is done here. A worker a resize removed that has read its
        last shard is not: it takes empty steps until the group re-forms."""
        return batch is None and not self._stream.leaving

    def _resized(self, world_size: int) -> None:
        """The group re-formed with another number of workers (``dtlaunch scale``):
        the global batch is split again, equally (a policy's plan for the old
        group no longer holds, so one pass per step until it plans again)."""
        logger.info("the group now has %d workers (was %d)", world_size, self._world_size)
        self._world_size = world_size
        self._accumulation = 1
        self._stream.set_batch_size(self._equal_share())

    def _equal_share(self) -> int:
        """This rank's share of the global batch in force (``local_batch_size``)."""
        spec = dataclasses.replace(self._dataset, global_batch=self._global_batch)
        return local_batch_size(spec, self._rank, self._world_size)

    def _micro_batches(self, micro: list[list[int]]) -> Iterator[list[int]]:
        """One step's micro-batches, each with its share of the step's records."""
        records = sum(len(b) for b in micro)
        if not micro:
            self._micro_weight, self._micro_left = 0.0, 0
            yield []
            return
        for i, batch in enumerate(micro):
            self._micro_weight = len(batch) / records
            self._micro_left = len(micro) - 1 - i
            self._timer.batch_taken(len(batch))
            yield batch
        self._micro_left = 0

    @property
    def accumulation(self) -> int:
        """Passes per step in the plan in force (AntDT-DD's ``C_i``; 1 unless ``dd``)."""
        return self._accumulation

    @property
    def micro_batch_weight(self) -> float:
        """The last micro-batch's share of this step's records on this worker:
        scaling each micro-batch's mean loss by it makes the accumulated gradient
        this worker's mean over the step (1.0 with one pass per step; 0.0 for
        the empty batch of a step without data)."""
        return self._micro_weight

    @property
    def is_accumulation_boundary(self) -> bool:
        """The micro-batch ``bsp_batches()`` yielded last is its step's last: time
        to ``allreduce_gradients()``, step the optimizer and call ``step()``."""
        return self._micro_left == 0

    def attach(self, model: Any, optimizer: Any = None) -> None:
        """Register what a worker that replaces another must receive (the model's
        parameters and buffers, the optimizer's state), so a KILL_RESTART can
        re-form the group around the survivors instead of restarting them all.

        Call it once, right after creating the model and optimizer and after
        ``torch.distributed.init_process_group()``, before any other collective.
        In a newcomer it receives that state (and the step count) from a survivor.
        """
        from dtlaunch.runtime.elastic import ENV_JOIN, ElasticGroup, parse_join

        if self._elastic is not None:
            raise RuntimeError("job.attach() was already called")
        if not isinstance(self._source, SupervisorClient):
            return  # standalone: nobody to join, nobody to replace
        group = ElasticGroup(rank=self._rank, world_size=self._world_size, link=self._source)
        group.attach(model, optimizer)
        join = parse_join(os.environ.get(ENV_JOIN))
        if join is not None:
            counters = group.join(join)
            self._stream.continue_at(int(counters["step"]))
            self._global_batch = int(counters["global_batch"])
            # A replacement keeps its predecessor's share of a policy's plan; a
            # worker a resize added gets its equal share of the global batch.
            share = join.batch_size if join.batch_size > 0 else self._equal_share()
            self._stream.set_batch_size(share)
        self._elastic = group
        for msg in self._regroups:
            self._hear_regroup(msg)
        self._regroups = []
        self._source.send(Attached(), repeat_on_rehello=True)

    def _heard_gen(self) -> int:
        """The newest regroup this worker is ready for (the group acts at the first
        step where every worker is). A worker a resize removes is ready once the
        shard it reads is trained and acked, so none of its records is lost or
        read twice."""
        group = self._elastic
        if group is None:
            return 0
        if group.removed and not self._stream.drained:
            return group.gen
        return group.heard_gen

    def _hear_regroup(self, msg: Regroup) -> None:
        assert self._elastic is not None
        self._elastic.hear(msg)
        if self._elastic.removed:
            logger.warning(
                "dtlaunch scale: the group shrinks to %d workers; rank %d leaves after "
                "the shard it reads",
                msg.world_size,
                self._rank,
            )
            self._stream.leave()

    def allreduce_gradients(self, model: Any, samples: int | None = None) -> None:
        """Average ``model``'s gradients over the workers, each weighted by its
        share of this step's samples, so the update is the global-batch mean
        gradient even with unequal batches (AntDT ADJUST_BS). Needs torch and an
        initialised ``torch.distributed`` process group. ``samples`` defaults to
        the records this worker took since its last ``step()``.
        """
        from dtlaunch.runtime.collective import allreduce_gradients  # torch is optional

        taken = self._timer.samples_in_step if samples is None else samples
        comm_s, wait_s = allreduce_gradients(model, taken)
        self.record_comm(comm_s)
        self._timer.record_wait(wait_s)

    @property
    def samples_in_step(self) -> int:
        """Records this worker took since its last ``step()`` (its share of the step)."""
        return self._timer.samples_in_step

    def record_comm(self, seconds: float) -> None:
        """Time this step spent communicating (allreduce, push/pull), for the Monitor."""
        self._timer.record_comm(seconds)

    def record_wait(self, seconds: float) -> None:
        """Time this step waited for the other workers (a BSP barrier): neither
        its compute nor its communication, so the Monitor leaves it out."""
        self._timer.record_wait(seconds)

    def record_server_comm(self, server: int, nbytes: int, seconds: float) -> None:
        """One exchange with parameter server ``server`` (bytes both ways, the
        server's service time: request to answer without the time a pull waited
        there for the other workers' pushes), for the Monitor's per-server view;
        ``dtlaunch.ps.Client`` reports its pulls and pushes."""
        self._timer.record_server(server, nbytes, seconds)

    def ps_placement(self, planned: PsPlacementMap) -> PsPlacementMap:
        """The job's parameter-server placement map, which every worker follows:
        ``planned`` (this worker's plan) is registered with the supervisor, which
        keeps the first worker's map (``dtlaunch.ps.Client`` asks). Standalone:
        ``planned``. Where the map's servers listen is ``ps_endpoints`` then.

        Raises:
            ConfigError: the map differs from the job's (another model), or the
                supervisor did not answer.
        """
        if not isinstance(self._source, SupervisorClient):
            return planned
        timeout = env_float(os.environ, ENV_INIT_TIMEOUT, DEFAULT_INIT_TIMEOUT_S)
        placement, self._ps_endpoints = self._source.negotiate_placement(planned, timeout)
        return placement

    @property
    def ps_endpoints(self) -> list[str]:
        """Where the servers of the map ``ps_placement`` returned last listen, as
        the supervisor said with it (a ``dtlaunch scale --servers`` changes them);
        empty standalone or when it did not know them all."""
        return list(self._ps_endpoints)

    def supervisor_client(self) -> SupervisorClient | None:
        """The supervisor connection (for ``dtlaunch.rna.Trainer``); None standalone."""
        return self._source if isinstance(self._source, SupervisorClient) else None

    @property
    def lr_factor(self) -> float:
        """ADJUST_LR: multiply the learning rate by this (1.0 unless the policy says)."""
        return self._lr_factor

    @property
    def global_batch(self) -> int:
        """The global batch B the local batches add up to (weights for averaging)."""
        return self._global_batch

    def _apply_actions(self, *, next_step: int) -> None:
        """Take actions effective from ``next_step`` (all workers apply them at the
        same step, so the global batch stays whole)."""
        self._take_actions()
        due = [a for a in self._pending_actions if a.apply_at_step <= next_step]
        if not due:
            return
        self._pending_actions = [a for a in self._pending_actions if a.apply_at_step > next_step]
        for action in sorted(due, key=lambda a: a.apply_at_step):
            if 0 < action.apply_at_step < next_step:  # 0: "at once" (a restarted worker)
                logger.warning(
                    "%s for step %d arrived at step %d; applied now",
                    action.TYPE,
                    action.apply_at_step,
                    next_step,
                )
            if isinstance(action, AdjustBatchSize):
                size = action.size_of(self.rank)
                if size is not None:
                    self._stream.set_batch_size(size)
                    self._accumulation = action.accumulation_of(self.rank)
                    self._global_batch = action.global_batch
            else:
                factor = action.factor_of(self.rank)
                if factor is not None:
                    self._lr_factor = factor

    def _take_actions(self) -> None:
        """Move what the supervisor sent into the pending step actions and regroups."""
        for action in self._source.actions():
            if isinstance(action, AdjustBatchSize | AdjustLR):
                self._pending_actions.append(action)
            elif isinstance(action, LeaveJob):  # dtlaunch scale removed this worker
                logger.warning("leaving the job: %s", action.reason)
                self._stream.leave()
            elif isinstance(action, Regroup):
                if self._elastic is not None:
                    self._hear_regroup(action)
                else:
                    self._regroups.append(action)

    def count_one_batch_per_step(self) -> None:
        """Make each ``step()`` cover one batch, for consumers that read ahead.

        A torch ``DataLoader`` with worker processes takes index batches well
        before the model trains them; "returned before step()" would then ack
        records not trained yet. Call ``step()`` once per batch in this mode.
        """
        self._stream.set_mode("one_per_step")

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Send the last acks, wait up to ``timeout`` s for them, close the connection."""
        if self._closed or os.getpid() != self._pid:  # a forked child owns nothing here
            return
        self._closed = True
        atexit.unregister(self.close)
        self._source.flush_reports()
        global _current
        if _current is self:
            _current = None
        self._source.close(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Job(rank={self._rank}, world_size={self._world_size}, "
            f"local_batch_size={self.local_batch_size}, steps={self.step_count}, "
            f"dataset={self._dataset})"
        )
