"""Start one agent per host: a local subprocess (embedded mode) or over asyncssh.

Both launchers hand the agent its ``AgentBootstrap`` (which holds the run's CURVE
client secret) as one JSON line on stdin, never in argv, and report how the
agent ended: ``definite`` when its exit status is known (the process is gone),
not definite when only the SSH channel closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import asyncssh

from dtlaunch.errors import LaunchError, SshError
from dtlaunch.hostfile import HostSpec
from dtlaunch.procwait import wait_popen
from dtlaunch.sshconn import SshOptions, connect, run_remote
from dtlaunch.supervisor.jobstate.failures import signal_name
from dtlaunch.version import __version__
from dtlaunch.wire.codec import to_dict
from dtlaunch.wire.messages import AgentBootstrap

log = logging.getLogger(__name__)

# Seconds for the host's probe to run, and for sshd to open the agent's session.
_SESSION_TIMEOUT_S = 30.0

# What the agent needs on a host, probed before it starts so that a wrong
# python or a missing workdir is a clear error instead of a silent agent.
_PROBE = (
    "import json, os, sys\n"
    "out = {'home': os.path.expanduser('~'), 'python': sys.executable}\n"
    "try:\n"
    "    import dtlaunch\n"
    "    out['version'] = dtlaunch.__version__\n"
    "except Exception as err:\n"
    "    out['version'] = ''\n"
    "    out['import_error'] = repr(err)\n"
    "out['workdir_ok'] = os.path.isdir(sys.argv[1])\n"
    "print(json.dumps(out))\n"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentExit:
    definite: bool
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HostInfo:
    endpoint_addr: str  # the address this host reaches the supervisor at
    state_dir: str  # absolute path of the agent's folder on that host


class AgentProcess(Protocol):
    async def wait(self) -> AgentExit: ...
    async def terminate(self) -> None: ...


class Launcher(Protocol):
    async def prepare(self, host: HostSpec) -> HostInfo: ...
    async def start(self, host: HostSpec, boot: AgentBootstrap, log_path: Path) -> AgentProcess: ...
    async def close(self) -> None: ...


def _bootstrap_line(boot: AgentBootstrap) -> bytes:
    return (json.dumps(to_dict(boot)) + "\n").encode()


# ------------------------------------------------------------------ local


class LocalAgentProcess:
    def __init__(self, popen: subprocess.Popen[bytes], log_file: IO[bytes]) -> None:
        self._popen = popen
        self._log_file = log_file

    async def wait(self) -> AgentExit:
        try:
            code = await wait_popen(self._popen)
        finally:
            self._log_file.close()
        if code < 0:
            return AgentExit(definite=True, detail=f"killed by {signal_name(-code)}")
        return AgentExit(definite=True, detail=f"exit code {code}")

    async def terminate(self) -> None:
        """Last resort when an agent ignored Shutdown: SIGTERM, then SIGKILL."""
        if self._popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._popen.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(wait_popen(self._popen), timeout=5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()
            await wait_popen(self._popen)


def _start_local_agent(
    python: str, log_file: IO[bytes], bootstrap: bytes
) -> subprocess.Popen[bytes]:
    """Fork the agent and hand it its bootstrap (a few hundred bytes: no blocking).

    A plain Popen, not asyncio's subprocess transport, which would kill a still
    running agent when collected: after a supervisor failure the agent must live
    on (``--orphan-timeout``) so that ``--resume`` finds the job running.
    """
    popen = subprocess.Popen(
        [python, "-m", "dtlaunch.agent"],
        stdin=subprocess.PIPE,
        stdout=log_file,
        stderr=log_file,
        # Its own session: a Ctrl-C at the terminal reaches only the supervisor,
        # which then stops the job in order.
        start_new_session=True,
    )
    assert popen.stdin is not None
    try:
        with popen.stdin:
            popen.stdin.write(bootstrap)
    except BrokenPipeError:
        # It started and died at once (killed in its first instant): that is an
        # agent that died, which its exit reports and the node table retries,
        # not a launch that can never work.
        log.warning("the local agent (pid %d) died before it read its bootstrap", popen.pid)
    return popen


class LocalLauncher:
    """Embedded mode: the agent is a child process of the supervisor."""

    def __init__(self, *, python: str, agents_dir: Path) -> None:
        self._python = python
        self._agents_dir = agents_dir

    async def prepare(self, host: HostSpec) -> HostInfo:
        state_dir = self._agents_dir / host.label
        return HostInfo(endpoint_addr="127.0.0.1", state_dir=str(state_dir))

    async def start(self, host: HostSpec, boot: AgentBootstrap, log_path: Path) -> AgentProcess:
        log_file = log_path.open("ab")
        try:
            popen = _start_local_agent(self._python, log_file, _bootstrap_line(boot))
        except OSError as err:
            log_file.close()
            raise LaunchError(f"cannot start the local agent with {self._python}: {err}") from err
        return LocalAgentProcess(popen, log_file)

    async def close(self) -> None:
        return None


# -------------------------------------------------------------------- ssh


class SshAgentProcess:
    def __init__(self, proc: asyncssh.SSHClientProcess[bytes], pump: asyncio.Task[None]) -> None:
        self._proc = proc
        self._pump = pump

    async def wait(self) -> AgentExit:
        try:
            result = await self._proc.wait()
        except asyncio.CancelledError:
            self._pump.cancel()
            raise
        except (asyncssh.Error, OSError) as err:
            await self._drain()
            return AgentExit(definite=False, detail=f"ssh channel lost: {err}")
        await self._drain()
        if result.exit_signal:
            name = result.exit_signal[0]
            return AgentExit(definite=True, detail=f"killed by SIG{name}")
        if result.exit_status is None or result.exit_status < 0:
            return AgentExit(definite=False, detail="ssh channel closed without an exit status")
        return AgentExit(definite=True, detail=f"exit code {result.exit_status}")

    async def _drain(self) -> None:
        """Let the log pump copy what the channel still holds, but not forever."""
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._pump, timeout=5.0)

    async def terminate(self) -> None:
        # The agent runs without a pty, so closing the channel does not signal it;
        # ask sshd to deliver SIGTERM (OpenSSH supports the "signal" request).
        with contextlib.suppress(asyncssh.Error, OSError):
            self._proc.send_signal("TERM")
        with contextlib.suppress(asyncssh.Error, OSError):
            self._proc.close()


class SshLauncher:
    """Remote hosts: one asyncssh connection per host, agent on an exec channel."""

    def __init__(self, *, options: SshOptions, python: str, workdir: str, run_id: str) -> None:
        self._options = options
        self._python = python
        self._workdir = workdir
        self._run_id = run_id
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}

    async def _connection(self, host: HostSpec) -> asyncssh.SSHClientConnection:
        conn = self._conns.get(host.label)
        if conn is None or conn.is_closed():
            conn = await connect(host, self._options)
            self._conns[host.label] = conn
        return conn

    async def prepare(self, host: HostSpec) -> HostInfo:
        try:
            conn = await self._connection(host)
            status, out, stderr = await run_remote(
                conn, [self._python, "-c", _PROBE, self._workdir], timeout=_SESSION_TIMEOUT_S
            )
        except SshError as err:
            raise LaunchError(str(err)) from err
        if status != 0:
            problem = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {status}"
            raise LaunchError(
                f"{host.label}: cannot run {self._python} ({problem}). "
                "Fix: pass --python with the interpreter path on the hosts"
            )
        probe = json.loads(out.strip().splitlines()[-1])
        if probe.get("version") != __version__:
            found = probe.get("import_error") or f"version {probe.get('version')}"
            raise LaunchError(
                f"{host.label}: dtlaunch {__version__} is not importable by {self._python} "
                f"({found}). Fix: pip install dtlaunch=={__version__} on {host.label}, or "
                "pass --python"
            )
        if not probe.get("workdir_ok"):
            raise LaunchError(
                f"{host.label}: workdir {self._workdir} does not exist. Fix: create it or pass "
                "--workdir (a shared file system is assumed, as with mpirun)"
            )
        sockname = conn.get_extra_info("sockname")
        addr = str(sockname[0]) if sockname else "127.0.0.1"
        state_dir = f"{probe['home']}/.cache/dtlaunch/runs/{self._run_id}/{host.label}"
        return HostInfo(endpoint_addr=addr, state_dir=state_dir)

    async def start(self, host: HostSpec, boot: AgentBootstrap, log_path: Path) -> AgentProcess:
        conn = await self._connection(host)
        command = shlex.join([self._python, "-m", "dtlaunch.agent"])
        try:
            async with asyncio.timeout(_SESSION_TIMEOUT_S):
                proc = await conn.create_process(command, encoding=None)
        except TimeoutError as err:
            raise LaunchError(
                f"{host.label}: sshd opened no session for the agent within "
                f"{_SESSION_TIMEOUT_S:g} s. Fix: check the host's load and its sshd (MaxSessions)"
            ) from err
        except (asyncssh.Error, OSError) as err:
            raise LaunchError(f"{host.label}: cannot start the agent over ssh: {err}") from err
        proc.stdin.write(_bootstrap_line(boot))
        proc.stdin.write_eof()
        pump = asyncio.create_task(_pump_to_file(proc, log_path), name=f"agent-log-{host.label}")
        return SshAgentProcess(proc, pump)

    async def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        for conn in self._conns.values():
            with contextlib.suppress(asyncssh.Error, OSError):
                await conn.wait_closed()
        self._conns.clear()


async def _pump_to_file(proc: asyncssh.SSHClientProcess[bytes], path: Path) -> None:
    """Copy the remote agent's stdout+stderr into logs/agent-<host>.log."""
    with path.open("ab") as sink:

        async def copy(stream: asyncssh.SSHReader[bytes]) -> None:
            with contextlib.suppress(asyncssh.Error, OSError):
                while chunk := await stream.read(65536):
                    sink.write(chunk)
                    sink.flush()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(copy(proc.stdout))
            tg.create_task(copy(proc.stderr))
