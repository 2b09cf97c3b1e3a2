"""The parameter-server placement map, kept by the supervisor (PSLD §3, §5.2).

The first PS worker registers the block map it planned (``RegisterPlacement``);
every worker is answered with the job's one map (``PlacementReady``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtlaunch.wire.messages.base import Message, Record

__all__ = [
    "MESSAGES",
    "PlacementReady",
    "PsPlacedBlock",
    "PsPlacementMap",
    "RegisterPlacement",
]


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
    # Where servers 0..placement.servers-1 listen now (empty: not all known). A
    # scale-out or scale-in changes them with the map; a moved server, without.
    endpoints: list[str] = field(default_factory=list)


# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES: tuple[type[Message], ...] = (
    RegisterPlacement,
    PlacementReady,
)
