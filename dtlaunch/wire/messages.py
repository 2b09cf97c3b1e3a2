"""Every message on the control wire, as frozen dataclasses.

A message is encoded (see ``codec``) as a msgpack map holding its fields plus
``"t"`` (the class's ``TYPE`` tag) and ``"v"`` (``PROTOCOL_VERSION``). Field types
are restricted to what the codec validates: ``bool``, ``int``, ``float``, ``str``,
``bytes``, ``None`` unions, ``list[X]``, ``dict[str, X]`` and nested ``Record``
dataclasses. Adding a field with a default is backwards compatible within a
protocol version; anything else bumps ``PROTOCOL_VERSION``.

Who sends what:

* peer (agent, worker, server, control) -> supervisor: ``Hello`` first, then
  ``AgentHeartbeat``/``Ping``; agents also ``Spawned``, ``SpawnFailed``,
  ``Output``, ``Exited``, ``Bye``; control clients ``StopJob``.
* supervisor -> peer: ``Welcome`` (answer to Hello), ``Rehello`` (a supervisor that
  does not know you, e.g. after ``--resume``), ``Ping``; to agents ``Spawn``,
  ``Kill``, ``Shutdown``; to control clients ``Ack``.

Any message counts as liveness of its sender.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

PROTOCOL_VERSION = 1

ROLES = ("agent", "worker", "server", "control", "status")
PROC_ROLES = ("worker", "server")
STREAMS = ("stdout", "stderr")
PROC_STATES = ("running", "stopped", "zombie")


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """A plain nested value inside a message (no type tag of its own)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """Base of every top-level message; subclasses set a unique ``TYPE``."""

    TYPE: ClassVar[str] = ""


# --------------------------------------------------------------------- records


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


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetInfo(Record):
    """A job's data set, as in ``dtlaunch.sharding.DatasetSpec``."""

    dataset_size: int
    shard_size: int
    epochs: int
    global_batch: int
    seed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease(Record):
    """A shard (or the remainder of one) handed to one worker.

    ``start``/``end`` index the shard's records in reading order
    (``sharding.shard_records``); a whole shard is ``0..len``.
    """

    lease_id: int
    epoch: int
    shard: int
    start: int
    end: int


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


# ---------------------------------------------------------------- bootstrap


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


# -------------------------------------------------------- peer -> supervisor


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Message):
    TYPE: ClassVar[str] = "hello"
    role: str  # one of ROLES
    run_id: str
    host: str
    pid: int
    version: str  # dtlaunch.__version__ of the sender
    rank: int = -1  # workers/servers: their rank
    procs: list[ProcReport] = field(default_factory=list)  # agents: what they run now
    free_ports: list[int] = field(default_factory=list)  # agents: ports free on their host
    host_addr: str = ""  # agents: an address of their host others can reach
    attempt: int = 0  # workers/servers: TORCHELASTIC_RESTART_COUNT of the sender
    leases: list[int] = field(default_factory=list)  # workers: DDS leases held (on reconnect)


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
class StopJob(Message):
    """From ``dtlaunch stop``: stop the whole job gracefully."""

    TYPE: ClassVar[str] = "stop_job"
    reason: str = "dtlaunch stop"


# -------------------------------------------------------- either direction


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    TYPE: ClassVar[str] = "ping"
    seq: int


# -------------------------------------------------------- supervisor -> peer


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    run_id: str
    heartbeat_interval: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Rehello(Message):
    """The supervisor does not know this peer (it restarted): send Hello again."""

    TYPE: ClassVar[str] = "rehello"


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
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    ok: bool
    detail: str = ""


# ------------------------------------------------------ worker <-> supervisor (DDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterDataset(Message):
    """A worker's ``dtlaunch.init(dataset_size=...)``; answered by DatasetReady."""

    TYPE: ClassVar[str] = "register_dataset"
    dataset: DatasetInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetReady(Message):
    """The job's data set (``dataset`` None: none registered yet), or why not."""

    TYPE: ClassVar[str] = "dataset_ready"
    dataset: DatasetInfo | None
    error: str = ""  # non-empty: the registration was refused (mismatch, bad values)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchShards(Message):
    TYPE: ClassVar[str] = "fetch_shards"
    request_id: int
    count: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardGrant(Message):
    """Answer to FetchShards, sent once the grant is durable in the WAL.

    No leases and ``finished`` False: nothing to hand out now (others hold the
    rest); ask again after ``retry_after`` seconds.
    """

    TYPE: ClassVar[str] = "shard_grant"
    request_id: int
    leases: list[Lease] = field(default_factory=list)
    finished: bool = False  # every shard of every epoch is DONE or held by others for good
    retry_after: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AckShards(Message):
    """These leases' records are all applied (their last step's gradients are in)."""

    TYPE: ClassVar[str] = "ack_shards"
    lease_ids: list[int]
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AckDone(Message):
    """The DONE records of these leases are durable."""

    TYPE: ClassVar[str] = "ack_done"
    lease_ids: list[int]


# ------------------------------------------------- monitor and actions (workers)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReports(Message):
    """A worker's recent steps, sent every few steps."""

    TYPE: ClassVar[str] = "step_reports"
    reports: list[StepReport]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdjustBatch(Message):
    """ADJUST_BS for one worker: its local batch size from ``apply_at_step`` on.

    Every worker gets the same ``apply_at_step``, so all change in the same
    iteration and the global batch stays the same.
    """

    TYPE: ClassVar[str] = "adjust_batch"
    batch_size: int
    apply_at_step: int
    global_batch: int  # sum of the new local sizes, for the weighted gradient average


@dataclass(frozen=True, slots=True, kw_only=True)
class AdjustLR(Message):
    """ADJUST_LR for one worker: a learning-rate factor from ``apply_at_step`` on."""

    TYPE: ClassVar[str] = "adjust_lr"
    factor: float
    apply_at_step: int


MESSAGE_TYPES: tuple[type[Message], ...] = (
    AgentBootstrap,
    Hello,
    AgentHeartbeat,
    Spawned,
    SpawnFailed,
    Output,
    Exited,
    Bye,
    StopJob,
    Ping,
    Welcome,
    Rehello,
    Spawn,
    Kill,
    Shutdown,
    Ack,
    RegisterDataset,
    DatasetReady,
    FetchShards,
    ShardGrant,
    AckShards,
    AckDone,
    StepReports,
    AdjustBatch,
    AdjustLR,
)
