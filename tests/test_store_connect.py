"""``connect_store``: a store client's connect is bounded, and the bound cuts
only the connect's own socket (real TCPStore, real gloo, real sockets)."""

from __future__ import annotations

import datetime
import socket
import threading
import time

import psutil
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import PrefixStore, TCPStore  # noqa: E402

from dtlaunch.runtime import store as store_module  # noqa: E402
from dtlaunch.runtime.store import connect_store  # noqa: E402


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(store_module, "CONNECT_GRACE_S", 0.5)
    return 0.5


def listening_ports() -> set[int]:
    return {
        conn.laddr.port
        for conn in psutil.Process().net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }


def gloo_pair(port: int) -> list:
    """Two gloo groups (ranks 0 and 1 of one) met at the store on ``port``."""
    groups: list = [None, None]

    def make(rank: int) -> None:
        client = connect_store("127.0.0.1", port, 10)
        groups[rank] = dist.ProcessGroupGloo(
            PrefixStore("pair", client), rank, 2, datetime.timedelta(seconds=10)
        )

    threads = [threading.Thread(target=make, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(groups), "the gloo pair did not form"
    return groups


def allreduce_both(groups: list) -> list[list[float]]:
    out: list[list[float]] = [[], []]

    def reduce(rank: int) -> None:
        tensor = torch.full((2,), float(rank + 1))
        groups[rank].allreduce([tensor]).wait()
        out[rank] = tensor.tolist()

    threads = [threading.Thread(target=reduce, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return out


def test_a_live_store_connects_and_is_not_cut_after_the_bound(short_grace):
    server = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    client = connect_store("127.0.0.1", server.port, 0.5)
    time.sleep(0.5 + short_grace + 0.5)  # past the bound: the watchdog is gone
    client.set("k", "v")
    assert client.get("k") == b"v"
    assert not [t for t in threading.enumerate() if t.name.startswith("store-connect-watchdog")]


def test_a_gloo_listener_is_not_a_store_and_only_the_connect_is_cut(short_grace):
    """A gloo pair's listener accepts and stays silent: torch's client would
    wait forever. The connect ends within its bound, and the gloo
    connections of this process to that very port keep working."""
    server = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    before = listening_ports()
    groups = gloo_pair(server.port)
    listening = sorted(listening_ports() - before)
    assert listening, "no gloo listener found"
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="did not answer"):
        connect_store("127.0.0.1", listening[0], 0.5)
    assert time.monotonic() - began < 0.5 + short_grace + 3
    assert allreduce_both(groups) == [[3.0, 3.0], [3.0, 3.0]]


def test_nothing_listening_fails(short_grace):
    """torch's own error, after its retries (whose back-off may outlast the
    bound by seconds: a sleep, not a wait on a peer)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.monotonic()
    with pytest.raises((RuntimeError, TimeoutError)):
        connect_store("127.0.0.1", port, 0.5)
    assert time.monotonic() - began < 15
