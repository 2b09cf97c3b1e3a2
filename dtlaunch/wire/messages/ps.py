"""The built-in parameter server's own socket protocol (``dtlaunch.ps``).

Worker/control <-> server, on the server's own CURVE ROUTER. A message is the
first frame; tensor payloads follow it as raw frames (never msgpack), one per
block in the order of the message's ``blocks`` list (for exports: the block's
parameter, then its state tensors in ``tensors`` order). Every request carries a
``request_id`` echoed by its answer; a refused request is answered by
``PsReply(ok=False, detail=why)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtlaunch.wire.messages.base import Message, Record

__all__ = [
    "MESSAGES",
    "PS_MESSAGE_TYPES",
    "PS_MODES",
    "PS_OPTIMIZERS",
    "PsBlockSpec",
    "PsBlockState",
    "PsExport",
    "PsExported",
    "PsHoldEnd",
    "PsIdle",
    "PsIdleReply",
    "PsImport",
    "PsInit",
    "PsInitReply",
    "PsLeave",
    "PsMembership",
    "PsOptimizer",
    "PsParams",
    "PsPing",
    "PsPull",
    "PsPush",
    "PsPushAck",
    "PsRelease",
    "PsReply",
    "PsShutdown",
    "PsSnapshotNow",
    "PsStats",
    "PsStatsRequest",
    "PsUpdate",
]


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
    mode: str = "bsp"  # one of PS_MODES: under asp a push a reassignment refused goes again


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
class PsIdle(Message):
    """A worker waits for data (``idle``: steps stop waiting for it) or has some
    again (not ``idle``: it is a member again). Answered by ``PsIdleReply``."""

    TYPE: ClassVar[str] = "ps_idle"
    request_id: int
    worker: int
    idle: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PsIdleReply(Message):
    """``member_from``: the first step that waits for this worker's push (a step
    already under way without it applies without it). ``member``: whether the
    server's steps count this worker at all (BSP: the supervisor assigned it; a
    rank ``dtlaunch scale`` added is assigned once it said hello)."""

    TYPE: ClassVar[str] = "ps_idle_reply"
    request_id: int
    member_from: int
    version: int
    incarnation: int
    member: bool = True


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
    # A reassignment (PSLD): keep the blocks, but from ``at_version`` on answer no
    # pull for them until a PsRelease (they went elsewhere) or PsHoldEnd (they
    # stay). Refused when the server is already past ``at_version``: a pull of
    # that version may have been answered from the old placement.
    hold: bool = False


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
class PsRelease(Message):
    """Drop ``blocks`` (held or not). With ``placement_version`` > 0 they went
    elsewhere in that placement: a request naming them is answered
    ``PsReply(ok=False, placement_version=...)``, and the client follows the
    job's map from that version on. 0: only drop them (a reassignment's target
    rolling back an import)."""

    TYPE: ClassVar[str] = "ps_release"
    request_id: int
    blocks: list[int]
    placement_version: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsHoldEnd(Message):
    """A reassignment rolled back: serve ``blocks`` again (a PsExport's hold ends)."""

    TYPE: ClassVar[str] = "ps_hold_end"
    request_id: int
    blocks: list[int]


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
    assigned: list[int] = field(default_factory=list)  # the membership it was given
    # BSP: the members whose push the coming step still lacks; and the workers
    # whose pull or push waits here only because a reassignment holds a block
    # at its fence. A server below a fence that waits only for held workers
    # never reaches it (``psfleet.reassign``).
    waiting_for: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)


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
    holding: bool = False  # to a PsPing: the request it names waits here for its answer
    # The blocks asked for were reassigned in this version of the job's placement
    # map: fetch it (at least this version), follow it, and send the request again.
    placement_version: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PsPing(Message):
    """Is the server (still) there, which incarnation is it, and does it hold the
    request ``awaiting`` (the client's request_id, 0: none)? Answered by PsReply.

    A server answers its peer's requests in the order they arrive, so when the
    answer says ``holding=False`` and the request's own answer did not come
    first, the request never reached this process (it went to one that died):
    the client sends it again.
    """

    TYPE: ClassVar[str] = "ps_ping"
    request_id: int
    awaiting: int = 0


PS_MESSAGE_TYPES: tuple[type[Message], ...] = (
    PsInit,
    PsInitReply,
    PsPull,
    PsParams,
    PsPush,
    PsPushAck,
    PsMembership,
    PsLeave,
    PsIdle,
    PsIdleReply,
    PsSnapshotNow,
    PsExport,
    PsExported,
    PsImport,
    PsRelease,
    PsHoldEnd,
    PsStatsRequest,
    PsStats,
    PsShutdown,
    PsReply,
    PsPing,
)

# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES = PS_MESSAGE_TYPES
