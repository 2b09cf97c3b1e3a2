"""The read-only status protocol of ``dtlaunch status``.

A ``status:<pid>`` peer may send only ``StatusRequest``; the supervisor answers
``StatusReply`` with a ``StatusSnapshot`` and ignores anything else from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtlaunch.wire.messages.base import Message, Record

__all__ = [
    "MESSAGES",
    "STATUS_PHASES",
    "STATUS_SOURCES",
    "ActionStatus",
    "NodeStatus",
    "StatusReply",
    "StatusRequest",
    "StatusSnapshot",
]


STATUS_PHASES = ("starting", "running", "stopping", "done")


STATUS_SOURCES = ("live", "events")  # the supervisor's state, or events.jsonl of an ended job


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus(Record):
    """One worker or server as ``dtlaunch status`` shows it."""

    role: str  # one of PROC_ROLES
    rank: int
    host: str
    proc_state: str  # the node table's state: pending, running, failed, ... or unresponsive
    restarts: int = 0
    batch_size: int = 0  # latest reported local batch (0: no report yet)
    bpt_s: float = 0.0  # recent mean batch processing time (0: no report yet)
    recent_bpt_s: list[float] = field(default_factory=list)  # oldest first, for a sparkline
    throughput: float = 0.0  # samples/s, recent
    shards_done: int = 0
    straggler: str = ""  # why it counts as a straggler; empty when it does not
    # Its process tree at the last heartbeat, and its limits (0: none).
    memory_bytes: int = 0
    memory_limit: int = 0
    cpu_percent: float = 0.0  # 100 = one CPU
    cpu_limit: float = 0.0  # CPUs
    # A built-in parameter server: the bytes of the blocks it holds in the map in
    # force, and its speed in bytes/s fitted from the workers' exchanges with it
    # (PSLD's Pred(s) at its load; 0: not known yet)
    ps_bytes: int = 0
    ps_speed: float = 0.0
    rna_share: float = 0.0  # --policy rna: share of recent rounds it contributed to


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionStatus(Record):
    """One decision of the policy (or of the job), with why."""

    at_s: float  # seconds since the job started
    action: str  # ADJUST_BS, KILL_RESTART, ... or END for the job's own end
    target: str  # whom it touches, e.g. "worker 2" or "w0=14 w1=14 w2=2"
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusSnapshot(Record):
    """A job at one instant, as ``dtlaunch status`` shows it."""

    run_id: str
    policy: str
    mode: str
    phase: str  # one of STATUS_PHASES
    source: str  # one of STATUS_SOURCES
    status: str = ""  # once ended: succeeded | failed | stopped
    elapsed_s: float = 0.0
    shards_done: int = 0
    shards_total: int = 0  # 0: the job uses no data sharding
    throughput: float = 0.0  # samples/s of all workers, recent
    eta_s: float | None = None  # None: unknown
    nodes: list[NodeStatus] = field(default_factory=list)
    actions: list[ActionStatus] = field(default_factory=list)  # oldest first
    ps_map_version: int = 0  # the parameter servers' placement map in force (0: none)
    rna_rounds_per_s: float = 0.0  # --policy rna: recent rounds per second (0: none)
    rna_groups: list[list[int]] = field(default_factory=list)  # hierarchical rna ([]: one)
    # Live only: the policy's latest reading of the job, what it did or why it
    # holds (e.g. auto's phase, its plan, and the throughput it predicts).
    plan: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusRequest(Message):
    TYPE: ClassVar[str] = "status_request"
    request_id: int
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReply(Message):
    TYPE: ClassVar[str] = "status_reply"
    request_id: int
    snapshot: StatusSnapshot


# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES: tuple[type[Message], ...] = (
    StatusRequest,
    StatusReply,
)
