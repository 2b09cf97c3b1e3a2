"""Route process output to per-process log files and, prefixed, to the console."""

from __future__ import annotations

import logging
import time
from typing import IO, TextIO

from dtlaunch.config import OutputSpec
from dtlaunch.deadstream import silence
from dtlaunch.supervisor.rundir import RunDir

log = logging.getLogger(__name__)


def console_prefix(proc_id: str, host: str) -> str:
    role, _, rank = proc_id.partition("-")
    return f"[{role}{rank}@{host}]"


class OutputRouter:
    """Appends every chunk to ``logs/<role>-<rank>.log`` (all attempts in one file)
    and echoes complete lines of the selected processes to the console.

    A console that goes away (its terminal closed, the ``| tee`` reading it
    killed) ends the echo, not the job: the lines stay in the log files."""

    def __init__(self, run: RunDir, console: TextIO, spec: OutputSpec) -> None:
        self._run = run
        self._console: TextIO | None = console
        self._spec = spec
        self._files: dict[str, IO[bytes]] = {}
        self._partial: dict[tuple[str, str], bytes] = {}

    def _file(self, proc_id: str) -> IO[bytes]:
        handle = self._files.get(proc_id)
        if handle is None:
            handle = (self._run.logs / f"{proc_id}.log").open("ab")
            self._files[proc_id] = handle
        return handle

    def attempt_started(self, proc_id: str, host: str, attempt: int, pid: int) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        line = f"=== dtlaunch: {proc_id} attempt {attempt} on {host} pid {pid} at {stamp} ===\n"
        handle = self._file(proc_id)
        handle.write(line.encode())
        handle.flush()

    def note(self, proc_id: str, host: str, text: str) -> None:
        """A dtlaunch note in a process's log (e.g. its stacks when the job stalled)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        handle = self._file(proc_id)
        handle.write(f"=== dtlaunch: {proc_id} on {host} at {stamp}: {text}\n===\n".encode())
        handle.flush()

    def write(self, proc_id: str, host: str, stream: str, data: bytes) -> None:
        handle = self._file(proc_id)
        handle.write(data)
        handle.flush()
        if not self._spec.shows(proc_id):
            return
        key = (proc_id, stream)
        buffered = self._partial.pop(key, b"") + data
        *lines, rest = buffered.split(b"\n")
        if rest:
            self._partial[key] = rest
        prefix = console_prefix(proc_id, host)
        if lines:
            self._echo("".join(f"{prefix} {line.decode('utf-8', 'replace')}\n" for line in lines))

    def flush_partial(self, proc_id: str, host: str) -> None:
        """A process ended: print what it left without a final newline."""
        prefix = console_prefix(proc_id, host)
        for stream in ("stdout", "stderr"):
            rest = self._partial.pop((proc_id, stream), b"")
            if rest and self._spec.shows(proc_id):
                self._echo(f"{prefix} {rest.decode('utf-8', 'replace')}\n")

    def _echo(self, text: str) -> None:
        console = self._console
        if console is None:
            return
        try:
            console.write(text)
            console.flush()
        except BrokenPipeError:
            self._console = None
            silence(console)
            log.warning(
                "the console went away; the processes' output goes on into %s", self._run.logs
            )

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
