"""The bases every message builds on, and the constants several protocols share.

A message is encoded (see ``dtlaunch.wire.codec``) as a msgpack map holding its
fields plus ``"t"`` (the class's ``TYPE`` tag) and ``"v"`` (``PROTOCOL_VERSION``).
Field types are restricted to what the codec validates: ``bool``, ``int``,
``float``, ``str``, ``bytes``, ``None`` unions, ``list[X]``, ``dict[str, X]`` and
nested ``Record`` dataclasses. Adding a field with a default is backwards
compatible within a protocol version; anything else bumps ``PROTOCOL_VERSION``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "PROC_ROLES",
    "PROC_STATES",
    "PROTOCOL_VERSION",
    "ROLES",
    "STREAMS",
    "Message",
    "Record",
]


PROTOCOL_VERSION = 2  # 2: StepReports as columns (issue 18)


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
