"""A real OpenSSH sshd on loopback for the tests; 127.0.0.1-3 stand for three hosts.

:func:`start_sshd` runs the system's ``/usr/sbin/sshd -D -e`` (as root, on one free
port, listening on 127.0.0.1, 127.0.0.2 and 127.0.0.3) with a fresh ed25519 host key
and a fresh client key authorized for root, and writes an ssh_config plus a
known_hosts file that make ``ssh``/asyncssh reach it without touching ``~/.ssh``.

Commands run in an sshd session get sshd's login environment (a default PATH, not
this venv), so tests run ``sys.executable`` by its absolute path on the remote side.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from dtlaunch.sshconn import ENV_SSH_CONFIG, SshOptions

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
_START_TIMEOUT = 10.0
_START_ATTEMPTS = 3  # a free port can be taken by someone else before sshd binds it


@dataclass(slots=True)
class SshdServer:
    """A running sshd plus the client files that reach it."""

    root: Path
    port: int
    host_key: Path
    client_key: Path
    ssh_config: Path
    known_hosts: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    addresses: list[str] = field(default_factory=lambda: list(ADDRESSES))
    _log: IO[bytes] | None = None

    def options(self, **overrides: object) -> SshOptions:
        """SshOptions that reach this sshd through its ssh_config."""
        kwargs: dict[str, object] = {"config_paths": (self.ssh_config,), "connect_timeout": 5.0}
        kwargs.update(overrides)
        return SshOptions(**kwargs)  # type: ignore[arg-type]

    def env(self) -> dict[str, str]:
        """Environment variables that make a dtlaunch subprocess use this sshd."""
        return {ENV_SSH_CONFIG: str(self.ssh_config)}

    def write_hostfile(self, path: Path, lines: Iterable[str]) -> Path:
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return path

    def host_key_line(self, address: str) -> str:
        """The known_hosts line for ``address`` on this sshd's port."""
        public = self.host_key.with_suffix(".pub").read_text(encoding="utf-8").split()
        return f"[{address}]:{self.port} {public[0]} {public[1]}"

    def write_client_config(
        self,
        path: Path,
        *,
        port: int | None = None,
        user: str = "root",
        identity_file: Path | None = None,
        known_hosts: Path | None = None,
    ) -> Path:
        """Write an ssh_config for 127.0.0.* with some setting changed (for failure tests)."""
        path.write_text(
            _client_config(
                port=self.port if port is None else port,
                user=user,
                identity_file=self.client_key if identity_file is None else identity_file,
                known_hosts=self.known_hosts if known_hosts is None else known_hosts,
            ),
            encoding="utf-8",
        )
        return path

    def log_tail(self, lines: int = 30) -> str:
        if self._log is not None:
            self._log.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if sshd does not exit within 5 s."""
        try:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=5)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


def _client_config(
    *, port: int, user: str, identity_file: Path, known_hosts: Path, hosts: str = "127.0.0.*"
) -> str:
    # IdentitiesOnly keeps a developer's ssh-agent keys out of the authentication tests.
    return (
        f"Host {hosts}\n"
        f"    Port {port}\n"
        f"    User {user}\n"
        f"    IdentityFile {identity_file}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        "    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n"
    )


def _sshd_config(
    root: Path,
    port: int,
    host_key: Path,
    authorized: Path,
    version: tuple[int, int],
    addresses: Sequence[str],
    extra: Sequence[str] = (),
) -> str:
    lines = [
        f"Port {port}",
        *(f"ListenAddress {address}" for address in addresses),
        f"HostKey {host_key}",
        f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}",
        "StrictModes no",
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UseDNS no",
        "PrintMotd no",
        "X11Forwarding no",
        "AllowTcpForwarding yes",
        "Subsystem sftp internal-sftp",
        # Tests open many connections at once (three hosts, parallel checks).
        "MaxStartups 100",
        "MaxSessions 100",
        "LogLevel VERBOSE",
    ]
    if version >= (9, 8):
        # Auth-failure tests would otherwise get 127.0.0.1 blocked for the rest of the run.
        lines.append("PerSourcePenalties no")
    return "\n".join([*lines, *extra]) + "\n"


def _sshd_version() -> tuple[int, int]:
    probe = subprocess.run([str(SSHD), "-V"], capture_output=True, text=True, check=False)
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", probe.stdout + probe.stderr)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def start_sshd(
    root: Path, addresses: Sequence[str] = ADDRESSES, *, extra_config: Sequence[str] = ()
) -> SshdServer:
    """Start sshd with its files under ``root``, listening on ``addresses``
    (loopback "hosts"), ``extra_config`` lines appended to its sshd_config; the
    caller must call ``stop()``."""
    if not SSHD.exists():
        pytest.fail(
            f"{SSHD} is missing; the SSH tests need a real OpenSSH server: "
            "run `make sshd-deps` (apt-get install openssh-server)"
        )
    if shutil.which(SSH_KEYGEN) is None:
        pytest.fail("ssh-keygen is missing: run `make sshd-deps` (apt-get install openssh-client)")
    # sshd refuses to start without its privilege-separation directory.
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    host_key = root / "ssh_host_ed25519_key"
    client_key = root / "client_ed25519"
    _keygen(host_key, "dtlaunch-test-host")
    _keygen(client_key, "dtlaunch-test-client")
    authorized = root / "authorized_keys"
    shutil.copyfile(client_key.with_suffix(".pub"), authorized)
    version = _sshd_version()
    problems: list[str] = []
    for _attempt in range(_START_ATTEMPTS):
        server = _try_start(
            root, _free_port(), host_key, client_key, authorized, version, addresses, extra_config
        )
        if isinstance(server, SshdServer):
            return server
        problems.append(server)
    pytest.fail("sshd did not start:\n" + "\n---\n".join(problems))


def _try_start(
    root: Path,
    port: int,
    host_key: Path,
    client_key: Path,
    authorized: Path,
    version: tuple[int, int],
    addresses: Sequence[str],
    extra_config: Sequence[str] = (),
) -> SshdServer | str:
    """A running server, or the reason it did not come up."""
    config = root / "sshd_config"
    text = _sshd_config(root, port, host_key, authorized, version, addresses, extra_config)
    config.write_text(text, encoding="utf-8")
    check = subprocess.run(
        [str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        pytest.fail(f"sshd rejects the test config {config}: {check.stderr.strip()}")
    log_path = root / "sshd.log"
    log = log_path.open("ab")
    process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    known_hosts = root / "known_hosts"
    server = SshdServer(
        root=root,
        port=port,
        host_key=host_key,
        client_key=client_key,
        ssh_config=root / "ssh_config",
        known_hosts=known_hosts,
        log_path=log_path,
        process=process,
        addresses=list(addresses),
        _log=log,
    )
    deadline = time.monotonic() + _START_TIMEOUT
    pending = list(addresses)
    while pending and process.poll() is None and time.monotonic() < deadline:
        pending = [address for address in pending if not _accepts(address, port)]
        if pending:
            time.sleep(0.02)
    if pending:
        server.stop()
        return f"port {port}: not listening on {', '.join(pending)}:\n{server.log_tail()}"
    known_hosts.write_text(
        "".join(server.host_key_line(address) + "\n" for address in addresses), encoding="utf-8"
    )
    server.write_client_config(server.ssh_config)
    return server


@contextlib.contextmanager
def running_sshd(
    root: Path | None = None, addresses: Sequence[str] = ADDRESSES
) -> Iterator[SshdServer]:
    """A started sshd on ``addresses``, stopped on exit; without ``root``, in a
    private temporary folder.

    The default is not pytest's ``tmp_path_factory`` on purpose: pytest deletes old
    basetemp folders when a concurrent pytest run starts, and sshd re-reads its config
    and keys on every connection.
    """
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dtlaunch-sshd-")))
        server = start_sshd(root, addresses)
        stack.callback(server.stop)
        yield server


__all__ = ["ADDRESSES", "SshdServer", "running_sshd", "start_sshd"]
