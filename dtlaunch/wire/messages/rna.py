"""RNA's rounds: worker <-> the supervisor's round coordinator (RNA §3.2, §3.3).

A worker's communication thread (``dtlaunch.runtime.rna``) joins a group
(``RnaJoin``); the coordinator asks one member to host the group's store
(``RnaOpenStore`` -> ``RnaStoreReady``), tells every member where it is and who
hands out the model state (``RnaGroup``), and runs rounds once every member has
formed (``RnaFormed``). Each round it probes a few random members
(``RnaProbe``); the first that has a gradient ready answers (``RnaReady``) and
becomes the initiator, and every member joins that round (``RnaStart``), with
whatever gradient it has (weight 0 when none). Probes carry the round they are
for, so an answer to a round already started is recognised as late. A failed
collective is reported (``RnaFailed``); a worker whose training ended leaves
(``RnaLeave``, acting as a ready answer so its last gradient is used) and is
let go (``RnaLeft``). Under hierarchical RNA (§4) each group of the partition
runs its own generations and rounds; some rounds carry an exchange with the
parameter server between the groups (``RnaStart.exchange``). The
group's first member reports rounds, sampled (``RnaRounds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtlaunch.wire.messages.base import Message, Record

__all__ = [
    "MESSAGES",
    "RnaExchanged",
    "RnaFailed",
    "RnaFormed",
    "RnaGroup",
    "RnaJoin",
    "RnaLeave",
    "RnaLeft",
    "RnaOpenStore",
    "RnaProbe",
    "RnaReady",
    "RnaRoundRecord",
    "RnaRounds",
    "RnaStart",
    "RnaStoreReady",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaJoin(Message):
    """A worker's communication thread is ready to join a group (at its start,
    or after it lost its group); its model has ``applied`` rounds in it (0 for a
    fresh start); ``finished``: its training ended, it waits to be let go."""

    TYPE: ClassVar[str] = "rna_join"
    applied: int
    finished: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaOpenStore(Message):
    """To one member: host generation ``gen``'s store and say on which port."""

    TYPE: ClassVar[str] = "rna_open_store"
    gen: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaStoreReady(Message):
    """Generation ``gen``'s store listens on ``port`` of the sender's host."""

    TYPE: ClassVar[str] = "rna_store_ready"
    gen: int
    port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaGroup(Message):
    """To every member: form generation ``gen`` of ``members`` (ranks, in group
    order) at ``store_addr:store_port``; the member whose model holds the most
    rounds broadcasts its model, optimizer state and round count
    (``source_rank`` among equals), so every member starts the generation equal;
    ``timeout_s`` bounds every collective of the group. ``group_size``: under
    hierarchical RNA (§4) the workers the partition gave this group (its
    rounds' learning rate and its weight at the parameter server count them;
    members that died leave it unchanged); 0: one group of the whole job."""

    TYPE: ClassVar[str] = "rna_group"
    gen: int
    members: list[int]
    store_addr: str
    store_port: int
    source_rank: int
    timeout_s: float
    group_size: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaFormed(Message):
    """The sender formed generation ``gen``; the group's model has ``applied`` rounds."""

    TYPE: ClassVar[str] = "rna_formed"
    gen: int
    applied: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaProbe(Message):
    """Answer ``RnaReady`` once you have a gradient for round ``round`` (§3.2)."""

    TYPE: ClassVar[str] = "rna_probe"
    gen: int
    round: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaReady(Message):
    """The answer to a probe: a gradient is ready for ``round``; it became ready
    ``waited_s`` after the probe arrived (0 when it already was)."""

    TYPE: ClassVar[str] = "rna_ready"
    gen: int
    round: int
    waited_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaStart(Message):
    """To every member: run round ``round`` now; ``initiator`` answered first.
    ``exchange`` (hierarchical RNA, §4): after the round the initiator
    exchanges the group's model with the parameter server and broadcasts what
    it pulled to the group; ``final``: the group's last exchange before it
    holds (it pushes the average of its model's updates, ``rna:average``)."""

    TYPE: ClassVar[str] = "rna_start"
    gen: int
    round: int
    initiator: int
    exchange: bool = False
    final: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaFailed(Message):
    """A collective of generation ``gen`` failed at ``round`` (-1: while forming)."""

    TYPE: ClassVar[str] = "rna_failed"
    gen: int
    round: int
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaLeave(Message):
    """The sender's training ended: use its last gradient, then let it go."""

    TYPE: ClassVar[str] = "rna_leave"
    applied: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaLeft(Message):
    """To a worker that left: it is out of the group; its last gradient went
    into round ``round`` (-1: no round ran after it left)."""

    TYPE: ClassVar[str] = "rna_left"
    round: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaExchanged(Message):
    """From the initiator of round ``round`` of generation ``gen`` (hierarchical
    RNA, §4): it exchanged the group's model with the parameter server, in
    ``seconds`` (push and pull); ``ok`` False: the exchange failed (``error``)
    and the group kept its own model."""

    TYPE: ClassVar[str] = "rna_exchanged"
    gen: int
    round: int
    seconds: float
    ok: bool = True
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaRoundRecord(Record):
    """One round as every member saw it: who contributed, how stale each
    contribution was (rounds between the model it was computed on and this
    round), and how long the collective took on the reporter."""

    round: int
    initiator: int
    contributors: list[int]
    staleness: list[int]  # parallel to contributors
    comm_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaRounds(Message):
    """From generation ``gen``'s first member: ``rounds`` rounds ran since its
    last report, ``contributions[i]`` of them with a gradient of
    ``members[i]``, and a sample of them in full."""

    TYPE: ClassVar[str] = "rna_rounds"
    gen: int
    members: list[int]
    rounds: int
    contributions: list[int]
    sampled: list[RnaRoundRecord] = field(default_factory=list)


# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES: tuple[type[Message], ...] = (
    RnaJoin,
    RnaOpenStore,
    RnaStoreReady,
    RnaGroup,
    RnaFormed,
    RnaProbe,
    RnaReady,
    RnaStart,
    RnaFailed,
    RnaLeave,
    RnaLeft,
    RnaRounds,
    RnaExchanged,
)
