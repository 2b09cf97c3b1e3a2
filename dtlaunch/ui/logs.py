"""A run's logs for ``dtlaunch logs``: which files, their lines, printed or followed.

Where the logs are. An agent sends every chunk of its processes' stdout and
stderr to the supervisor (``Output``), which appends it to
``<run_dir>/logs/<role>-<rank>.log`` (``supervisor/output.py``); an agent's own
stdout and stderr go to ``logs/agent-<host>.log``. The hosts keep no other copy
of a process's output (an agent drops it while the supervisor is unreachable),
so the run directory holds all there is and nothing here contacts a host.

Attempts. A restarted process writes on in the same file; the supervisor
starts each attempt with a marker line ``=== dtlaunch: worker-1 attempt 1 on
HOST pid PID at TIME ===`` (every version of dtlaunch has written it). A line
belongs to the attempt of the marker above it, and is shown with that
attempt's host, as the live console shows it. A process killed in the middle
of a line leaves that line unfinished, and the next attempt's marker is written
right after it: the marker is split off.

Order. Process output carries no times, so the logs of several processes
cannot be merged in time order: they are printed one process after another
(workers by rank, then servers, then agents). Following, new lines are printed
in the order they arrive, interleaved as on the live console.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from dtlaunch.errors import ConfigError, RunDirError
from dtlaunch.supervisor.output import console_prefix
from dtlaunch.ui.timeline import rank_ranges

__all__ = [
    "ROLES",
    "LogLine",
    "LogReader",
    "LogSource",
    "RunLogs",
    "Selection",
    "follow_logs",
    "parse_selection",
    "print_logs",
]

ROLES = ("worker", "server", "agent")
PROCESS_ROLES = ("worker", "server")  # what is shown when no ROLE is given
_READ_BYTES = 1 << 20  # a log of gigabytes is read in pieces, never whole
# What OutputRouter.attempt_started writes; searched anywhere in a line (see above).
ATTEMPT_MARKER = re.compile(
    r"=== dtlaunch: (?P<proc>\S+) attempt (?P<attempt>\d+) on (?P<host>\S+) "
    r"pid \d+ at [^=]* ===$"
)


@dataclass(frozen=True, slots=True)
class LogSource:
    """One log file of the run."""

    role: str  # worker, server or agent
    rank: str  # a worker's or server's rank; an agent's host label
    path: Path

    @property
    def proc_id(self) -> str:
        return f"{self.role}-{self.rank}"

    def describe(self) -> str:
        return f"agent on {self.rank}" if self.role == "agent" else f"{self.role} {self.rank}"

    def order(self) -> tuple[int, int, str]:
        number = int(self.rank) if self.role in PROCESS_ROLES else 0
        return (ROLES.index(self.role), number, self.rank)

    @classmethod
    def from_path(cls, path: Path) -> LogSource | None:
        """The source ``path`` names (``worker-0.log``, ``agent-node1.log``), or None."""
        if path.suffix != ".log":
            return None
        role, dash, rank = path.stem.partition("-")
        if not dash or role not in ROLES or not rank:
            return None
        if role in PROCESS_ROLES and not rank.isdigit():
            return None
        return cls(role=role, rank=rank, path=path)


@dataclass(frozen=True, slots=True)
class LogLine:
    source: LogSource
    attempt: int | None  # None before the first attempt marker, and in an agent's log
    host: str  # where that attempt ran; "" when no marker said
    text: str

    def prefixed(self) -> str:
        """The line as the live console prints it: ``[worker0@node1] text``."""
        source = self.source
        if source.role == "agent":
            prefix = f"[agent@{source.rank}]"
        elif self.host:
            prefix = console_prefix(source.proc_id, self.host)
        else:
            prefix = f"[{source.role}{source.rank}]"
        return f"{prefix} {self.text}"


class LogReader:
    """Reads one log from where it last stopped, like ``tail -f``, as tagged lines."""

    def __init__(self, source: LogSource) -> None:
        self.source = source
        self.attempts_seen: set[int] = set()
        self._offset = 0
        self._partial = b""
        self._attempt: int | None = None
        self._host = ""

    def read_new(self, *, final: bool) -> Iterator[LogLine]:
        """The lines written since the last call. A line without its newline yet is
        kept back for the next call unless ``final`` (nothing more will come)."""
        try:
            handle = self.source.path.open("rb")
        except FileNotFoundError:
            return
        with handle:
            handle.seek(self._offset)
            while chunk := handle.read(_READ_BYTES):
                self._offset += len(chunk)
                *complete, self._partial = (self._partial + chunk).split(b"\n")
                for raw in complete:
                    yield from self._tagged(raw)
        if final and self._partial:
            raw, self._partial = self._partial, b""
            yield from self._tagged(raw)

    def _tagged(self, raw: bytes) -> Iterator[LogLine]:
        text = raw.decode("utf-8", "replace").removesuffix("\r")
        marker = None
        if self.source.role in PROCESS_ROLES:
            marker = ATTEMPT_MARKER.search(text)
        if marker is None or marker["proc"] != self.source.proc_id:
            yield self._line(text)
            return
        if marker.start() > 0:  # the unfinished last line of the attempt before
            yield self._line(text[: marker.start()])
        self._attempt = int(marker["attempt"])
        self._host = marker["host"]
        self.attempts_seen.add(self._attempt)
        yield self._line(text[marker.start() :])

    def _line(self, text: str) -> LogLine:
        return LogLine(source=self.source, attempt=self._attempt, host=self._host, text=text)


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """Which logs and which of their lines to show."""

    role: str | None = None  # None: every worker and server
    rank: str | None = None  # None: every process of ``role``
    attempt: int | None = None
    pattern: re.Pattern[str] | None = None

    def wants(self, source: LogSource) -> bool:
        if self.role is None:
            return source.role in PROCESS_ROLES
        return source.role == self.role and self.rank in (None, source.rank)

    def keeps(self, line: LogLine) -> bool:
        if self.attempt is not None and line.attempt != self.attempt:
            return False
        return self.pattern is None or self.pattern.search(line.text) is not None

    def arguments(self) -> str:
        """ROLE and RANK as typed on the command line ("" for the default)."""
        return " ".join(word for word in (self.role, self.rank) if word is not None)

    def describe(self) -> str:
        if self.role is None:
            return "the workers and servers"
        if self.rank is None:
            return f"the {self.role}s"
        return LogSource(role=self.role, rank=self.rank, path=Path()).describe()


def parse_selection(
    role: str | None, rank: str | None, *, attempt: int | None, grep: str | None
) -> Selection:
    """The selection the command line asks for.

    Raises:
        ConfigError: an unknown role, a rank that is no number, ``--attempt`` of
            an agent, or a ``--grep`` that is not a regular expression.
    """
    if role is not None and role not in ROLES:
        example = f"worker {role}" if role.isdigit() else "worker 0"
        raise ConfigError(
            f"unknown role {role!r}; ROLE is worker, server or agent, before the rank "
            f"(e.g. dtlaunch logs RUN_DIR {example})"
        )
    if role in PROCESS_ROLES and rank is not None:
        if not rank.isdigit():
            raise ConfigError(
                f"{role} rank {rank!r} is not a number; pass one like 0 "
                f"(e.g. dtlaunch logs RUN_DIR {role} 0)"
            )
        rank = str(int(rank))  # "01" names rank 1, as the file name does
    if role == "agent" and attempt is not None:
        raise ConfigError(
            "--attempt selects a worker's or server's attempt; an agent's log has none"
        )
    pattern = None
    if grep is not None:
        try:
            pattern = re.compile(grep)
        except re.error as err:
            raise ConfigError(
                f"--grep {grep!r} is not a regular expression: {err.msg} at position "
                f"{err.pos}; escape a special character with a backslash "
                "(e.g. --grep 'loss=[0-9.]+' or --grep '\\(')"
            ) from None
    return Selection(role=role, rank=rank, attempt=attempt, pattern=pattern)


@dataclass(frozen=True, slots=True)
class RunLogs:
    """The logs of one run directory."""

    run_dir: Path
    job: dict[str, object] = field(default_factory=dict)  # job.json, read leniently

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @classmethod
    def open(cls, run_dir: Path) -> RunLogs:
        """
        Raises:
            RunDirError: ``run_dir`` does not exist or is no run directory.
        """
        if not run_dir.exists():
            raise RunDirError(
                f"{run_dir} does not exist; pass the run directory of a job "
                "(./runs/<run-id> by default, or the --run-dir you gave dtlaunch run)"
            )
        job_path = run_dir / "job.json"
        if not run_dir.is_dir() or not (job_path.is_file() or (run_dir / "logs").is_dir()):
            raise RunDirError(
                f"{run_dir} is not a dtlaunch run directory (no job.json, no logs/); "
                "pass one like runs/<run-id> (or the --run-dir you gave dtlaunch run)"
            )
        try:
            job = json.loads(job_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            job = {}  # the files still tell which processes wrote logs
        return cls(run_dir, job if isinstance(job, dict) else {})

    def sources(self) -> list[LogSource]:
        """Every log there is now, in the order they are shown."""
        try:
            paths = list(self.logs_dir.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = (LogSource.from_path(path) for path in paths)
        return sorted((s for s in found if s is not None), key=LogSource.order)

    def known(self, role: str) -> list[str]:
        """The ranks (agents: hosts) of ``role`` the job has or had, sorted."""
        names = {s.rank for s in self.sources() if s.role == role}
        count = self.job.get(f"{role}s")
        if role in PROCESS_ROLES and isinstance(count, int):
            names.update(str(rank) for rank in range(count))
        hosts = self.job.get("hosts")
        if role == "agent" and isinstance(hosts, list):
            names.update(str(h["label"]) for h in hosts if isinstance(h, dict) and "label" in h)
        if role in PROCESS_ROLES:
            return sorted(names, key=int)
        return sorted(names)

    def check(self, selection: Selection) -> None:
        """
        Raises:
            ConfigError: the selected rank (or host) is not in this run.
        """
        role, rank = selection.role, selection.rank
        if role is None or rank is None:
            return
        known = self.known(role)
        if rank in known:
            return
        if not known:
            raise ConfigError(f"{self.run_dir} has no {role}s; {self._what_there_is()}")
        raise ConfigError(
            f"{self.run_dir} has no {role} {rank}: its {role}s are {_listing(role, known)}; "
            f"pass one of them (e.g. dtlaunch logs {self.run_dir} {role} {known[0]})"
        )

    def _what_there_is(self) -> str:
        parts = [
            f"{role}s {_listing(role, known)}" for role in ROLES if (known := self.known(role))
        ]
        return "it has " + "; ".join(parts) if parts else "no process has written a log there yet"


def _listing(role: str, names: list[str]) -> str:
    """``0..3,5`` for ranks, ``node1, node2`` for hosts."""
    if role in PROCESS_ROLES:
        return rank_ranges(int(name) for name in names)
    return ", ".join(names)


def print_logs(run: RunLogs, selection: Selection, out: TextIO) -> int:
    """Print the selected logs as they are now, one process after another, each
    under a ``==> worker 0: PATH <==`` header when several are shown; return the
    number of lines printed.

    Raises:
        RunDirError: no selected process has written a log yet.
        ConfigError: ``selection.attempt`` is in none of the selected logs.
    """
    run.check(selection)
    sources = [s for s in run.sources() if selection.wants(s)]
    if not sources:
        raise RunDirError(
            f"no log of {selection.describe()} in {run.logs_dir} yet: not started; "
            f"wait for it with dtlaunch logs -f {run.run_dir} {selection.arguments()}".rstrip()
        )
    with_headers = len(sources) > 1
    printed = 0
    attempts: set[int] = set()
    for source in sources:
        reader = LogReader(source)
        header_due = with_headers
        for line in reader.read_new(final=True):
            if not selection.keeps(line):
                continue
            if header_due:
                out.write(
                    ("\n" if printed else "") + f"==> {source.describe()}: {source.path} <==\n"
                )
                header_due = False
            out.write(line.prefixed() + "\n")
            printed += 1
        attempts |= reader.attempts_seen
    if selection.attempt is not None and selection.attempt not in attempts:
        held = f"attempts {rank_ranges(attempts)}" if attempts else "no attempt marker"
        raise ConfigError(
            f"the logs of {selection.describe()} hold no attempt {selection.attempt} "
            f"({held}); pass one of those to --attempt (0 is the first start)"
        )
    return printed


def follow_logs(
    run: RunLogs,
    selection: Selection,
    out: TextIO,
    *,
    job_ended: Callable[[], bool],
    poll_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the selected logs, then their new lines as they arrive, like
    ``tail -f``, until ``job_ended()``; return the number of lines printed.

    A log that appears later (a process that starts later) is picked up at the
    next poll. The end is checked before the last read, so every line written
    before the job ended is printed, its unfinished last line included.

    Raises:
        ConfigError: the selected rank (or host) is not in this run.
    """
    run.check(selection)
    readers: dict[Path, LogReader] = {}
    printed = 0
    while True:
        ended = job_ended()
        for source in run.sources():
            if selection.wants(source) and source.path not in readers:
                readers[source.path] = LogReader(source)
        for reader in readers.values():
            for line in reader.read_new(final=ended):
                if selection.keeps(line):
                    out.write(line.prefixed() + "\n")
                    printed += 1
        out.flush()
        if ended:
            return printed
        sleep(poll_s)
