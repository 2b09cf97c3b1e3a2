"""What a policy may look at: the Monitor's frozen view of the job at one instant
(``MonitorSnapshot``) and the records it is made of. Plain values, no behaviour
beyond small derived readings: the Monitor (``monitor.py``) builds them, the
policies and the status read them, ``replay`` rebuilds them from the event log.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtlaunch.supervisor.control.resources import JobResources
from dtlaunch.supervisor.control.windows import WindowStats

__all__ = [
    "MeasuredSlope",
    "MonitorSnapshot",
    "NodeInfo",
    "PsLayout",
    "ServerProfile",
    "WorkerDevice",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """What is known about a node regardless of windows."""

    rank: int
    batch_size: int  # latest reported batch size (0 for servers)
    samples_total: int  # samples reported since it (re)joined
    last_step: int
    last_report_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerProfile:
    """One server's recent exchanges (PSLD §4.1): ``bytes[i]`` moved in
    ``seconds[i]``, one pair per worker step, oldest first."""

    nbytes: tuple[int, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PsLayout:
    """The job's parameter-server placement map in force: block ``i`` has
    ``block_bytes[i]`` bytes and lives on server ``owner[i]``."""

    version: int
    servers: int
    block_bytes: tuple[int, ...]
    owner: tuple[int, ...]

    def bytes_per_server(self) -> list[int]:
        loads = [0] * self.servers
        for size, server in zip(self.block_bytes, self.owner, strict=True):
            loads[server] += size
        return loads


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerDevice:
    """The device a worker runs on, as its host's hostfile line declares it."""

    host: str
    device_class: str | None = None  # class=NAME (None: not declared; dd infers it)
    min_batch: int | None = None  # bmin=: the saturation batch
    max_batch: int | None = None  # bmax=: the largest batch the device's memory holds


@dataclass(frozen=True, slots=True, kw_only=True)
class DataEnd:
    """The end of the data: every shard is handed out, none is left to lease."""

    global_batch: int  # the records of a step the data set was cut for
    # rank -> (the records of the leases the worker holds, those of its oldest
    # lease, which it may have read in part or whole: a lease is acked by the
    # step after its last record)
    held: dict[int, tuple[int, int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredSlope:
    """How much a step's time grows per record, as the job's changes of batch
    size measured it (``Monitor.size_change_slope``): ``seconds_per_record``,
    and ``weight``, the measurements' precision in units of the step-time
    noise (its standard error is the noise's standard deviation over
    ``sqrt(weight)``)."""

    seconds_per_record: float
    weight: float


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorSnapshot:
    """Everything a policy may look at, frozen at ``now``.

    ``remaining_steps`` (None: unknown), ``data_end`` (the data's end),
    ``restart_cost_s`` (None: not measured yet) and ``restart_pending`` (a
    KILL_RESTART is still settling) come from the caller, which knows the data
    set and measures restarts.
    """

    now: float
    l_trans: float
    l_per: float
    workers: dict[int, NodeInfo]
    servers: dict[int, NodeInfo]
    worker_short: dict[int, WindowStats]
    worker_long: dict[int, WindowStats]
    server_long: dict[int, WindowStats]
    mean_bpt_short: float | None  # over workers in the short window
    mean_bpt_long: float | None
    mean_bpt_eq_short: float | None
    mean_bpt_eq_long: float | None
    # fast_reference() of the equal-share BPTs: a straggler's yardstick that the
    # stragglers themselves do not inflate
    ref_bpt_eq_short: float | None
    ref_bpt_eq_long: float | None
    mean_update_long: float | None  # over servers in the long window
    server_comm_long: dict[int, float]  # server -> workers' mean comm s per step with it
    spare_capacity: int
    spare_hosts: tuple[str, ...]
    latest_step: int  # newest step any worker reported (-1: none yet)
    remaining_steps: int | None = None
    # Once no shard is left to hand out (None before that): what the job's last
    # steps run on
    data_end: DataEnd | None = None
    # The slope of the workers' peers' lines (``line == "peers"``) once measured
    measured_slope: MeasuredSlope | None = None
    restart_cost_s: float | None = None  # a worker's KILL_RESTART, as measured
    server_restart_cost_s: float | None = None  # a server's (a live move), as measured
    restart_pending: bool = False
    # The batch plan in force (rank -> local batch size of the last ADJUST_BS), kept
    # by the Controller: workers that do not step together report old and new sizes
    # at the same moment, so the plan, not the reports, says what the split is.
    batch_plan: dict[int, int] = dataclasses.field(default_factory=dict)
    # rank -> passes per step (AntDT-DD's C_i) in the plan in force; absent: 1
    accumulation_plan: dict[int, int] = dataclasses.field(default_factory=dict)
    # rank -> the device the worker runs on now (empty when the caller knows no hosts)
    devices: dict[int, WorkerDevice] = dataclasses.field(default_factory=dict)
    # Workers placed (in ``devices``) that have not sent one step report yet: a
    # plan made before they do would split the global batch among the others only.
    awaiting_first_report: tuple[int, ...] = ()
    # PS mode: each server's recent (bytes, seconds) exchanges, the block layout in
    # force (None: no map yet), and whether a reassignment is still being carried out
    server_profile: dict[int, ServerProfile] = dataclasses.field(default_factory=dict)
    ps_layout: PsLayout | None = None
    reassign_pending: bool = False
    reassign_cost_s: float | None = None  # the last REASSIGN_BLOCKS's pause, as measured
    # The processes' CPU and memory and the declared capacity (None: not known,
    # e.g. a replay of a run without the agents' measurements)
    resources: JobResources | None = None
