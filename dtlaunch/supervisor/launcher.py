"""Start one agent per host: a local subprocess (embedded mode) or over asyncssh.

Both launchers hand the agent its ``AgentBootstrap`` (which holds the run's CURVE
client secret) as one JSON line on stdin, never in argv, and report how the
agent ended: ``definite`` when its exit status is known (the process is gone),
not definite when only the SSH channel closed.

Over SSH, one session and one interpreter per host do both steps: ``prepare``
starts ``_PROBE_THEN_AGENT``, which prints what the host has (home, dtlaunch's
version, the workdir) and waits; ``start`` answers with the bootstrap line, on
which the same process becomes the agent. A host that cannot run the agent gets
its stdin closed instead, and the process exits. (Two sessions, a probe and
then the agent, cost a second Python start and SSH session per host: at 256
loopback hosts, 15 s of CPU.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import asyncssh

from dtlaunch.errors import LaunchError, SshError
from dtlaunch.hostfile import HostSpec
from dtlaunch.procwait import wait_popen
from dtlaunch.sshconn import SshOptions, connect, remote_command
from dtlaunch.supervisor.jobstate.failures import signal_name
from dtlaunch.version import __version__
from dtlaunch.wire.codec import to_dict
from dtlaunch.wire.messages import AgentBootstrap

log = logging.getLogger(__name__)

# Seconds for the host's probe to run, and for sshd to open the agent's session.
_SESSION_TIMEOUT_S = 30.0

# What the agent needs on a host, probed before it starts so that a wrong
# python or a missing workdir is a clear error instead of a silent agent; then,
# given a bootstrap line on stdin, the agent itself (an empty line or EOF: exit).
# The agent's modules are imported while the supervisor reads the probe and
# answers (a failed import is raised once the line says to start), with the
# cyclic garbage collector paused: they leave ~24,000 tracked objects that live
# as long as the agent and ~700 of garbage, and the ~60 collections they would
# set off cost ~5 % of an agent's start-up CPU (what a launch of many hosts on
# few cores waits for). Frozen, those objects stay out of later collections.
# The agent speaks ZeroMQ with CURVE, never TLS: ssl, which asyncio imports
# only to offer TLS transports, is kept out of its process (~10 ms of CPU, 8 %
# of the imports; asyncio runs without it as on a Python built without ssl).
_PROBE_MARK = "DTLAUNCH-AGENT-PROBE "
_PROBE_THEN_AGENT = (
    "import json, os, sys\n"
    "out = {'home': os.path.expanduser('~'), 'python': sys.executable}\n"
    "try:\n"
    "    import dtlaunch\n"
    "    out['version'] = dtlaunch.__version__\n"
    "except Exception as err:\n"
    "    out['version'] = ''\n"
    "    out['import_error'] = repr(err)\n"
    "out['workdir_ok'] = os.path.isdir(sys.argv[1])\n"
    f"sys.stdout.write({_PROBE_MARK!r} + json.dumps(out) + '\\n')\n"
    "sys.stdout.flush()\n"
    "failed = None\n"
    "if out['version']:\n"
    "    import gc\n"
    "    gc.disable()\n"
    "    sys.modules.setdefault('ssl', None)\n"
    "    try:\n"
    "        from dtlaunch.agent.__main__ import main\n"
    "    except Exception as err:\n"
    "        failed = err\n"
    "    gc.freeze()\n"
    "    gc.enable()\n"
    "line = sys.stdin.readline()\n"
    "if line.strip():\n"
    "    if failed is not None:\n"
    "        raise failed\n"
    "    from dtlaunch.agent.__main__ import main\n"
    "    sys.exit(main(line))\n"
)
# Lines a login shell may print before the probe's (a motd, a noisy ~/.bashrc).
_MAX_NOISE_LINES = 200


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
    """Remote hosts: one asyncssh connection per host, the agent on an exec channel."""

    def __init__(self, *, options: SshOptions, python: str, workdir: str, run_id: str) -> None:
        self._options = options
        self._python = python
        self._workdir = workdir
        self._run_id = run_id
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}
        # Probed processes waiting for their bootstrap line, by host label.
        self._waiting: dict[str, asyncssh.SSHClientProcess[bytes]] = {}

    async def _connection(self, host: HostSpec) -> asyncssh.SSHClientConnection:
        conn = self._conns.get(host.label)
        if conn is None or conn.is_closed():
            conn = await connect(host, self._options)
            self._conns[host.label] = conn
        return conn

    async def prepare(self, host: HostSpec) -> HostInfo:
        """Start the host's probe-then-agent process and check what it found; the
        process waits for ``start``'s bootstrap line."""
        self._dismiss(host.label)  # an earlier launch's, never started
        try:
            conn = await self._connection(host)
        except SshError as err:
            raise LaunchError(str(err)) from err
        command = remote_command([self._python, "-c", _PROBE_THEN_AGENT, self._workdir])
        proc: asyncssh.SSHClientProcess[bytes] | None = None
        exit_status: int | None = None
        stderr = ""
        try:
            async with asyncio.timeout(_SESSION_TIMEOUT_S):
                proc = await conn.create_process(command, encoding=None)
                probe = await _read_probe(proc)
                if probe is None:  # it ended without a probe line: python did not run
                    exit_status = (await proc.wait()).exit_status
                    stderr = (await proc.stderr.read()).decode("utf-8", "replace")
        except TimeoutError as err:
            if proc is not None:
                _kill(proc)
            raise LaunchError(
                f"{host.label}: the probe of {self._python} did not answer within "
                f"{_SESSION_TIMEOUT_S:g} s. Fix: check the host's load and its sshd (MaxSessions)"
            ) from err
        except (asyncssh.Error, OSError) as err:
            if proc is not None:
                _kill(proc)
            raise LaunchError(f"{host.label}: cannot start the agent over ssh: {err}") from err
        if probe is None:
            problem = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {exit_status}"
            raise LaunchError(
                f"{host.label}: cannot run {self._python} ({problem}). "
                "Fix: pass --python with the interpreter path on the hosts"
            )
        problem = self._refusal(host, probe)
        if problem:
            proc.stdin.write_eof()  # the process exits without becoming an agent
            proc.close()
            raise LaunchError(problem)
        self._waiting[host.label] = proc
        sockname = conn.get_extra_info("sockname")
        addr = str(sockname[0]) if sockname else "127.0.0.1"
        state_dir = f"{probe['home']}/.cache/dtlaunch/runs/{self._run_id}/{host.label}"
        return HostInfo(endpoint_addr=addr, state_dir=state_dir)

    def _refusal(self, host: HostSpec, probe: dict[str, object]) -> str:
        """Why the probed host cannot run the agent, with the fix; "" when it can."""
        if probe.get("version") != __version__:
            found = probe.get("import_error") or f"version {probe.get('version')}"
            return (
                f"{host.label}: dtlaunch {__version__} is not importable by {self._python} "
                f"({found}). Fix: pip install dtlaunch=={__version__} on {host.label}, or "
                "pass --python"
            )
        if not probe.get("workdir_ok"):
            return (
                f"{host.label}: workdir {self._workdir} does not exist. Fix: create it or pass "
                "--workdir (a shared file system is assumed, as with mpirun)"
            )
        return ""

    async def start(self, host: HostSpec, boot: AgentBootstrap, log_path: Path) -> AgentProcess:
        """Hand the prepared host's process its bootstrap: it becomes the agent."""
        proc = self._waiting.pop(host.label, None)
        if proc is None:
            raise LaunchError(f"{host.label}: no prepared agent process to start (prepare() first)")
        try:
            proc.stdin.write(_bootstrap_line(boot))
            proc.stdin.write_eof()
        except (asyncssh.Error, OSError) as err:
            _kill(proc)
            raise LaunchError(f"{host.label}: the agent's ssh session closed: {err}") from err
        pump = asyncio.create_task(_pump_to_file(proc, log_path), name=f"agent-log-{host.label}")
        return SshAgentProcess(proc, pump)

    def _dismiss(self, label: str) -> None:
        proc = self._waiting.pop(label, None)
        if proc is not None:
            with contextlib.suppress(asyncssh.Error, OSError):
                proc.stdin.write_eof()
                proc.close()

    async def close(self) -> None:
        for label in list(self._waiting):
            self._dismiss(label)
        for conn in self._conns.values():
            conn.close()
        for conn in self._conns.values():
            with contextlib.suppress(asyncssh.Error, OSError):
                await conn.wait_closed()
        self._conns.clear()


async def _read_probe(proc: asyncssh.SSHClientProcess[bytes]) -> dict[str, Any] | None:
    """The probe's report, skipping what the login shell printed first; None when
    the output ended without one. Raises OSError on a probe line that is not JSON."""
    for _ in range(_MAX_NOISE_LINES):
        line = (await proc.stdout.readline()).decode("utf-8", "replace")
        if not line:
            return None
        if line.startswith(_PROBE_MARK):
            try:
                report = json.loads(line[len(_PROBE_MARK) :])
            except ValueError as err:
                raise OSError(f"garbled probe line {line[:80]!r}") from err
            if isinstance(report, dict):
                return report
            raise OSError(f"garbled probe line {line[:80]!r}")
    raise OSError(f"no probe line within {_MAX_NOISE_LINES} lines of output")


def _kill(proc: asyncssh.SSHClientProcess[bytes]) -> None:
    # Closing the channel alone leaves the remote command running (no pty, no SIGHUP).
    with contextlib.suppress(asyncssh.Error, OSError):
        proc.send_signal("KILL")
    with contextlib.suppress(asyncssh.Error, OSError):
        proc.close()


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
