"""Job events and the sinks they go to.

An ``Event`` is one thing that happened: a spawn, an exit, a restart, a lost or
recovered heartbeat, a command, a decision. The supervisor hands every event to
the sinks it was given (no global registry); ``JsonlEventLog`` writes them to
``events.jsonl``, one JSON object a line, which ``dtlaunch replay`` reads back.

Lines are encoded by orjson, about ten times faster than the standard library:
at 1,000 workers the log takes several thousand lines a second (step reports,
shards done), and encoding them was a tenth of the supervisor's time. orjson
writes ``null`` for NaN and infinity, where the standard library writes
``NaN``/``Infinity`` (which it reads back as floats); a line with a ``null`` in
it is therefore encoded again by the standard library, so that every value
reads back as it was recorded.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

log = logging.getLogger(__name__)

# orjson options that keep the standard library's values for the same record:
# integer keys become strings, dataclasses and datetimes go through default=str.
# (The text is more compact: no spaces after separators, UTF-8 unescaped.)
_ORJSON_AS_STDLIB = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
)

EVENT_KINDS = (
    "job_start",
    "job_end",
    "agent_launch",
    "agent_up",
    "agent_lost",
    "agent_exit",
    "spawn",
    "spawn_failed",
    "running",
    "exit",
    "failure",
    "restart",
    "heartbeat_lost",
    "heartbeat_recovered",
    "unresponsive",
    "responsive",
    "command",
    "decision",
    "stop_requested",
    "wire_dropped",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: str
    mono: float  # seconds since the job started (monotonic clock)
    wall: float  # Unix time
    host: str = ""
    role: str = ""
    rank: int = -1
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        record: dict[str, Any] = {
            "kind": self.kind,
            "mono": round(self.mono, 6),
            "wall": round(self.wall, 6),
            "host": self.host,
            "role": self.role,
            "rank": self.rank,
        }
        record.update(self.data)
        try:
            line = orjson.dumps(record, default=_as_stdlib, option=_ORJSON_AS_STDLIB)
        except TypeError:  # e.g. an integer beyond 64 bits
            return json.dumps(record, default=str)
        if b"null" in line:  # None, or a non-finite float that orjson wrote as null
            return json.dumps(record, default=str)
        return line.decode()

    @classmethod
    def from_json(cls, line: str) -> Event:
        record = json.loads(line)
        base = {k: record.pop(k) for k in ("kind", "mono", "wall", "host", "role", "rank")}
        return cls(**base, data=record)


def _as_stdlib(value: Any) -> Any:
    """What orjson cannot write, as the standard library's default=str would
    have it; a float subclass (numpy.float64) stays a number, as it did there."""
    if isinstance(value, float):
        return float(value)
    return str(value)


class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...


class MemorySink:
    """Keeps events in a list; for tests and for in-process consumers."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


class JsonlEventLog:
    """Appends events to a JSON-lines file, flushed per event.

    Flushing (not fsyncing) keeps the log readable by ``status``/``replay`` while
    the job runs; the durable record of progress is the DDS write-ahead log.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        torn = _ends_without_newline(path)
        self._file = path.open("a", encoding="utf-8")
        if torn:
            # A supervisor killed mid-write left half a line: end it, so that the
            # next event is not glued onto it and lost with it.
            self._file.write("\n")

    def emit(self, event: Event) -> None:
        self._file.write(event.to_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            finally:
                self._file.close()


def _ends_without_newline(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except (FileNotFoundError, OSError):  # missing or empty
        return False


class EventRecorder:
    """Stamps events with the job's clocks and fans them out to sinks."""

    def __init__(
        self,
        sinks: list[EventSink],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._sinks = list(sinks)
        self._monotonic = monotonic
        self._wall = wall
        self._start = monotonic()

    def elapsed(self) -> float:
        return self._monotonic() - self._start

    def emit(
        self, kind: str, *, host: str = "", role: str = "", rank: int = -1, **data: Any
    ) -> Event:
        event = Event(
            kind=kind,
            mono=self.elapsed(),
            wall=self._wall(),
            host=host,
            role=role,
            rank=rank,
            data=data,
        )
        for sink in self._sinks:
            try:
                sink.emit(event)
            except Exception:  # a broken sink must not take the job down
                log.exception("event sink %r failed on %s", sink, kind)
        return event


def resource_samples(event: Event) -> Iterator[tuple[str, int, float, int]]:
    """(proc id, RSS bytes, CPU %, memory limit) of each process in a ``resources``
    event (the supervisor's sample every 15 s); malformed entries are skipped."""
    procs = event.data.get("procs")
    if event.kind != "resources" or not isinstance(procs, dict):
        return
    for proc_id, sample in procs.items():
        if isinstance(sample, list) and len(sample) == 3:
            rss, cpu, limit = sample
            yield str(proc_id), int(rss), float(cpu), int(limit)


def read_events(path: Path) -> Iterator[Event]:
    """Events of a log, tolerating a torn last line (a crashed supervisor)."""
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield Event.from_json(line)
            except (ValueError, KeyError, TypeError):
                log.warning("%s:%d: skipping a malformed event line", path, lineno)
