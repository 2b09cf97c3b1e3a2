"""Hosts in network namespaces whose network links a test can cut.

Each host is a namespace (``ip netns``) joined to a bridge on this machine by a veth
pair and running its own OpenSSH sshd on port 22 of its address 10.213.K.11, .12, ...;
the bridge holds 10.213.K.1, which is where the supervisor is reached (the agent
connects back to the address its SSH connection came from). The namespaces share
this machine's files, so the same Python and repository work on every host.

:meth:`NetnsCluster.cut` takes the host's link down (its veth end on the bridge):
every packet to and from that host is dropped, as when a switch port or a cable
fails; established TCP connections stay open and resume on :meth:`NetnsCluster.heal`.

Everything is created under unique names (the bridge name is the claim: creating
it fails when another run holds that K) and removed on :meth:`NetnsCluster.close`,
which first kills by pid every process still inside a namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dtlaunch.sshconn import ENV_SSH_CONFIG
from tests.sshd import SSHD, _client_config, _keygen, _sshd_config, _sshd_version

SUBNET_PREFIX = "10.213"
# Every host's interface has this name. The namespaces share this machine's
# hostname, which resolves to no host's address: Gloo (torch.distributed) must be
# told which interface to use, as on a real cluster with several networks:
# GLOO_SOCKET_IFNAME=dtlnet0.
INTERFACE = "dtlnet0"
_FIRST_TAG, _LAST_TAG = 10, 250
_START_TIMEOUT = 10.0


class NetnsUnavailable(RuntimeError):
    """This machine cannot create the namespaces (not root, no ``ip netns``, no sshd)."""


@dataclass(slots=True)
class NetnsHost:
    namespace: str
    address: str
    link: str  # the veth end on the bridge; down = cut off
    sshd: subprocess.Popen[bytes]
    cut: bool = False


@dataclass(slots=True)
class NetnsCluster:
    root: Path
    tag: int
    bridge: str
    ssh_config: Path
    hosts: list[NetnsHost] = field(default_factory=list)
    _links: list[str] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """This machine's address on the bridge: where the hosts reach the supervisor."""
        return f"{SUBNET_PREFIX}.{self.tag}.1"

    @property
    def addresses(self) -> list[str]:
        return [host.address for host in self.hosts]

    def env(self) -> dict[str, str]:
        return {ENV_SSH_CONFIG: str(self.ssh_config)}

    def host(self, address: str) -> NetnsHost:
        return next(h for h in self.hosts if h.address == address)

    def cut(self, address: str) -> None:
        """Drop every packet to and from ``address`` until :meth:`heal`."""
        host = self.host(address)
        _ip("link", "set", "dev", host.link, "down")
        host.cut = True

    def heal(self, address: str) -> None:
        host = self.host(address)
        _ip("link", "set", "dev", host.link, "up")
        host.cut = False

    def pids(self, address: str) -> list[int]:
        """Every process in ``address``'s namespace but its sshd listener: the
        agents and workers the job started there (and their SSH sessions)."""
        host = self.host(address)
        found = subprocess.run(
            ["ip", "netns", "pids", host.namespace], capture_output=True, text=True, check=False
        )
        return [int(p) for p in found.stdout.split() if int(p) != host.sshd.pid]

    def close(self) -> None:
        """Kill what runs in the namespaces (by pid), stop sshd, delete every link."""
        for host in self.hosts:
            for pid in self.pids(host.address):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
            if host.sshd.poll() is None:
                host.sshd.kill()
            host.sshd.wait(timeout=10)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)


def _ip(*args: str, namespace: str | None = None) -> None:
    argv = ["ip", *(("-n", namespace) if namespace else ()), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")


def _claim_bridge() -> tuple[int, str]:
    """A free tag K and its bridge, created: the creation is the atomic claim."""
    for tag in range(_FIRST_TAG + os.getpid() % 100, _LAST_TAG):
        bridge = f"dtlb{tag}"
        done = subprocess.run(
            ["ip", "link", "add", bridge, "type", "bridge"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            return tag, bridge
        if "exists" not in done.stderr:
            raise NetnsUnavailable(f"cannot create a bridge: {done.stderr.strip()}")
    raise NetnsUnavailable(f"no free bridge name dtlb{_FIRST_TAG}..dtlb{_LAST_TAG}")


def _check_machine() -> None:
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("`ip` is missing: apt-get install iproute2")
    if not SSHD.exists():
        raise NetnsUnavailable(f"{SSHD} is missing: run `make sshd-deps`")


def start_cluster(root: Path, count: int) -> NetnsCluster:
    """``count`` namespace hosts with sshd each; the caller must call ``close()``."""
    _check_machine()
    tag, bridge = _claim_bridge()
    cluster = NetnsCluster(
        root=root, tag=tag, bridge=bridge, ssh_config=root / "ssh_config", _links=[]
    )
    try:
        _ip("addr", "add", f"{cluster.gateway}/24", "dev", bridge)
        _ip("link", "set", "dev", bridge, "up")
        host_key, client_key = root / "ssh_host_ed25519_key", root / "client_ed25519"
        _keygen(host_key, "dtlaunch-netns-host")
        _keygen(client_key, "dtlaunch-netns-client")
        authorized = root / "authorized_keys"
        shutil.copyfile(client_key.with_suffix(".pub"), authorized)
        version = _sshd_version()
        public = host_key.with_suffix(".pub").read_text(encoding="utf-8").split()
        known = []
        for index in range(count):
            cluster.hosts.append(_start_host(cluster, index, host_key, authorized, version))
            known.append(f"{cluster.hosts[-1].address} {public[0]} {public[1]}\n")
        (root / "known_hosts").write_text("".join(known), encoding="utf-8")
        cluster.ssh_config.write_text(
            _client_config(
                port=22,
                user="root",
                identity_file=client_key,
                known_hosts=root / "known_hosts",
                hosts=f"{SUBNET_PREFIX}.{tag}.*",
            ),
            encoding="utf-8",
        )
        _wait_listening(cluster)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _start_host(
    cluster: NetnsCluster, index: int, host_key: Path, authorized: Path, version: tuple[int, int]
) -> NetnsHost:
    namespace = f"dtlaunch-{cluster.tag}-h{index}"
    address = f"{SUBNET_PREFIX}.{cluster.tag}.{11 + index}"
    link, inside = f"dtl{cluster.tag}h{index}", f"dtl{cluster.tag}p{index}"
    _ip("netns", "add", namespace)
    _ip("link", "add", link, "type", "veth", "peer", "name", inside)
    cluster._links.append(link)
    _ip("link", "set", inside, "netns", namespace)
    _ip("link", "set", "dev", inside, "name", INTERFACE, namespace=namespace)
    _ip("link", "set", link, "master", cluster.bridge)
    _ip("link", "set", "dev", link, "up")
    _ip("link", "set", "dev", "lo", "up", namespace=namespace)
    _ip("addr", "add", f"{address}/24", "dev", INTERFACE, namespace=namespace)
    _ip("link", "set", "dev", INTERFACE, "up", namespace=namespace)
    folder = cluster.root / namespace
    folder.mkdir()
    config = folder / "sshd_config"
    config.write_text(_sshd_config(folder, 22, host_key, authorized, version, [address]))
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    with (folder / "sshd.log").open("ab") as log:
        sshd = subprocess.Popen(
            ["ip", "netns", "exec", namespace, str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return NetnsHost(namespace=namespace, address=address, link=link, sshd=sshd)


def _wait_listening(cluster: NetnsCluster) -> None:
    import socket

    deadline = time.monotonic() + _START_TIMEOUT
    pending = list(cluster.hosts)
    while pending and time.monotonic() < deadline:
        for host in list(pending):
            if host.sshd.poll() is not None:
                raise NetnsUnavailable(f"sshd in {host.namespace} exited: see {cluster.root}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((host.address, 22), timeout=0.5),
            ):
                pending.remove(host)
        time.sleep(0.05)
    if pending:
        names = ", ".join(h.namespace for h in pending)
        raise NetnsUnavailable(f"sshd did not listen within {_START_TIMEOUT} s in {names}")


@contextlib.contextmanager
def running_cluster(count: int, root: Path | None = None) -> Iterator[NetnsCluster]:
    """``count`` namespace hosts, removed on exit (with anything still running there)."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dtlaunch-netns-")))
        cluster = start_cluster(root, count)
        stack.callback(cluster.close)
        yield cluster


__all__ = [
    "INTERFACE",
    "NetnsCluster",
    "NetnsHost",
    "NetnsUnavailable",
    "running_cluster",
    "start_cluster",
]
