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
  ``Output``, ``Exited``, ``Bye``; control clients ``StopJob``; status clients
  ``StatusRequest`` (only that: they are read-only).
* supervisor -> peer: ``Welcome`` (answer to Hello), ``Rehello`` (a supervisor that
  does not know you, e.g. after ``--resume``), ``Ping``; to agents ``Spawn``,
  ``Kill``, ``Shutdown``; to control clients ``Ack``; to status clients ``StatusReply``.

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
class PsPlacedBlock(Record):
    """One parameter block and the server that holds it (``dtlaunch.ps.blocks``)."""

    param: int  # index into the model's parameter list
    name: str
    row_start: int
    row_end: int
    shape: list[int]
    dtype: str
    nbytes: int
    server: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PsPlacementMap(Record):
    """The job's block placement on its parameter servers, under a version counter."""

    version: int
    servers: int
    blocks: list[PsPlacedBlock]


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterPlacement(Message):
    """A PS worker's block placement, planned from its model; answered by
    PlacementReady with the job's map (the first registration makes it)."""

    TYPE: ClassVar[str] = "register_placement"
    placement: PsPlacementMap


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementReady(Message):
    """The job's placement map, which every worker follows, or why not."""

    TYPE: ClassVar[str] = "placement_ready"
    placement: PsPlacementMap | None
    error: str = ""  # non-empty: the registration was refused (another model)


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
class ReleaseShards(Message):
    """Give these leases back: the step that read them was dropped (BACKUP_WORKERS
    left its gradient out), so their records go back to the DDS to be read again."""

    TYPE: ClassVar[str] = "release_shards"
    lease_ids: list[int]
    step: int
    reason: str = ""


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
    the store of generation ``gen`` and answers ``RegroupReady``."""

    TYPE: ClassVar[str] = "regroup"
    gen: int
    leaving_rank: int
    store_rank: int


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


# ------------------------------------------- status (read-only, dtlaunch status)
#
# A ``status:<pid>`` peer may send only ``StatusRequest``; the supervisor answers
# ``StatusReply`` and ignores anything else from it.

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


# ------------------------------------------- parameter server (dtlaunch.ps)
#
# Worker/control <-> server, on the server's own CURVE ROUTER. A message is the
# first frame; tensor payloads follow it as raw frames (never msgpack), one per
# block in the order of the message's ``blocks`` list (for exports: the block's
# parameter, then its state tensors in ``tensors`` order). Every request carries a
# ``request_id`` echoed by its answer; a refused request is answered by
# ``PsReply(ok=False, detail=why)``.

PS_MODES = ("bsp", "asp")
PS_OPTIMIZERS = ("sgd", "adagrad", "adam")


@dataclass(frozen=True, slots=True, kw_only=True)
class PsBlockSpec(Record):
    """One block's tensor: its frame holds ``prod(shape)`` items of ``dtype``."""

    block_id: int
    shape: list[int]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"


@dataclass(frozen=True, slots=True, kw_only=True)
class PsOptimizer(Record):
    """``dtlaunch.ps.optim.OptimizerConfig`` on the wire."""

    name: str  # one of PS_OPTIMIZERS
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = -1.0  # < 0: the optimizer's default
    weight_decay: float = 0.0
    lr_decay: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsBlockState(Record):
    """A migrating block: frames are its parameter, then ``tensors`` in order."""

    block: PsBlockSpec
    step: int  # the optimizer's step count for this block
    tensors: list[str] = field(default_factory=list)  # optimizer state tensor names


@dataclass(frozen=True, slots=True, kw_only=True)
class PsUpdate(Record):
    """One applied update of a server (AntDT §II: T_s), for the Monitor."""

    version: int  # the server's version after this update
    step: int  # the step (version) the gradients were computed against
    update_s: float  # aggregation + optimizer time
    samples: int  # records behind the applied gradients
    applied: list[int]  # workers whose gradients are in it
    dropped: list[int] = field(default_factory=list)  # BACKUP: late workers left out
    injected_s: float = 0.0  # straggler delay injected into this update (--inject)
    ended_s: float = 0.0  # the server's monotonic clock when it was done (see PsStats.now_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class PsInit(Message):
    """Seed a server: the worker's blocks for it; frames only when ``with_data``."""

    TYPE: ClassVar[str] = "ps_init"
    request_id: int
    worker: int
    optimizer: PsOptimizer
    blocks: list[PsBlockSpec]
    with_data: bool = False
    version: int = 0  # the version of the offered copy (a worker's last pull; resync)


@dataclass(frozen=True, slots=True, kw_only=True)
class PsInitReply(Message):
    TYPE: ClassVar[str] = "ps_init_reply"
    request_id: int
    seeded: bool  # the server holds parameters for these blocks
    version: int
    incarnation: int = 0  # the server process's random id: a new one means it restarted
    recovered_at: int = 0  # the version of the copy this process started from (resync)


@dataclass(frozen=True, slots=True, kw_only=True)
class PsPull(Message):
    """Ask for ``blocks`` once the server's version is at least ``min_version``.

    ``settled``: also wait until no open step holds records (a worker that
    left after the data set ended asks for the model with every record in).
    """

    TYPE: ClassVar[str] = "ps_pull"
    request_id: int
    min_version: int
    blocks: list[int]
    incarnation: int = 0  # the server incarnation the client knows (0: none yet)
    worker: int = 0  # who asks
    settled: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PsParams(Message):
    """Answer to PsPull; one frame per block follows."""

    TYPE: ClassVar[str] = "ps_params"
    request_id: int
    version: int
    blocks: list[int]
    incarnation: int = 0
    # How long the pull waited here for its version (the other workers' pushes,
    # the update): barrier time, not this worker's communication.
    waited_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsPush(Message):
    """Gradients (mean over the worker's ``samples``) computed at version ``step``."""

    TYPE: ClassVar[str] = "ps_push"
    request_id: int
    worker: int
    step: int
    samples: int
    blocks: list[int]
    incarnation: int = 0  # the server incarnation the client knows (0: none yet)


@dataclass(frozen=True, slots=True, kw_only=True)
class PsPushAck(Message):
    """``accepted`` False: the step was already applied without it (BACKUP, stale)."""

    TYPE: ClassVar[str] = "ps_push_ack"
    request_id: int
    step: int
    accepted: bool
    version: int
    incarnation: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsMembership(Message):
    """The workers a BSP step waits for, and BACKUP_WORKERS' ``backup`` (b)."""

    TYPE: ClassVar[str] = "ps_membership"
    request_id: int
    workers: list[int]
    backup: int = 0
    backup_only: bool = False  # change b alone; the workers stay as they are


@dataclass(frozen=True, slots=True, kw_only=True)
class PsLeave(Message):
    """A worker is leaving (its Client closed): steps stop waiting for it."""

    TYPE: ClassVar[str] = "ps_leave"
    request_id: int
    worker: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PsSnapshotNow(Message):
    TYPE: ClassVar[str] = "ps_snapshot_now"
    request_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PsExport(Message):
    """Send ``blocks`` with their optimizer state once the version is ``at_version``."""

    TYPE: ClassVar[str] = "ps_export"
    request_id: int
    blocks: list[int]
    at_version: int = 0
    # How long the server may keep the request waiting for its step boundary;
    # after that it refuses it (0: no limit). A caller that gave up must not find
    # the blocks exported to nobody later.
    wait_s: float = 0.0
    remove: bool = True  # stop holding them (a migration), or keep them (a copy)
    # A migration's destination: requests for the blocks get a PsReply naming it.
    moved_to: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PsExported(Message):
    TYPE: ClassVar[str] = "ps_exported"
    request_id: int
    version: int
    optimizer: PsOptimizer
    blocks: list[PsBlockState]
    # The exporting server's membership and b at that version (a whole server's
    # move hands them over with the blocks, in one step).
    workers: list[int] = field(default_factory=list)
    backup: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsImport(Message):
    """Take over migrated blocks (a PsExported's content) at ``version``; with
    ``with_members`` also its membership and b, before any queued push counts."""

    TYPE: ClassVar[str] = "ps_import"
    request_id: int
    version: int
    optimizer: PsOptimizer
    blocks: list[PsBlockState]
    with_members: bool = False
    workers: list[int] = field(default_factory=list)
    backup: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsStatsRequest(Message):
    TYPE: ClassVar[str] = "ps_stats_request"
    request_id: int
    since_version: int = 0  # updates after this version only


@dataclass(frozen=True, slots=True, kw_only=True)
class PsStats(Message):
    TYPE: ClassVar[str] = "ps_stats"
    request_id: int
    server: int
    version: int
    mode: str  # one of PS_MODES
    backup: int
    workers: list[int]
    blocks: list[int]
    updates: list[PsUpdate]
    incarnation: int = 0
    redirected: list[int] = field(default_factory=list)  # workers told where blocks went
    now_s: float = 0.0  # the server's monotonic clock now: ``now_s - ended_s`` is an age


@dataclass(frozen=True, slots=True, kw_only=True)
class PsShutdown(Message):
    """Write a final snapshot (when configured), answer, and exit."""

    TYPE: ClassVar[str] = "ps_shutdown"
    request_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PsReply(Message):
    TYPE: ClassVar[str] = "ps_reply"
    request_id: int
    ok: bool
    version: int = 0
    detail: str = ""
    incarnation: int = 0  # the answering server's; a refused request may name a newer one
    moved_to: str = ""  # the blocks asked for moved to this server: ask it instead


@dataclass(frozen=True, slots=True, kw_only=True)
class PsPing(Message):
    """Is the server (still) there, and which incarnation is it? Answered by PsReply."""

    TYPE: ClassVar[str] = "ps_ping"
    request_id: int


PS_MESSAGE_TYPES: tuple[type[Message], ...] = (
    PsInit,
    PsInitReply,
    PsPull,
    PsParams,
    PsPush,
    PsPushAck,
    PsMembership,
    PsLeave,
    PsSnapshotNow,
    PsExport,
    PsExported,
    PsImport,
    PsStatsRequest,
    PsStats,
    PsShutdown,
    PsReply,
    PsPing,
)


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
    RegisterPlacement,
    PlacementReady,
    FetchShards,
    ShardGrant,
    AckShards,
    ReleaseShards,
    AckDone,
    StepReports,
    AdjustBatch,
    AdjustLR,
    Attached,
    Regroup,
    RegroupReady,
    RegroupGo,
    StatusRequest,
    StatusReply,
    *PS_MESSAGE_TYPES,
)
