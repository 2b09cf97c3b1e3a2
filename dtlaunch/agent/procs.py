"""Starting, watching and stopping an agent's children, each in its own process group.

``ProcessGroupRunner`` is an async context manager that owns a TaskGroup: per
child one watcher task (wait for exit, pump output, clean up the group, report)
and one task per Kill. Leaving the context stops every child that is still
running. The runner reports through a ``ProcSink`` (the agent loop sends those
reports as wire messages), so this module knows nothing about sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

import psutil

from dtlaunch.agent.limits import Cage, LimitEnforcer, Limits
from dtlaunch.agent.oom import OomWatcher
from dtlaunch.agent.output import ChunkCallback, LineTail, pump
from dtlaunch.agent.proctable import TOKEN_ENV, ChildRecord, write_table
from dtlaunch.agent.resources import TreeFinder, TreeSampler, tree_finder
from dtlaunch.errors import LaunchError
from dtlaunch.procwait import wait_popen
from dtlaunch.wire.messages import ProcReport

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# Grandchildren that left the process group may hold the pipes open forever.
DRAIN_AFTER_EXIT_S = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class SpawnSpec:
    proc_id: str
    role: str
    rank: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitInfo:
    proc_id: str
    attempt: int
    pid: int
    exit_code: int | None
    signal: int | None
    runtime_s: float
    stderr_tail: list[str]
    oom_killed: bool
    requested: bool


class ProcSink(Protocol):
    """Receives what children do, in order: started, output..., exited (per child)."""

    async def started(self, child: ChildProcess) -> None: ...

    async def output(self, child: ChildProcess, stream: str, data: bytes) -> None: ...

    async def exited(self, child: ChildProcess, info: ExitInfo) -> None: ...


@dataclass(slots=True, kw_only=True, eq=False)
class ChildProcess:
    """One running child; ``done`` is set once its exit has been reported."""

    spec: SpawnSpec
    popen: subprocess.Popen[bytes]
    create_time: float
    token: str
    started: float  # time.monotonic() at spawn
    requested: bool = False  # a stop was ordered by command
    stderr_tail: LineTail = field(default_factory=LineTail)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    sampler: TreeSampler | None = None
    cage: Cage | None = None  # its own cgroups (or rlimits) when it has limits

    @property
    def proc_id(self) -> str:
        return self.spec.proc_id

    @property
    def attempt(self) -> int:
        return self.spec.attempt

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def pgid(self) -> int:
        # start_new_session makes the child the leader of its own group.
        return self.popen.pid

    def record(self) -> ChildRecord:
        return ChildRecord(
            proc_id=self.proc_id,
            attempt=self.attempt,
            pid=self.pid,
            pgid=self.pgid,
            create_time=self.create_time,
            token=self.token,
        )

    def report(self, parents: TreeFinder | None = None) -> ProcReport:
        if self.sampler is None:
            self.sampler = TreeSampler(self.pid, parents)
        sample = self.sampler.sample()
        return ProcReport(
            proc_id=self.proc_id,
            role=self.spec.role,
            rank=self.spec.rank,
            attempt=self.attempt,
            pid=self.pid,
            state=sample.state,
            rss_bytes=sample.rss_bytes,
            cpu_percent=sample.cpu_percent,
            cpu_throttled=round(self.cage.throttled_share(), 3) if self.cage is not None else 0.0,
        )

    def signal_group(self, signum: int) -> bool:
        """Signal the whole process group; False when it is already gone."""
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            log.warning("cannot signal process group %d of %s: %s", self.pgid, self.proc_id, exc)
            return False
        return True


# Resolved before any fork: loading a library in a forked child of a threaded
# process (ZeroMQ runs threads) can deadlock on the loader lock.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _child_preexec(parent_pid: int, cage: Cage | None) -> Callable[[], None]:
    """Runs in the forked child before exec, so it does as little as possible."""

    def preexec() -> None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died before prctl took effect: then nobody would kill us.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        # The agent ignores SIGHUP; ignored signals survive exec, so undo it.
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        if cage is not None:
            cage.enter()  # before exec: nothing the script allocates escapes its limits

    return preexec


def _check_spawnable(spec: SpawnSpec, env: Mapping[str, str]) -> None:
    """Raise LaunchError with a clear fix when argv/cwd cannot work."""
    if not spec.argv:
        raise LaunchError(f"{spec.proc_id}: empty command line; the Spawn needs argv[0]")
    if not os.path.isdir(spec.cwd):
        raise LaunchError(
            f"{spec.proc_id}: working directory {spec.cwd!r} does not exist on this host; "
            "create it there or pass an existing --workdir"
        )
    exe = spec.argv[0]
    if os.sep in exe:
        path = exe if os.path.isabs(exe) else os.path.join(spec.cwd, exe)
        if not os.path.isfile(path):
            raise LaunchError(f"{spec.proc_id}: executable {path!r} not found on this host")
        if not os.access(path, os.X_OK):
            raise LaunchError(
                f"{spec.proc_id}: {path!r} is not executable; chmod +x it or run it via python"
            )
    else:
        # Imported here: shutil brings bz2, lzma and zlib into the agent's start
        # (~3 ms of CPU on every host of a launch); a full path never needs it.
        import shutil

        if shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
            raise LaunchError(
                f"{spec.proc_id}: executable {exe!r} not found on PATH of this host; "
                "install it or give its full path (e.g. --python /path/to/python)"
            )


async def _pipe_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.ReadTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


class ProcessGroupRunner:
    """Runs children for one agent; use as ``async with ProcessGroupRunner(...) as r``."""

    def __init__(
        self,
        *,
        table_path: Path,
        sink: ProcSink,
        extra_env: Mapping[str, str] | None = None,
        oom: OomWatcher | None = None,
        limits: LimitEnforcer | None = None,
        shutdown_grace_s: float = 5.0,
    ) -> None:
        self._table_path = table_path
        self._sink = sink
        self._extra_env = dict(extra_env or {})
        self._oom = oom or OomWatcher(None)
        self._limits = limits
        self._shutdown_grace_s = shutdown_grace_s
        self._children: dict[str, ChildProcess] = {}
        self._parents = tree_finder()  # finds each child's tree for its reports
        self._tasks = asyncio.TaskGroup()

    async def __aenter__(self) -> ProcessGroupRunner:
        await self._tasks.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await asyncio.shield(self.stop_all(self._shutdown_grace_s))
        finally:
            await self._tasks.__aexit__(exc_type, exc, tb)

    # ------------------------------------------------------------------ queries

    def children(self) -> list[ChildProcess]:
        return list(self._children.values())

    def get(self, proc_id: str) -> ChildProcess | None:
        return self._children.get(proc_id)

    def reports(self) -> list[ProcReport]:
        if self._children:
            self._parents.refresh()
        return [child.report(self._parents) for child in self._children.values()]

    # ------------------------------------------------------------------ spawn

    def spawn(self, spec: SpawnSpec) -> ChildProcess:
        """Start ``spec`` in a new session; raise LaunchError when it cannot start."""
        running = self._children.get(spec.proc_id)
        if running is not None:
            raise LaunchError(
                f"{spec.proc_id} is already running (attempt {running.attempt}, "
                f"pid {running.pid}); send Kill and wait for Exited before spawning it again"
            )
        token = os.urandom(16).hex()
        env = {**os.environ, **spec.env, **self._extra_env, TOKEN_ENV: token}
        _check_spawnable(spec, env)
        cage = self._cage(spec)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            popen = subprocess.Popen(
                spec.argv,
                cwd=spec.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                # The only way to set PDEATHSIG, and to enter the cgroups before exec.
                preexec_fn=_child_preexec(os.getpid(), cage),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            if cage is not None:
                cage.after_fork()
                cage.remove()
            raise LaunchError(f"{spec.proc_id}: cannot start {spec.argv[0]!r}: {exc}") from exc
        finally:
            os.close(out_w)
            os.close(err_w)
        if cage is not None:
            cage.after_fork()
        try:
            create_time = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            create_time = 0.0  # already gone and reaped elsewhere: nothing to clean up later
        child = ChildProcess(
            spec=spec,
            popen=popen,
            create_time=create_time,
            token=token,
            started=time.monotonic(),
            cage=cage,
        )
        self._children[spec.proc_id] = child
        self._write_table()
        log.info(
            "started %s attempt %d: pid %d, argv %s%s",
            spec.proc_id,
            spec.attempt,
            popen.pid,
            spec.argv,
            f", limits: {cage.backend}" if cage is not None else "",
        )
        self._tasks.create_task(self._watch(child, out_r, err_r))
        return child

    def _cage(self, spec: SpawnSpec) -> Cage | None:
        """The child's limits, set up before it forks; None without limits."""
        if not spec.limits:
            return None
        if self._limits is None:
            raise LaunchError(
                f"{spec.proc_id}: limits were asked for ({spec.limits}) but this runner "
                "enforces none"
            )
        return self._limits.cage(f"{spec.proc_id}-a{spec.attempt}", spec.limits)

    # ------------------------------------------------------------------ stop

    def kill(self, proc_id: str, attempt: int, grace_s: float) -> bool:
        """Order a stop of ``proc_id`` if it runs ``attempt``; False when ignored."""
        child = self._children.get(proc_id)
        if child is None or child.attempt != attempt:
            log.info("ignoring kill of %s attempt %d: not running", proc_id, attempt)
            return False
        self._tasks.create_task(self.stop(child, grace_s))
        return True

    async def stop(self, child: ChildProcess, grace_s: float) -> None:
        """SIGTERM the child's group, SIGKILL it after ``grace_s``; wait for its report."""
        child.requested = True
        if child.popen.returncode is None and child.signal_group(signal.SIGTERM):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.done.wait(), grace_s)
            if not child.done.is_set():
                log.warning("%s ignored SIGTERM for %.1fs; sending SIGKILL", child.proc_id, grace_s)
                child.signal_group(signal.SIGKILL)
        await child.done.wait()

    async def stop_all(self, grace_s: float) -> None:
        """Stop every child concurrently; return when all exits have been reported."""
        children = list(self._children.values())
        if children:
            log.info("stopping %d children (grace %.1fs)", len(children), grace_s)
            async with asyncio.TaskGroup() as tg:
                for child in children:
                    tg.create_task(self.stop(child, grace_s))

    # ------------------------------------------------------------------ watching

    async def _watch(self, child: ChildProcess, out_fd: int, err_fd: int) -> None:
        await self._sink.started(child)
        out_reader, out_transport = await _pipe_reader(out_fd)
        err_reader, err_transport = await _pipe_reader(err_fd)
        try:
            async with asyncio.TaskGroup() as pumps:
                out_task = pumps.create_task(pump(out_reader, self._emitter(child, "stdout")))
                err_task = pumps.create_task(pump(err_reader, self._emitter(child, "stderr")))
                returncode = await wait_popen(child.popen)
                # Leftover grandchildren in the group must not outlive the rank.
                child.signal_group(signal.SIGKILL)
                await asyncio.wait({out_task, err_task}, timeout=DRAIN_AFTER_EXIT_S)
                # A process that left the group may hold a pipe open: closing our end
                # feeds EOF to the pump, which then flushes what it has.
                out_transport.close()
                err_transport.close()
        finally:
            out_transport.close()
            err_transport.close()
        await self._report_exit(child, returncode)

    def _emitter(self, child: ChildProcess, stream: str) -> ChunkCallback:
        async def emit(data: bytes) -> None:
            if stream == "stderr":
                child.stderr_tail.feed(data)
            await self._sink.output(child, stream, data)

        return emit

    async def _report_exit(self, child: ChildProcess, returncode: int) -> None:
        signum = -returncode if returncode < 0 else None
        own_kills = child.cage.oom_kills() if child.cage is not None else None
        if own_kills is not None:
            # Its own memory cgroup counts only its tree's kills: an exact answer,
            # also when the OOM killer took a child of it (a data loader) first.
            oom = own_kills > 0 and not child.requested
        else:
            oom = signum == signal.SIGKILL and not child.requested and self._oom.claim_oom_kill()
        if child.cage is not None:
            child.cage.remove()  # the group was SIGKILLed in _watch: empty, or soon
            if self._limits is not None:
                self._limits.forget(child.cage)
        info = ExitInfo(
            proc_id=child.proc_id,
            attempt=child.attempt,
            pid=child.pid,
            exit_code=None if signum is not None else returncode,
            signal=signum,
            runtime_s=round(time.monotonic() - child.started, 3),
            stderr_tail=child.stderr_tail.lines(),
            oom_killed=oom,
            requested=child.requested,
        )
        log.info(
            "%s attempt %d (pid %d) exited: code %s signal %s%s",
            child.proc_id,
            child.attempt,
            child.pid,
            info.exit_code,
            info.signal,
            " (OOM killed)" if oom else "",
        )
        del self._children[child.proc_id]
        self._write_table()
        try:
            await self._sink.exited(child, info)
        finally:
            child.done.set()

    def _write_table(self) -> None:
        try:
            write_table(self._table_path, [c.record() for c in self._children.values()])
        except OSError as exc:
            log.error("cannot write process table %s: %s", self._table_path, exc)
