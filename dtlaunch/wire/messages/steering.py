"""Steering the workers: step reports in, straggler actions out (AntDT §V-D, §V-E).

Workers send their recent steps (``StepReports``); the Controller's actions
travel under the name they were decided with (``AdjustBatchSize``,
``AdjustLR``), each carrying the whole plan and the step at which every worker
applies it. In allreduce mode a group re-forms around its survivors with
``Attached``, ``Regroup``, ``RegroupReady`` and ``RegroupGo``
(``dtlaunch.runtime.elastic``). ``LeaveJob`` asks a worker that ``dtlaunch
scale`` removed to end its batches with the shard it is reading.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from dtlaunch.wire.messages.base import Message, Record

__all__ = [
    "MESSAGES",
    "AdjustBatchSize",
    "AdjustLR",
    "Attached",
    "LeaveJob",
    "RankBatch",
    "RankFactor",
    "Regroup",
    "RegroupGo",
    "RegroupReady",
    "ServerComm",
    "StepReport",
    "StepReports",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerComm(Record):
    """A step's exchanges with one parameter server (pull + push; PSLD §4.1)."""

    server: int
    nbytes: int  # tensor bytes moved both ways
    comm_s: float  # request to answer, summed over the step's exchanges


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport(Record):
    """One training step of a worker, for the Monitor (AntDT §II: BPT = T^w + T^m)."""

    step: int
    batch_size: int
    compute_s: float  # time of the step outside communication (incl. injected delay)
    comm_s: float = 0.0  # communication time the script reported (allreduce, push/pull)
    samples: int = 0  # records actually trained (the last batch may be short)
    age_s: float = 0.0  # how long before sending the step ended (reports are batched)
    injected_s: float = 0.0  # straggler delay injected into this step (--inject)
    servers: list[ServerComm] = field(default_factory=list)  # PS mode: per server


# Digits kept of a step's seconds on the wire and in the event log: a microsecond.
# The worker rounds, so that what the Controller decides on is what the log keeps
# and ``replay --policy`` re-decides from.
SECONDS_DIGITS = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReports(Message):
    """A worker's recent steps, sent every report interval (about a second): one
    column per measure of :class:`StepReport`, one entry per step, in step order.

    Columns rather than a record per step: at 1,000 workers of 10 steps/s the
    supervisor decodes 10,000 steps a second, and building and checking a record
    for each was a third of its cost of a report (issue 18). ``servers`` is empty
    unless the job has parameter servers; then it holds each step's exchanges.
    """

    TYPE: ClassVar[str] = "step_reports"
    step: list[int]
    batch_size: list[int]
    compute_s: list[float]
    comm_s: list[float]
    samples: list[int]
    age_s: list[float]
    injected_s: list[float]
    servers: list[list[ServerComm]] = field(default_factory=list)

    def __post_init__(self) -> None:
        steps = len(self.step)
        lengths = (
            len(self.batch_size),
            len(self.compute_s),
            len(self.comm_s),
            len(self.samples),
            len(self.age_s),
            len(self.injected_s),
        )
        if any(n != steps for n in lengths) or (self.servers and len(self.servers) != steps):
            raise ValueError(
                f"columns of unequal length: {steps} steps, {lengths} measures, "
                f"{len(self.servers)} server lists (expected {steps} or 0)"
            )

    def __len__(self) -> int:
        return len(self.step)

    @classmethod
    def of(cls, reports: Sequence[StepReport]) -> StepReports:
        """The columns of ``reports`` (ordered by step), seconds rounded to a microsecond."""
        ordered = sorted(reports, key=lambda r: r.step)
        digits = SECONDS_DIGITS
        return cls(
            step=[r.step for r in ordered],
            batch_size=[r.batch_size for r in ordered],
            compute_s=[round(r.compute_s, digits) for r in ordered],
            comm_s=[round(r.comm_s, digits) for r in ordered],
            samples=[r.samples for r in ordered],
            age_s=[round(r.age_s, digits) for r in ordered],
            injected_s=[round(r.injected_s, digits) for r in ordered],
            servers=(
                [[replace(c, comm_s=round(c.comm_s, digits)) for c in r.servers] for r in ordered]
                if any(r.servers for r in ordered)
                else []
            ),
        )

    def in_step_order(self) -> StepReports:
        """These columns, ordered by step (itself when they are, as the SDK sends them)."""
        steps = self.step
        if all(map(operator.le, steps, steps[1:])):
            return self
        return StepReports.of(self.rows())

    def rows(self) -> list[StepReport]:
        """One :class:`StepReport` per step (for readers that want records)."""
        servers = self.servers or [[] for _ in self.step]
        return [
            StepReport(
                step=step,
                batch_size=batch_size,
                compute_s=compute_s,
                comm_s=comm_s,
                samples=samples,
                age_s=age_s,
                injected_s=injected_s,
                servers=list(comms),
            )
            for step, batch_size, compute_s, comm_s, samples, age_s, injected_s, comms in zip(
                self.step,
                self.batch_size,
                self.compute_s,
                self.comm_s,
                self.samples,
                self.age_s,
                self.injected_s,
                servers,
                strict=True,
            )
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankBatch(Record):
    """One worker's share of an ``AdjustBatchSize`` plan: ``accumulation`` passes
    of ``batch_size`` records per step (AntDT-DD's ``C_i`` and ``B_i``; 1 pass
    for every policy but ``dd``)."""

    rank: int
    batch_size: int
    accumulation: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class AdjustBatchSize(Message):
    """ADJUST_BS as the policy decided it: every worker's local batch size from
    ``apply_at_step`` on. Each worker named gets the whole plan and takes its own
    rank's size; the global batch is the plan's sum. All workers change in the
    same iteration (``apply_at_step``; 0: "from your next step", for a restarted
    worker joining a plan in force), so the global batch stays whole.
    """

    TYPE: ClassVar[str] = "adjust_batch_size"
    sizes: list[RankBatch]
    apply_at_step: int

    def size_of(self, rank: int) -> int | None:
        """``rank``'s local (micro-)batch size in this plan; None when it is not in it."""
        return next((s.batch_size for s in self.sizes if s.rank == rank), None)

    def accumulation_of(self, rank: int) -> int:
        """``rank``'s passes per step in this plan (1 when it is not in it)."""
        return next((s.accumulation for s in self.sizes if s.rank == rank), 1)

    @property
    def global_batch(self) -> int:
        """The records of one step over all workers: each local batch times its passes."""
        return sum(s.batch_size * s.accumulation for s in self.sizes)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankFactor(Record):
    """One worker's learning-rate factor in an ``AdjustLR``."""

    rank: int
    factor: float


@dataclass(frozen=True, slots=True, kw_only=True)
class AdjustLR(Message):
    """ADJUST_LR as the policy decided it: each named worker's learning-rate
    factor from ``apply_at_step`` on."""

    TYPE: ClassVar[str] = "adjust_lr"
    factors: list[RankFactor]
    apply_at_step: int

    def factor_of(self, rank: int) -> float | None:
        """``rank``'s factor; None when it is not in it."""
        return next((f.factor for f in self.factors if f.rank == rank), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attached(Message):
    """A worker called ``job.attach(model, optimizer)``: a newcomer can get its
    state from a survivor, so KILL_RESTART may re-form the allreduce group
    around the survivors instead of restarting them."""

    TYPE: ClassVar[str] = "attached"


@dataclass(frozen=True, slots=True, kw_only=True)
class Regroup(Message):
    """To every worker: at the next step all of them agree on, ``leaving_rank``
    leaves, the others take down their process group, and ``store_rank`` hosts
    the store of generation ``gen`` and answers ``RegroupReady``.

    A resize (``dtlaunch scale``) has ``world_size`` > 0 and ``leaving_rank`` -1:
    the group re-forms with ``world_size`` workers; ranks from ``world_size`` up
    leave once the shard they read is trained, and new ranks join (prewarmed).

    Several ranks replaced at once (a slow host's workers, moved together) are
    ``replaced``, ``leaving_rank`` the first of them: they all leave, and their
    newcomers join the survivors in the one re-formed group."""

    TYPE: ClassVar[str] = "regroup"
    gen: int
    leaving_rank: int
    store_rank: int
    world_size: int = 0  # 0: the size stays (a KILL_RESTART replaces leaving_rank)
    replaced: list[int] = field(default_factory=list)  # [] : leaving_rank alone

    def leaves(self, rank: int) -> bool:
        """Whether ``rank`` leaves the group at this regroup."""
        if rank == self.leaving_rank or rank in self.replaced:
            return True
        return self.world_size > 0 and rank >= self.world_size


@dataclass(frozen=True, slots=True, kw_only=True)
class RegroupReady(Message):
    """From the store host: generation ``gen``'s store listens on ``store_port``;
    the group re-forms at step ``step``."""

    TYPE: ClassVar[str] = "regroup_ready"
    gen: int
    step: int
    store_port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RegroupGo(Message):
    """To the survivors, and to the waiting replacement: join generation ``gen``
    at ``master_addr:master_port``; the replacement also learns who sends it the
    state (``source_rank``) and its local batch size (0: the default)."""

    TYPE: ClassVar[str] = "regroup_go"
    gen: int
    master_addr: str
    master_port: int
    source_rank: int = 0
    batch_size: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveJob(Message):
    """To a worker a scale-down removed: read no further shard, give back the
    ones fetched ahead, and end ``batches()`` once the shard being read is
    trained and acked; the process then ends as at the end of the data. A worker
    that has not exited after a grace period is stopped."""

    TYPE: ClassVar[str] = "leave_job"
    reason: str


# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES: tuple[type[Message], ...] = (
    StepReports,
    AdjustBatchSize,
    AdjustLR,
    Attached,
    Regroup,
    RegroupReady,
    RegroupGo,
    LeaveJob,
)
