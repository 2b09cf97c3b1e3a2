"""Bringing up the agent of one host: prepare the host, hand the agent its
bootstrap, start it, and remember it in the run directory.

``AgentStarter`` is the supervisor's one view of the launchers (``launcher``):
it knows each host's spec, where that host reaches the supervisor, and the
agent's folder there. At most ``--ssh-concurrency`` hosts are being prepared
and started at once (``turn``, :mod:`dtlaunch.fanout`). Every agent it starts
is written to ``hosts.json`` before ``start`` returns, so that a supervisor
resumed after a crash knows whose reconnection to wait for (and what endpoints
its own restarted processes must be told); agents started together share one
write of the file (a group commit: 256 hosts, not 256 rewrites of a growing file).
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from dtlaunch.config import JobSpec
from dtlaunch.fanout import FanOut
from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.environment import LaunchContext
from dtlaunch.supervisor.jobstate.failures import last_exception_line
from dtlaunch.supervisor.launcher import AgentProcess, HostInfo, Launcher
from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.wire.keys import RunKeys
from dtlaunch.wire.messages import AgentBootstrap

__all__ = ["AgentStarter"]


class AgentStarter:
    def __init__(
        self,
        *,
        spec: JobSpec,
        hosts: list[HostSpec],
        launcher: Launcher,
        launch_ctx: LaunchContext,
        keys: RunKeys,
        run: RunDir,
        router_port: int,
    ) -> None:
        self._spec = spec
        self._hosts = {h.label: h for h in hosts}
        self._launcher = launcher
        self._ctx = launch_ctx
        self._keys = keys
        self._run = run
        self._router_port = router_port
        # The agents a (possibly earlier) supervisor of this run started: a
        # resumed supervisor adopts them instead of preparing their hosts again.
        self._known = run.hosts()
        self._gate = FanOut(spec.ssh_concurrency)
        self._unwritten = False  # _known holds agents hosts.json does not yet
        self._writing = asyncio.Lock()
        self._booting: dict[str, asyncio.Event] = {}  # started, not yet said Hello
        for label, info in self._known.items():
            launch_ctx.endpoints[label] = info["endpoint"]
            launch_ctx.state_dirs[label] = info["state_dir"]

    @property
    def started_before(self) -> set[str]:
        """Hosts whose agents were started by this run's earlier supervisor."""
        return set(self._known)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait until fewer than ``--ssh-concurrency`` hosts are being launched;
        hold one of those turns for the body."""
        async with self._gate.turn():
            yield

    async def prepare(self, label: str) -> HostInfo:
        """Probe the host and make the agent's folder there.

        Raises:
            DtlaunchError: the host cannot be reached or cannot run the agent.
        """
        info = await self._launcher.prepare(self._hosts[label])
        self._ctx.endpoints[label] = f"tcp://{info.endpoint_addr}:{self._router_port}"
        self._ctx.state_dirs[label] = info.state_dir
        return info

    async def start(self, label: str, info: HostInfo) -> AgentProcess:
        """Start the agent of a prepared host and record it in the run directory.

        Raises:
            DtlaunchError: the agent could not be started.
        """
        host = self._hosts[label]
        self._booting[label] = asyncio.Event()  # set by said_hello, even during start
        try:
            proc = await self._launcher.start(host, self._bootstrap(host, info), self._log(label))
        except BaseException:
            self._booting.pop(label, None)
            raise
        # Only agents recorded here are waited for by a resumed supervisor.
        self._known[label] = {
            "endpoint": self._ctx.endpoints[label],
            "state_dir": self._ctx.state_dirs[label],
        }
        await self._write_hosts()
        return proc

    def said_hello(self, label: str) -> None:
        """The agent of ``label`` connected back: its launch is over."""
        event = self._booting.get(label)
        if event is not None:
            event.set()

    async def until_up(self, label: str, exited: asyncio.Future[Any], limit: float) -> None:
        """Wait until the agent started by ``start`` said Hello, its process ended
        (``exited`` done) or ``limit`` seconds passed: until then its host's launch
        holds its turn, so that the turns bound the agents booting side by side, not
        only the SSH sessions. Cancelled, it cancels ``exited`` too."""
        event = self._booting.get(label)
        if event is None:
            return
        hello = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({hello, exited}, timeout=limit, return_when=FIRST_COMPLETED)
        except asyncio.CancelledError:
            exited.cancel()
            raise
        finally:
            hello.cancel()
            self._booting.pop(label, None)

    async def died(self, label: str, detail: str) -> str:
        """``detail`` of an agent's exit, with the last line it printed (a
        traceback's last line says why) and where its whole log is."""
        path = self._log(label)
        last = await asyncio.to_thread(_last_line, path)
        return f"{detail}; its last output: {last}; whole log: {path}" if last else detail

    async def _write_hosts(self) -> None:
        """Return once hosts.json holds every agent known so far. One write at a
        time, off the event loop; whoever gets the lock writes what all the
        waiting callers added, and they find nothing left to write."""
        self._unwritten = True
        async with self._writing:
            if self._unwritten:
                self._unwritten = False
                await asyncio.to_thread(self._run.write_hosts, dict(self._known))

    async def close(self) -> None:
        await self._launcher.close()

    def _log(self, label: str) -> Path:
        return self._run.logs / f"agent-{label}.log"

    def _bootstrap(self, host: HostSpec, info: HostInfo) -> AgentBootstrap:
        spec, keys = self._spec, self._keys
        return AgentBootstrap(
            run_id=spec.run_id,
            host=host.label,
            endpoint=self._ctx.endpoints[host.label],
            server_public=keys.server.public.decode(),
            client_public=keys.client.public.decode(),
            client_secret=keys.client.secret.decode(),
            state_dir=info.state_dir,
            heartbeat_interval=spec.heartbeat_interval,
            dead_after=spec.dead_after,
            orphan_timeout=spec.orphan_timeout,
            kill_grace=spec.kill_grace,
            limits_via=spec.limits_via,
        )


_TAIL_BYTES = 4096  # read from a log's end to find its last line
_LINE_CHARS = 300  # a longer last line is cut


def _last_line(path: Path) -> str:
    """The exception line of a traceback at the end of ``path``, else its last
    non-empty line ("" when there is none or it cannot be read): an import that
    fails can be followed by lines a person would not look for the cause in."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, 2) - _TAIL_BYTES))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    last = last_exception_line(lines) or lines[-1]
    return last if len(last) <= _LINE_CHARS else last[: _LINE_CHARS - 3] + "..."
