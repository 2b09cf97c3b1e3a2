"""``dtlaunch check -H FILE``: a parallel pre-flight of every host of a hostfile.

Each host goes through the stages below, in order; the first failing stage stops
that host (the later ones show "skipped") and its ``fix`` says what to do:

=========  =======================================================================
ssh        the host answers SSH and accepts the login (user, port, key)
host key   its host key is in known_hosts and matches
python     the ``--python`` interpreter exists there and is Python >= 3.11
dtlaunch   ``import dtlaunch`` works there and gives the same version as here
workdir    the ``--workdir`` directory exists there
ports      the host can bind ``ports_needed`` free TCP ports at once
=========  =======================================================================

The remote checks are one ``python -c SNIPPET`` over the SSH connection (one
session per host: each costs the remote login shell's start-up); the snippet
prints one marker line, so output from the user's shell start-up files is ignored.

At most ``--ssh-concurrency`` hosts are checked at once (:mod:`dtlaunch.fanout`);
a host's timeout starts when its turn does. With many hosts the table shows the
failed ones and sums the others up in its title (:func:`render_checks`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import asyncssh
from rich.text import Text

from dtlaunch.config import DEFAULT_SSH_CONCURRENCY, check_concurrency
from dtlaunch.errors import ConfigError, HostCheckError, SshError
from dtlaunch.fanout import fan_out
from dtlaunch.hostfile import HostSpec
from dtlaunch.quantities import format_size
from dtlaunch.sshconn import SshConnectError, SshFailure, SshOptions, connect, run_remote
from dtlaunch.ui.fit import FitTable

__all__ = ["CHECKS", "OK", "SKIPPED", "UNVERIFIED", "HostCheck", "check_hosts", "render_checks"]

logger = logging.getLogger(__name__)

CHECKS = ("ssh", "host key", "python", "dtlaunch", "workdir", "ports", "capacity", "limits")
OK = "ok"
SKIPPED = "skipped"
UNVERIFIED = "NOT verified"  # host key checks were turned off by the user
MIN_PYTHON = (3, 11)
# More hosts than this: the check table shows the failed ones, the rest in one row.
ALL_ROWS_UP_TO = 16
_MARKER = "DTLAUNCH-CHECK "

# One run per host does every remote check (python, dtlaunch, workdir, ports):
# each SSH session costs the remote login shell's start-up, often more than the
# check itself. It runs on any Python 2.7/3.x, so that an old interpreter is
# reported, not a SyntaxError; argv: workdir, ports needed.
_PROBE = """\
import json, os, socket, sys
r = {"python": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    import dtlaunch
    r["dtlaunch"] = str(getattr(dtlaunch, "__version__", "unknown"))
    from dtlaunch.agent.cgroupfind import support_without_changes
    memory, cpu, detail = support_without_changes()
    r["limits"] = {"memory": memory, "cpu": cpu, "detail": detail}
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # what psutil says
    r["capacity"] = {"cpus": len(os.sched_getaffinity(0)), "memory": memory}
except Exception as e:
    r["error"] = "%s: %s" % (type(e).__name__, e)
p = os.path.abspath(os.path.expanduser(sys.argv[1]))
r["workdir"] = {"path": p, "exists": os.path.exists(p), "isdir": os.path.isdir(p),
                "ok": os.path.isdir(p) and os.access(p, os.R_OK | os.X_OK)}
socks = []
try:
    for _ in range(int(sys.argv[2])):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        socks.append(s)
        s.bind(("", 0))
        s.listen(1)
    r["ports"] = {"ports": [s.getsockname()[1] for s in socks]}
except OSError as e:
    r["ports"] = {"error": str(e), "bound": len(socks) - 1}
finally:
    for s in socks:
        s.close()
print("DTLAUNCH-CHECK " + json.dumps(r))
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCheck:
    """The pre-flight result of one host."""

    host: str  # the host's label
    ok: bool
    items: dict[str, str]  # check name (see CHECKS) -> "ok", "skipped" or a short problem
    fix: str  # how to fix the failing check; "" when ok
    version: str = ""  # dtlaunch version found on the host, "" when not reached


@dataclass(slots=True)
class _Progress:
    stage: str = CHECKS[0]
    items: dict[str, str] = field(default_factory=lambda: dict.fromkeys(CHECKS, SKIPPED))
    version: str = ""

    def passed(self, stage: str, value: str = OK) -> None:
        self.items[stage] = value
        following = CHECKS.index(stage) + 1
        if following < len(CHECKS):
            self.stage = CHECKS[following]

    def failed(self, host: str, problem: str, fix: str) -> HostCheck:
        self.items[self.stage] = problem
        return HostCheck(host=host, ok=False, items=self.items, fix=fix, version=self.version)


async def check_hosts(
    hosts: list[HostSpec],
    opts: SshOptions,
    *,
    python: str,
    workdir: str,
    expected_version: str,
    ports_needed: int = 2,
    timeout: float = 20.0,  # noqa: ASYNC109 - a budget per host, not for the whole call
    concurrency: int = DEFAULT_SSH_CONCURRENCY,
) -> list[HostCheck]:
    """Check every host, ``concurrency`` of them at once; results come in the
    order of ``hosts``. A host's ``timeout`` starts when its turn does, not while
    it waits behind other hosts (see :mod:`dtlaunch.fanout`).

    Raises:
        ConfigError: ``python``/``workdir`` empty, ``ports_needed`` < 0, ``timeout``
            <= 0 or ``concurrency`` < 1.
    """
    if not python.strip():
        raise ConfigError("--python is empty; expected the interpreter path to use on the hosts")
    if not workdir.strip():
        raise ConfigError("--workdir is empty; expected a directory that exists on every host")
    if ports_needed < 0:
        raise ConfigError(f"ports_needed is {ports_needed}; expected 0 or more")
    if not timeout > 0:
        raise ConfigError(f"check timeout is {timeout}; expected a number of seconds > 0")
    check_concurrency(concurrency)

    async def one(host: HostSpec) -> HostCheck:
        return await _check_host(
            host,
            opts,
            python=python,
            workdir=workdir,
            expected_version=expected_version,
            ports_needed=ports_needed,
            timeout=timeout,
        )

    return await fan_out(hosts, one, limit=concurrency)


async def _check_host(
    host: HostSpec,
    opts: SshOptions,
    *,
    python: str,
    workdir: str,
    expected_version: str,
    ports_needed: int,
    timeout: float,  # noqa: ASYNC109 - applied with asyncio.timeout below
) -> HostCheck:
    progress = _Progress()
    try:
        async with asyncio.timeout(timeout):
            try:
                conn = await connect(host, opts)
            except SshConnectError as exc:
                return _connect_failed(host, opts, progress, exc)
            async with conn:
                progress.passed("ssh")
                progress.passed("host key", OK if opts.verify_host_keys else UNVERIFIED)
                remote = _Remote(conn=conn, label=host.label, python=python, limit=timeout)
                status, report, err = await remote.probe(_PROBE, workdir, str(ports_needed))
                progress.version = remote.check_python(
                    report, status, err, expected_version, progress
                )
                progress.passed("dtlaunch")
                remote.check_workdir(report, err, workdir)
                progress.passed("workdir")
                remote.check_ports(report, err, ports_needed)
                progress.passed("ports")
                progress.passed("capacity", _check_capacity(host, report))
                limits, degraded = _limits_cell(report)
                progress.passed("limits", limits)
    except HostCheckError as exc:
        return progress.failed(host.label, exc.problem, exc.fix)
    except TimeoutError:
        return progress.failed(
            host.label,
            f"timed out after {timeout:g} s",
            f"the {progress.stage} check of {host.label} took longer than {timeout:g} s; "
            "check the host's load and network, or raise the check timeout",
        )
    except (SshError, asyncssh.Error, OSError) as exc:
        problem = exc.problem if isinstance(exc, SshError) else str(exc) or type(exc).__name__
        fix = exc.fix if isinstance(exc, SshError) else "check that the host is up and reachable"
        return progress.failed(host.label, problem, fix)
    return HostCheck(
        host=host.label, ok=True, items=progress.items, fix=degraded, version=progress.version
    )


def _check_capacity(host: HostSpec, report: dict[str, object] | None) -> str:
    """The CPUs and memory the host has ("8 cpu, 31.2G"); a hostfile that declares
    more (cpus=, mem=) fails: each process's limits would promise what is not there."""
    found = report.get("capacity") if report else None
    if not isinstance(found, dict):
        return "unknown"
    cpus, memory = int(found.get("cpus", 0)), int(found.get("memory", 0))
    over = []
    if host.cpus and cpus and host.cpus > cpus:
        over.append(f"cpus={host.cpus:g} but {host.label} has {cpus}")
    if host.memory_bytes and memory and host.memory_bytes > memory:
        over.append(
            f"mem={format_size(host.memory_bytes)} but {host.label} has {format_size(memory)}"
        )
    if over:
        raise HostCheckError(
            f"declares more: {'; '.join(over)}"[:60],
            f"the hostfile declares {' and '.join(over)}; lower cpus=/mem= on that line or "
            "leave them out (then the agent measures the memory)",
        )
    return f"{cpus} cpu, {memory / (1 << 30):.1f}G"


def _limits_cell(report: dict[str, object] | None) -> tuple[str, str]:
    """How the host's agent will enforce --memory-limit/--cpu-limit, and (when it
    cannot use cgroups) why and what would let it; never a failure: the limits
    degrade to RLIMIT_AS and CPU affinity."""
    found = report.get("limits") if report else None
    if not isinstance(found, dict):
        return "unknown", ""
    memory, cpu = str(found.get("memory", "")), str(found.get("cpu", ""))
    cell = memory if memory == cpu else f"mem {memory}, cpu {cpu}"
    cgroups = memory.startswith("cgroup") and cpu.startswith("cgroup")
    return cell, "" if cgroups else f"limits: {found.get('detail', '')}"


def _connect_failed(
    host: HostSpec, opts: SshOptions, progress: _Progress, exc: SshConnectError
) -> HostCheck:
    """Put a connection failure in its column: the host key one, or ssh."""
    if exc.kind.is_host_key:
        progress.passed("ssh")  # the server answered; only its identity is in doubt
        short = {
            SshFailure.HOST_KEY_UNKNOWN: "unknown (not in known_hosts)",
            SshFailure.HOST_KEY_CHANGED: "CHANGED (does not match known_hosts)",
            SshFailure.HOST_KEY_REVOKED: "revoked",
        }[exc.kind]
        return progress.failed(host.label, short, exc.fix)
    if exc.kind is SshFailure.AUTH:
        # Authentication comes after key exchange, which verified the host key.
        progress.items["host key"] = OK if opts.verify_host_keys else UNVERIFIED
        return progress.failed(host.label, f"auth failed (user {exc.user})", exc.fix)
    short = {
        SshFailure.REFUSED: f"refused (port {exc.port})",
        SshFailure.TIMEOUT: "no answer (timeout)",
        SshFailure.DNS: "unknown host name",
        SshFailure.UNREACHABLE: "unreachable",
        SshFailure.PROTOCOL: "not an SSH server?",
        SshFailure.CLIENT_KEY: "client key unusable",
        SshFailure.CONFIG: "bad ssh config",
    }.get(exc.kind, "connection failed")
    # For these the short cell loses which file or what reason; the fix needs it.
    detailed = exc.kind in (SshFailure.CLIENT_KEY, SshFailure.CONFIG, SshFailure.DISCONNECTED)
    return progress.failed(host.label, short, f"{exc.problem}. {exc.fix}" if detailed else exc.fix)


def _version_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(".")[:2])
    except ValueError:
        return (0,)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Remote:
    """Runs the probe snippets with the host's ``--python``; raises HostCheckError."""

    conn: asyncssh.SSHClientConnection
    label: str
    python: str
    limit: float  # seconds per probe; the whole host check has its own budget too

    async def probe(self, *args: str) -> tuple[int, dict[str, object] | None, str]:
        """(exit status, the probe's marker JSON or None, last stderr line)."""
        argv = [self.python, "-c", *args]
        status, out, err = await run_remote(self.conn, argv, timeout=self.limit)
        report: dict[str, object] | None = None
        for line in out.splitlines():
            if line.startswith(_MARKER):
                try:
                    report = json.loads(line[len(_MARKER) :])
                except ValueError:
                    report = None
        lines = err.strip().splitlines()
        return status, report, lines[-1] if lines else ""

    def check_python(
        self,
        report: dict[str, object] | None,
        status: int,
        err: str,
        expected_version: str,
        progress: _Progress,
    ) -> str:
        """Check the interpreter, then dtlaunch in it; return dtlaunch's version there."""
        python = self.python
        use_other = f"pass --python with the path of a Python >= 3.11 that exists on {self.label}"
        if report is None:
            if status == 127 or "No such file" in err or "not found" in err:
                raise HostCheckError(f"not found: {python}", f"install Python there or {use_other}")
            if status == 126:
                raise HostCheckError(
                    f"not executable: {python}", f"fix its permissions or {use_other}"
                )
            raise HostCheckError(
                f"failed (exit {status}): {err[:60]}",
                f"run `{python} -c 'import sys'` on {self.label} to see why; or {use_other}",
            )
        found = str(report.get("python", "0"))
        if _version_tuple(found) < MIN_PYTHON:
            raise HostCheckError(
                f"Python {found} is too old", f"dtlaunch needs Python >= 3.11: {use_other}"
            )
        progress.passed("python")
        install = f"`{python} -m pip install dtlaunch=={expected_version}` on {self.label}"
        if "error" in report:
            raise HostCheckError(
                f"not importable ({str(report['error'])[:50]})",
                f"install dtlaunch {expected_version} for that interpreter: {install}",
            )
        version = str(report.get("dtlaunch", ""))
        if version != expected_version:
            progress.version = version
            raise HostCheckError(
                f"version {version} != {expected_version} here",
                f"install the same version everywhere: {install}",
            )
        return version

    def check_workdir(self, report: dict[str, object] | None, err: str, workdir: str) -> None:
        found = report.get("workdir") if report else None
        if not isinstance(found, dict):
            raise HostCheckError(
                f"probe failed: {err[:60]}", f"run {self.python} on {self.label} to see why"
            )
        if not found.get("ok"):
            path = found.get("path", workdir)
            if not found.get("exists"):
                state = "missing"
            elif not found.get("isdir"):
                state = "not a directory"
            else:
                state = "not accessible"
            raise HostCheckError(
                f"{state}: {path}",
                f"create it on {self.label} (`mkdir -p {path}`) or pass --workdir with a "
                "directory that exists on every host",
            )

    def check_ports(self, report: dict[str, object] | None, err: str, ports_needed: int) -> None:
        if ports_needed == 0:
            return
        found = report.get("ports") if report else None
        ports = found.get("ports") if isinstance(found, dict) else None
        if not isinstance(ports, list) or len(ports) != ports_needed:
            reason = str(found.get("error", "")) if isinstance(found, dict) else err
            raise HostCheckError(
                f"cannot bind {ports_needed} ports: {reason[:50]}",
                f"free some TCP ports on {self.label} or widen net.ipv4.ip_local_port_range",
            )


def _cell(value: str) -> Text:
    if value == OK or value.startswith("cgroup"):
        return Text(value, style="green")
    if "rlimit" in value or "affinity" in value:
        return Text(value, style="yellow")  # limits hold, less exactly: not a failure
    if value == SKIPPED:
        return Text(value, style="dim")
    if value == UNVERIFIED:
        return Text(value, style="bold yellow")
    return Text(value, style="red")


def render_checks(results: list[HostCheck]) -> FitTable:
    """A row per host, a column per check, then status and fix; in a narrow
    terminal an entry per host with its fix below (see :class:`FitTable`).

    Beyond ``ALL_ROWS_UP_TO`` hosts only the failed ones get a row, and one
    last row sums up those that passed (each column: the values they show)."""
    failed = [r for r in results if not r.ok]
    passed = [r for r in results if r.ok]
    summed = len(results) > ALL_ROWS_UP_TO and len(passed) > 1
    title = f"dtlaunch check: {len(passed)} of {len(results)} hosts OK"
    if summed and failed:
        title += f"; the {len(failed)} that failed first"
    table = FitTable(
        title=title,
        columns=("host", *CHECKS, "status"),
        long_header="fix",
        no_wrap=frozenset({"host", "status"}),
    )
    for result in failed if summed else results:
        status = Text("OK", style="bold green") if result.ok else Text("FAIL", style="bold red")
        table.add_row(
            Text(result.host, style="bold"),
            *(_cell(result.items.get(name, SKIPPED)) for name in CHECKS),
            status,
            long=result.fix,
        )
    if summed:
        others = "other " if failed else ""
        table.add_row(
            Text(f"{len(passed)} {others}hosts", style="bold"),
            *(_summed_cell([r.items.get(name, SKIPPED) for r in passed]) for name in CHECKS),
            Text("OK", style="bold green"),
            long="",
        )
    return table


def _summed_cell(values: list[str]) -> Text:
    """The distinct values of one column over many hosts, the most frequent first."""
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    if len(counts) == 1:
        return _cell(values[0])
    text = Text()
    for index, (value, count) in enumerate(sorted(counts.items(), key=lambda kv: -kv[1])):
        if index:
            text.append(", ")
        text.append_text(_cell(value))
        text.append(f" x{count}")
    return text
