"""Agent control: the supervisor and the agent of each host.

The agent reads ``AgentBootstrap`` (with the run's CURVE client secret) as one
JSON line on stdin, never in argv. Then, agent -> supervisor:
``AgentHeartbeat`` (with a ``ProcReport`` per process), ``Spawned``,
``SpawnFailed``, ``Output``, ``Exited``, ``Bye``, ``Stacks``; supervisor -> agent:
``Spawn``, ``Kill``, ``Shutdown``, ``DumpStacks``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtlaunch.wire.messages.base import Message, Record

__all__ = [
    "MESSAGES",
    "AgentBootstrap",
    "AgentHeartbeat",
    "Bye",
    "DumpStacks",
    "Exited",
    "Kill",
    "Output",
    "ProcReport",
    "Shutdown",
    "Spawn",
    "SpawnFailed",
    "Spawned",
    "Stacks",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcReport(Record):
    """One process an agent runs, as of the report's time."""

    proc_id: str  # "<role>-<rank>", e.g. "worker-3"
    role: str  # one of PROC_ROLES
    rank: int
    attempt: int  # 0 for the first start, bumped by each restart
    pid: int
    state: str  # one of PROC_STATES; "stopped" = SIGSTOPped / traced
    rss_bytes: int = 0  # whole process tree
    cpu_percent: float = 0.0  # whole process tree
    # Share of its CPU-quota periods since the last report in which the quota
    # stopped it (cgroup cpu.stat; 0 without a cgroup CPU limit). A process
    # whose bursts hit its quota is slowed though its mean use stays below it.
    cpu_throttled: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentBootstrap(Message):
    """What an agent reads as one JSON line on stdin when it starts.

    Carries the CURVE secret, which is why it travels over the SSH channel
    (or a local pipe) and never in argv.
    """

    TYPE: ClassVar[str] = "agent_bootstrap"
    run_id: str
    host: str  # the host's label in the hostfile
    endpoint: str  # supervisor ROUTER, e.g. "tcp://10.0.0.1:45123"
    server_public: str  # Z85 CURVE keys
    client_public: str
    client_secret: str
    state_dir: str  # per-run, per-host folder the agent owns on its host
    heartbeat_interval: float
    dead_after: int  # missed heartbeat intervals before a peer counts as lost
    orphan_timeout: float
    kill_grace: float  # SIGTERM -> SIGKILL delay when stopping a process
    limits_via: str = "auto"  # "auto": cgroups where usable; "rlimit": never cgroups


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentHeartbeat(Message):
    TYPE: ClassVar[str] = "agent_heartbeat"
    seq: int
    procs: list[ProcReport] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Spawned(Message):
    TYPE: ClassVar[str] = "spawned"
    proc_id: str
    attempt: int
    pid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SpawnFailed(Message):
    """The agent could not start a process at all (bad cwd, missing python, ...)."""

    TYPE: ClassVar[str] = "spawn_failed"
    proc_id: str
    attempt: int
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Output(Message):
    """A chunk of a process's output, split on line ends where possible."""

    TYPE: ClassVar[str] = "output"
    proc_id: str
    attempt: int
    stream: str  # one of STREAMS
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Exited(Message):
    """A process ended; sent the moment the agent reaps it."""

    TYPE: ClassVar[str] = "exited"
    proc_id: str
    attempt: int
    pid: int
    exit_code: int | None  # None when killed by a signal
    signal: int | None  # signal number when killed by one
    runtime_s: float
    stderr_tail: list[str] = field(default_factory=list)  # last lines of stderr
    oom_killed: bool = False  # the kernel's OOM killer took it
    requested: bool = False  # it was stopped on the supervisor's command


@dataclass(frozen=True, slots=True, kw_only=True)
class Bye(Message):
    """An agent is exiting (shutdown, orphan timeout)."""

    TYPE: ClassVar[str] = "bye"
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Spawn(Message):
    TYPE: ClassVar[str] = "spawn"
    proc_id: str
    role: str  # one of PROC_ROLES
    rank: int
    attempt: int
    argv: list[str]
    env: dict[str, str]  # complete environment additions; never secrets
    cwd: str
    memory_limit: int = 0  # bytes; 0: none (the agent applies it: cgroup, else rlimit)
    cpu_limit: float = 0.0  # CPUs; 0: none (cgroup quota, else CPU affinity)


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill(Message):
    """Stop one process's whole process group: SIGTERM, SIGKILL after grace."""

    TYPE: ClassVar[str] = "kill"
    proc_id: str
    attempt: int
    grace_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Shutdown(Message):
    """Stop every process of the job on this host, then exit the agent."""

    TYPE: ClassVar[str] = "shutdown"
    grace_s: float
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DumpStacks(Message):
    """Send the Python stacks of these processes (the stall diagnosis)."""

    TYPE: ClassVar[str] = "dump_stacks"
    request_id: int
    proc_ids: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stacks(Message):
    """The answer to ``DumpStacks``: per process, py-spy's dump or why there is none."""

    TYPE: ClassVar[str] = "stacks"
    request_id: int
    stacks: dict[str, str] = field(default_factory=dict)


# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES: tuple[type[Message], ...] = (
    AgentBootstrap,
    AgentHeartbeat,
    Spawned,
    SpawnFailed,
    Output,
    Exited,
    Bye,
    Spawn,
    Kill,
    Shutdown,
    DumpStacks,
    Stacks,
)
