"""The session every peer holds with the supervisor, whatever its role.

A peer (agent, worker, server, control or status client) says ``Hello`` first;
the supervisor answers ``Welcome``, or ``Rehello`` when it does not know the
peer (e.g. after ``--resume``: the peer says Hello again, with what it holds).
``Ping`` goes either way; any message counts as liveness of its sender. A
control client sends ``StopJob`` (``dtlaunch stop``) or ``ScaleJob``
(``dtlaunch scale``) and gets an ``Ack``, whose detail says what was done or why not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtlaunch.wire.messages.agent import ProcReport
from dtlaunch.wire.messages.base import Message

__all__ = [
    "MESSAGES",
    "Ack",
    "Hello",
    "Ping",
    "Rehello",
    "ScaleJob",
    "StopJob",
    "Welcome",
]


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
    memory_bytes: int = 0  # agents: their host's memory (bounds an OOM relaunch's limit)
    limits: str = ""  # agents: how they enforce limits ("memory cgroup-v1, cpu affinity")


@dataclass(frozen=True, slots=True, kw_only=True)
class StopJob(Message):
    """From ``dtlaunch stop``: stop the whole job gracefully."""

    TYPE: ClassVar[str] = "stop_job"
    reason: str = "dtlaunch stop"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleJob(Message):
    """From ``dtlaunch scale``: run this many workers and built-in parameter
    servers from now on (0: as many as now)."""

    TYPE: ClassVar[str] = "scale_job"
    workers: int
    reason: str = "dtlaunch scale"
    servers: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    TYPE: ClassVar[str] = "ping"
    seq: int


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
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    ok: bool
    detail: str = ""


# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES: tuple[type[Message], ...] = (
    Hello,
    StopJob,
    ScaleJob,
    Ping,
    Welcome,
    Rehello,
    Ack,
)
