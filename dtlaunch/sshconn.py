"""SSH connections to the hosts of a hostfile, with errors that say what to fix.

The supervisor reaches every host with asyncssh, talking to the host's OpenSSH
server. ``~/.ssh/config`` (or the files given) is honoured: ``Host`` blocks,
``HostName``, ``Port``, ``User``, ``IdentityFile``, ``IdentitiesOnly``,
``UserKnownHostsFile``, ``ProxyJump`` and the other options asyncssh supports. A
user or port written in the hostfile wins over the ssh config, as with ``ssh -p``.

Host keys are always checked against known_hosts, unless the user opts out
explicitly (``verify_host_keys=False``), which is logged as a WARNING on every
connection. A ``UserKnownHostsFile none`` in an ssh config does *not* turn
verification off here: it only means that no host is known.

Every failure is an :class:`SshConnectError` (an :class:`~dtlaunch.errors.SshError`)
whose ``kind`` tells refused / timeout / DNS / unknown or changed host key / auth apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import asyncssh

from dtlaunch.errors import ConfigError, SshConnectError, SshError, SshFailure
from dtlaunch.hostfile import HostSpec

__all__ = [
    "ENV_SSH_CONFIG",
    "ENV_SSH_KNOWN_HOSTS",
    "SshConnectError",
    "SshFailure",
    "SshOptions",
    "connect",
    "remote_command",
    "run_remote",
    "ssh_options_from_env",
]

logger = logging.getLogger(__name__)

ENV_SSH_CONFIG = "DTLAUNCH_SSH_CONFIG"  # one or more ssh_config paths, os.pathsep-separated
ENV_SSH_KNOWN_HOSTS = "DTLAUNCH_SSH_KNOWN_HOSTS"  # a known_hosts file used instead of the config's

_DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
_DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
_DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
_SSH_PORT = 22
# Missed keepalives before a host counts as dead (OpenSSH's ServerAliveCountMax default).
_KEEPALIVE_COUNT_MAX = 3
# Seconds to wait for a timed-out remote command's channel to close.
_CLOSE_GRACE = 1.0
_UNREACHABLE_ERRNOS = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EADDRNOTAVAIL)


@dataclass(frozen=True, slots=True, kw_only=True)
class SshOptions:
    """How to reach hosts; the same for every host of a job."""

    config_paths: tuple[Path, ...] = ()  # empty -> ~/.ssh/config if it exists
    known_hosts: Path | None = None  # None -> whatever the ssh config / ~/.ssh/known_hosts says
    verify_host_keys: bool = True  # False only via an explicit CLI opt-out; warned loudly
    connect_timeout: float = 10.0  # seconds for TCP connect + handshake + authentication
    keepalive_interval: float = 5.0  # seconds; a host silent for 3 intervals is dead

    def __post_init__(self) -> None:
        if not self.connect_timeout > 0:
            raise ConfigError(
                f"ssh connect timeout is {self.connect_timeout}; expected a number of seconds > 0"
            )
        if not self.keepalive_interval > 0:
            raise ConfigError(
                f"ssh keepalive interval is {self.keepalive_interval}; "
                "expected a number of seconds > 0"
            )


def ssh_options_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    verify_host_keys: bool = True,
    connect_timeout: float = 10.0,
) -> SshOptions:
    """Build :class:`SshOptions` from ``DTLAUNCH_SSH_CONFIG`` / ``DTLAUNCH_SSH_KNOWN_HOSTS``.

    ``verify_host_keys`` is a parameter, not an environment variable, on purpose: turning
    host key checks off must be an explicit command-line choice.

    Raises:
        ConfigError: a named file does not exist.
    """
    env = os.environ if environ is None else environ
    config_paths: list[Path] = []
    for item in env.get(ENV_SSH_CONFIG, "").split(os.pathsep):
        if not item.strip():
            continue
        path = Path(item.strip()).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{ENV_SSH_CONFIG} names {path}, which is not a file; "
                "fix the path or unset the variable to use ~/.ssh/config"
            )
        config_paths.append(path)
    known_hosts: Path | None = None
    if env.get(ENV_SSH_KNOWN_HOSTS, "").strip():
        known_hosts = Path(env[ENV_SSH_KNOWN_HOSTS].strip()).expanduser()
        if not known_hosts.is_file():
            raise ConfigError(
                f"{ENV_SSH_KNOWN_HOSTS} names {known_hosts}, which is not a file; "
                "fix the path or unset the variable to use the ssh config's known_hosts"
            )
    return SshOptions(
        config_paths=tuple(config_paths),
        known_hosts=known_hosts,
        verify_host_keys=verify_host_keys,
        connect_timeout=connect_timeout,
    )


@dataclass(slots=True)
class _KnownHostsLookup:
    """known_hosts matcher handed to asyncssh; remembers what matched, to explain failures."""

    configured: list[str]  # missing files are fine: they hold no keys, as with OpenSSH
    trusted: int = 0

    @property
    def files(self) -> list[str]:
        return [name for name in self.configured if os.path.isfile(name)]

    def __call__(
        self, host: str, addr: str, port: int | None
    ) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]:
        host_keys: list[asyncssh.SSHKey] = []
        ca_keys: list[asyncssh.SSHKey] = []
        revoked: list[asyncssh.SSHKey] = []
        for name in self.files:
            found_keys, found_cas, found_revoked, *_x509 = _parsed_known_hosts(name).match(
                host, addr, port
            )
            host_keys += found_keys
            ca_keys += found_cas
            revoked += found_revoked
        self.trusted = len(host_keys) + len(ca_keys)
        return host_keys, ca_keys, revoked


# known_hosts file -> ((mtime_ns, size), parsed): parsed once for the hosts of a
# fan-out, not once per host (256 hosts: 256 parses of a 256-line file), and
# again whenever the file changes.
_KNOWN_HOSTS_CACHE: dict[str, tuple[tuple[int, int], asyncssh.SSHKnownHosts]] = {}


def _parsed_known_hosts(name: str) -> asyncssh.SSHKnownHosts:
    stat = os.stat(name)
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _KNOWN_HOSTS_CACHE.get(name)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    known = asyncssh.SSHKnownHosts()
    known.load(Path(name).read_text(encoding="utf-8", errors="replace"))
    _KNOWN_HOSTS_CACHE[name] = (stamp, known)
    return known


@dataclass(frozen=True, slots=True, kw_only=True)
class _Target:
    """Where a host's connection really goes, after the ssh config was applied."""

    label: str
    hostname: str
    port: int
    user: str
    identities: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def dash_p(self) -> str:
        return "" if self.port == _SSH_PORT else f"-p {self.port} "

    def fail(self, kind: SshFailure, problem: str, fix: str) -> SshConnectError:
        return SshConnectError(self.label, problem, fix, kind=kind, user=self.user, port=self.port)


def _config_paths(label: str, opts: SshOptions) -> list[str]:
    if opts.config_paths:
        missing = [str(p) for p in opts.config_paths if not p.expanduser().is_file()]
        if missing:
            raise SshConnectError(
                label,
                f"ssh config file {', '.join(missing)} not found",
                "fix the --ssh-config / DTLAUNCH_SSH_CONFIG path",
                kind=SshFailure.CONFIG,
            )
        return [str(p.expanduser()) for p in opts.config_paths]
    default = _DEFAULT_SSH_CONFIG.expanduser()
    return [str(default)] if os.access(default, os.R_OK) else []


def _known_hosts_files(
    opts: SshOptions, resolved: asyncssh.SSHClientConnectionOptions
) -> list[str]:
    """The known_hosts files to check, as OpenSSH picks them; the first is where keys go."""
    if opts.known_hosts is not None:
        return [str(opts.known_hosts.expanduser())]
    names: list[str] = []
    for option, default in (
        ("UserKnownHostsFile", _DEFAULT_USER_KNOWN_HOSTS),
        ("GlobalKnownHostsFile", _DEFAULT_GLOBAL_KNOWN_HOSTS),
    ):
        # Absent: OpenSSH's defaults. `none` (an empty list): no file, so no host is known
        # from it -- verification stays on, unlike asyncssh's reading of `none`.
        value = cast(Sequence[str] | None, resolved.config.get(option, None))
        names.extend(default if value is None else [str(name) for name in value])
    return [str(Path(name).expanduser()) for name in names]


async def _resolve(
    host: HostSpec, opts: SshOptions, config: list[str]
) -> asyncssh.SSHClientConnectionOptions:
    """Apply the ssh config to this host, the hostfile's user/port winning."""
    try:
        options = await asyncssh.SSHClientConnectionOptions.construct(
            None,
            config=config,
            host=host.hostname,
            port=host.port if host.port is not None else (),
            username=host.user if host.user is not None else (),
        )
        return cast(asyncssh.SSHClientConnectionOptions, options)
    except FileNotFoundError as exc:
        raise SshConnectError(
            host.label,
            f"{exc.filename}, named by the ssh config ({', '.join(config)}), does not exist",
            f"fix or remove that IdentityFile line, or create it: `ssh-keygen -f {exc.filename}`",
            kind=SshFailure.CLIENT_KEY,
        ) from exc
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
        raise SshConnectError(
            host.label,
            f"cannot load a private key named by IdentityFile in {', '.join(config)}: {exc}",
            "fix the IdentityFile lines of your ssh config; for a passphrase-protected key "
            "load it into ssh-agent with `ssh-add KEYFILE`",
            kind=SshFailure.CLIENT_KEY,
        ) from exc
    except (OSError, ValueError) as exc:
        raise SshConnectError(
            host.label,
            f"cannot use ssh config {', '.join(config) or '(none)'}: {exc}",
            "fix the ssh config file (try `ssh -G HOST` to see how OpenSSH reads it)",
            kind=SshFailure.CONFIG,
        ) from exc


async def connect(host: HostSpec, opts: SshOptions) -> asyncssh.SSHClientConnection:
    """Open an authenticated SSH connection to ``host``; the caller closes it.

    Raises:
        SshConnectError: with ``kind`` saying what failed and ``fix`` how to fix it.
    """
    config = _config_paths(host.label, opts)
    resolved = await _resolve(host, opts, config)
    identities = tuple(
        str(i) for i in cast(Sequence[object], resolved.config.get("IdentityFile", ()) or ())
    )
    target = _Target(
        label=host.label,
        hostname=str(resolved.host),
        port=int(resolved.port),
        user=str(resolved.username),
        identities=identities,
    )
    lookup = _KnownHostsLookup(configured=_known_hosts_files(opts, resolved))
    if not opts.verify_host_keys:
        logger.warning(
            "HOST KEY VERIFICATION IS OFF for %s (%s): anyone on the network path can "
            "impersonate this host and read the job's keys and data",
            host.label,
            target,
        )
    try:
        # The options the ssh config resolved to: asyncssh does not parse it again.
        return await asyncssh.connect(
            host.hostname,
            port=host.port if host.port is not None else (),
            username=host.user if host.user is not None else (),
            options=resolved,
            known_hosts=lookup if opts.verify_host_keys else None,
            connect_timeout=opts.connect_timeout,
            keepalive_interval=opts.keepalive_interval,
            keepalive_count_max=_KEEPALIVE_COUNT_MAX,
        )
    except asyncssh.HostKeyNotVerifiable as exc:
        raise _host_key_error(target, lookup, exc) from exc
    except asyncssh.PermissionDenied as exc:
        raise _auth_error(target) from exc
    except (asyncssh.Error, OSError, TimeoutError) as exc:
        raise _transport_error(target, opts, exc) from exc


def _host_key_error(
    target: _Target, lookup: _KnownHostsLookup, exc: asyncssh.Error
) -> SshConnectError:
    kh_file = lookup.configured[0] if lookup.configured else "~/.ssh/known_hosts"
    where = ", ".join(lookup.files) or f"{kh_file}, which does not exist"
    entry = target.hostname if target.port == _SSH_PORT else f"[{target.hostname}]:{target.port}"
    keyscan = f"ssh-keyscan {target.dash_p}{target.hostname} >> {kh_file}"
    if "revoked" in exc.reason.lower():
        return target.fail(
            SshFailure.HOST_KEY_REVOKED,
            f"the host key of {target} is marked @revoked in {where}",
            "do not connect; get the host's new key from its administrator and put it in "
            f"{kh_file}",
        )
    if lookup.trusted:
        return target.fail(
            SshFailure.HOST_KEY_CHANGED,
            f"the host key of {target} does NOT match the one in {where}; the host was "
            "reinstalled or someone is intercepting the connection",
            f"if the change is expected, remove the old key with "
            f"`ssh-keygen -f {kh_file} -R '{entry}'`, then check and add the new one "
            f"(`{keyscan}`); otherwise do not connect",
        )
    return target.fail(
        SshFailure.HOST_KEY_UNKNOWN,
        f"the host key of {target} is not known (not in {where})",
        f"check the host's fingerprint and add its key: `{keyscan}`, or run "
        f"`ssh {target.dash_p}{target.user}@{target.hostname}` once and accept the key",
    )


def _auth_error(target: _Target) -> SshConnectError:
    keys = ", ".join(target.identities) or "default keys and ssh-agent"
    return target.fail(
        SshFailure.AUTH,
        f"authentication failed for user '{target.user}' on {target} (keys tried: {keys})",
        f"install your public key there with `ssh-copy-id {target.dash_p}"
        f"{target.user}@{target.hostname}`, or set the right IdentityFile/User for this host "
        "in ~/.ssh/config (or user@host:port in the hostfile)",
    )


def _transport_error(target: _Target, opts: SshOptions, exc: BaseException) -> SshConnectError:
    """Classify a failure below SSH authentication: name lookup, TCP, handshake."""
    port_hint = (
        f"check that sshd runs on {target.hostname} and listens on port {target.port} "
        "(set the port as host:PORT in the hostfile or Port in ~/.ssh/config)"
    )
    if isinstance(exc, socket.gaierror):
        return target.fail(
            SshFailure.DNS,
            f"cannot resolve host name '{target.hostname}': {exc.strerror}",
            "fix the name in the hostfile, /etc/hosts or DNS, or map it with a Host block "
            "and HostName in ~/.ssh/config",
        )
    if isinstance(exc, ConnectionRefusedError):
        return target.fail(
            SshFailure.REFUSED,
            f"connection refused by {target}",
            port_hint,
        )
    if isinstance(exc, TimeoutError):
        return target.fail(
            SshFailure.TIMEOUT,
            f"no SSH answer from {target} within {opts.connect_timeout:g} s",
            f"check that the host is up, that no firewall drops port {target.port}, and that "
            "the address is right; raise the connect timeout for slow links",
        )
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS:
        return target.fail(
            SshFailure.UNREACHABLE,
            f"cannot reach {target}: {exc.strerror}",
            "check the address and the network route to the host (ping it)",
        )
    if isinstance(exc, asyncssh.ConnectionLost | asyncssh.ProtocolError):
        return target.fail(
            SshFailure.PROTOCOL,
            f"SSH handshake with {target} failed: {_reason(exc)}",
            f"check that port {target.port} on {target.hostname} is an SSH server (not another "
            "service) and that it accepts connections from here (MaxStartups, AllowUsers)",
        )
    return target.fail(
        SshFailure.DISCONNECTED,
        f"SSH connection to {target} failed: {_reason(exc)}",
        port_hint,
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.Error):
        return exc.reason or type(exc).__name__
    return str(exc) or type(exc).__name__


def remote_command(argv: Sequence[str]) -> str:
    """The shell command line that runs ``argv`` exactly, each argument quoted."""
    if not argv:
        raise ValueError("remote command is empty; expected a program and its arguments")
    return shlex.join(argv)


async def run_remote(
    conn: asyncssh.SSHClientConnection,
    argv: list[str],
    *,
    # A parameter rather than asyncio.timeout(): on expiry the remote process is closed.
    timeout: float,  # noqa: ASYNC109
    input: str | None = None,
) -> tuple[int, str, str]:
    """Run ``argv`` on the connection's host; return ``(exit_status, stdout, stderr)``.

    A process killed by a signal gives ``-signal`` as its status, as in
    :mod:`subprocess`; ``-1`` when the remote side sent no status at all. The
    remote shell starts it in the login user's home directory.

    Raises:
        SshError: the command did not finish within ``timeout`` seconds, or the
            connection failed while it ran.
    """
    command = remote_command(argv)
    host = str(conn.get_extra_info("host", "?"))
    try:
        process = await conn.create_process(
            command,
            input=input or None,
            stdin=asyncssh.PIPE if input else asyncssh.DEVNULL,
            encoding="utf-8",
            errors="replace",
        )
    except (asyncssh.ChannelOpenError, asyncssh.DisconnectError, OSError) as exc:
        raise SshError(
            host,
            f"cannot start `{_short(command)}`: {_reason(exc)}",
            "check that the host is still up and its sshd allows sessions (MaxSessions)",
        ) from exc
    try:
        result = await process.wait(timeout=timeout)
    except asyncssh.TimeoutError as exc:
        # Closing the channel alone leaves the remote command running (no pty, no SIGHUP).
        process.send_signal("KILL")
        raise SshError(
            host,
            f"`{_short(command)}` did not finish within {timeout:g} s",
            "check the host's load and that the command does not wait for input",
        ) from exc
    except (asyncssh.DisconnectError, asyncssh.ConnectionLost, OSError) as exc:
        raise SshError(
            host,
            f"connection lost while running `{_short(command)}`: {_reason(exc)}",
            "check that the host is still up and reachable",
        ) from exc
    finally:
        process.close()
        # sshd confirms the close only once the command has exited; do not hang on one
        # that ignores the signal: the connection's own close ends it in any case.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait_closed(), _CLOSE_GRACE)
    status = result.returncode
    return (
        -1 if status is None else int(status),
        str(result.stdout or ""),
        str(result.stderr or ""),
    )


def _short(command: str, limit: int = 80) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."
