"""The node table's vocabulary: states, the commands JobState emits, and its records.

Plain data only; the transitions live in ``jobstate``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dtlaunch.supervisor.placement import Assignment
from dtlaunch.wire.messages import Exited, Message


class ProcState(StrEnum):
    PENDING = "pending"  # waiting to be spawned (first start or restart)
    STARTING = "starting"  # Spawn sent, no answer yet
    RUNNING = "running"
    STOPPING = "stopping"  # Kill sent; restarts when it is gone if restart_after_stop
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # ended because the job is stopping


class AgentState(StrEnum):
    LAUNCHING = "launching"
    UP = "up"
    UNRESPONSIVE = "unresponsive"
    LOST = "lost"
    GONE = "gone"  # exited on purpose


class Phase(StrEnum):
    STARTING = "starting"  # agents coming up
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"


LIVE_PROC_STATES = (ProcState.STARTING, ProcState.RUNNING, ProcState.STOPPING)


# ------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchAgent:
    host: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SendToAgent:
    host: str
    message: Message


@dataclass(frozen=True, slots=True, kw_only=True)
class EmitEvent:
    kind: str
    host: str = ""
    role: str = ""
    rank: int = -1
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish:
    status: str  # succeeded | failed | stopped


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerGone:
    """A worker process ended or was lost: its data shards go back to the queue."""

    rank: int
    succeeded: bool = False  # it ended with its work done: it is not restarted


@dataclass(frozen=True, slots=True, kw_only=True)
class AskToLeave:
    """A running worker a scale-down removed: ask it (``LeaveJob``) to end its
    batches with the shard it reads; ``JobState.leave_unheard`` when it cannot be
    asked (its SDK never said hello), which stops it at once."""

    rank: int
    attempt: int
    reason: str


Command = LaunchAgent | SendToAgent | EmitEvent | Finish | WorkerGone | AskToLeave


# ---------------------------------------------------------------- bookkeeping


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinSpec:
    """How a newcomer joins a running allreduce group (elastic KILL_RESTART):
    the survivors' store, plus variables that tell its SDK what to receive."""

    master_addr: str
    master_port: int
    env: dict[str, str]


@dataclass(slots=True, kw_only=True)
class ProcSlot:
    assignment: Assignment
    host: str
    attempt: int = 0
    state: ProcState = ProcState.PENDING
    pid: int = 0
    started_at: float = 0.0
    unresponsive: bool = False
    restart_after_stop: bool = False
    restart_reason: str = ""
    # Resumed supervisor: this attempt ran before; the next spawn is a restart.
    bump_before_spawn: bool = False
    # Resumed after a WAL repair: a running process is restarted, not adopted.
    restart_if_found: str = ""
    # KILL_RESTART: the host the next attempt runs on ("" = the same host) and,
    # in an elastic allreduce group, how that attempt joins the survivors.
    next_host: str = ""
    join: JoinSpec | None = None
    prewarm: bool = False  # the next spawn waits, warm, to join the survivors
    # The port the process binds, set before each spawn (a built-in PS server, a
    # TF task); a built-in PS worker's server endpoints in rank order; a TF
    # task's cluster: (task type, its tasks' host:port in index order) per type.
    listen_port: int = 0
    ps_servers: tuple[str, ...] = ()
    tf_cluster: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # A server's attempt that starts empty (a migration's target): no snapshot restore.
    ps_fresh_attempt: int = -1
    spent_attempts: int = 0  # the highest attempt number ever given to this slot
    # The stall watchdog stopped this attempt: its exit is a retryable failure.
    stalled: str = ""
    # Crash-loop detection: the last attempt's failure signature, and whether
    # the running attempt has made progress (reported a step) since it started.
    failure_signature: str = ""
    progressed: bool = False
    # A prewarmed replacement whose predecessor finished the data on its own: it
    # is stopped, and its stop is the rank's success (nothing was left to train).
    finished_by_predecessor: bool = False
    # The GPU (index into its host's gpus=) the current attempt runs on; -1: none.
    gpu: int = -1
    # Limits of the next attempt (0: none); an OOM relaunch doubles the memory.
    memory_limit: int = 0
    cpu_limit: float = 0.0
    oom_relaunches: int = 0
    oom_added_servers: bool = False  # a server whose OOM gave the job more servers once
    # What its process tree used at the last heartbeat (for status).
    rss_bytes: int = 0
    cpu_percent: float = 0.0
    cpu_throttled: float = 0.0  # share of its CPU periods its quota stopped it in

    @property
    def proc_id(self) -> str:
        return f"{self.assignment.role}-{self.assignment.rank}"

    @property
    def role(self) -> str:
        return self.assignment.role

    @property
    def rank(self) -> int:
        return self.assignment.rank


@dataclass(slots=True, kw_only=True)
class AgentSlot:
    host: str
    state: AgentState = AgentState.LAUNCHING
    launched_at: float = 0.0
    last_seen: float = 0.0
    free_ports: list[int] = field(default_factory=list)
    host_addr: str = ""
    memory_bytes: int = 0  # the host's memory as its agent measured it
    channel_closed: bool = False
    launches: int = 0
    adopting: bool = False  # resumed supervisor: waiting for a running agent to reconnect
    # Its launch waits for one of the --ssh-concurrency turns: not timed out yet.
    queued: bool = False
    # It said hello once, so the host and its setup work: a later launch that
    # fails means the host is unreachable for now, which is retried, not fatal.
    was_up: bool = False
    # Declared lost at (0.0 while reachable): its pending workers may move to a
    # free spare host, and a pending process that cannot move waits for it at
    # most the orphan timeout.
    lost_at: float = 0.0
    relaunch_at: float = 0.0  # lost and its relaunch failed: when to try again
    relaunch_failures: int = 0
    # How often it was lost, and until when it takes no moved process (a spare
    # target, a KILL_RESTART's): a flapping host must not draw the job's work.
    losses: int = 0
    cooldown_until: float = 0.0
    # proc id -> attempt it ran here when it was lost: stale once restarted, and
    # fenced when the host is heard again (see JobState._fence_stale).
    stale_attempts: dict[str, int] = field(default_factory=dict)
    # Exited messages it sent before its Hello (queued while it could not reach
    # us), for that Hello: how processes that no longer run ended. Bounded.
    exits_before_hello: deque[Exited] = field(default_factory=lambda: deque(maxlen=1024))
    pid: int = 0  # of the agent that said hello last


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRecord:
    role: str
    rank: int
    host: str
    exit_code: int | None
    signal: int | None
    error: str
    reason: str
    retryable: bool
    at_s: float
    attempt: int
    traceback: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartRecord:
    role: str
    rank: int
    host: str
    reason: str
    at_s: float
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    heartbeat_interval: float
    dead_after: int
    orphan_timeout: float
    kill_grace: float
    agent_timeout: float
