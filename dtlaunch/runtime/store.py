"""Connecting to a c10d ``TCPStore`` with a bound that holds.

A ``TCPStore`` client's constructor connects, then pings the server and waits
for its answer without a read timeout (torch 2.13): pointed at a port where
something accepts and stays silent - a gloo pair listener, a process that took
over the port of a store that went away - it blocks forever, whatever its
``timeout`` says. A worker told where a group meets by a supervisor that has
since been replaced can be pointed at such a port, and its communication thread
would never come back.

``connect_store`` gives the connect its timeout plus a grace; past that, a timer
shuts down the sockets to that address this process opened since the connect
began (not a gloo pair's that happens to reach the same port), which ends the
blocked receive with an error in the connecting thread itself (no thread is
left behind in native code), and the caller gets a ``TimeoutError`` naming the
store.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
from typing import Any

import psutil
from torch._C._distributed_c10d import TCPStore

logger = logging.getLogger(__name__)

CONNECT_GRACE_S = 5.0  # beyond the store's own timeout: its retries and back-off


def connect_store(
    host: str,
    port: int,
    timeout_s: float,
    *,
    world_size: int | None = None,
    grace_s: float | None = None,
) -> Any:
    """A ``TCPStore`` client of ``host:port`` (a torch ``TCPStore``).

    Raises:
        TimeoutError: no store answered at ``host:port`` within ``timeout_s``
            plus ``grace_s`` (default ``CONNECT_GRACE_S``).
        RuntimeError: torch's own errors (refused past the timeout, ...).
    """
    bound_s = timeout_s + (CONNECT_GRACE_S if grace_s is None else grace_s)
    watchdog = _ConnectWatchdog(host, port, bound_s)
    watchdog.start()
    try:
        store = TCPStore(
            host,
            port,
            world_size,
            False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except Exception as err:
        if watchdog.finish():
            raise TimeoutError(
                f"the store at {host}:{port} did not answer in {watchdog.bound_s:.1f} s "
                "(it went away, or something else listens on its port)"
            ) from err
        raise
    if watchdog.finish():
        # Cut as the connect returned: its socket is shut down, the store unusable.
        raise TimeoutError(
            f"the store at {host}:{port} answered only after {watchdog.bound_s:.0f} s"
        )
    return store


class _ConnectWatchdog:
    """Shuts down this process's TCP sockets to ``host:port`` once ``bound_s``
    passed, unless ``finish()`` came first; ``finish()`` says whether it cut."""

    def __init__(self, host: str, port: int, bound_s: float) -> None:
        self.bound_s = bound_s
        self._host = host
        self._port = port
        self._before = sockets_to(host, port)  # not ours to cut
        self._lock = threading.Lock()
        self._done = False
        self._cut = False
        self._timer = threading.Timer(bound_s, self._fire)
        self._timer.daemon = True
        self._timer.name = f"store-connect-watchdog-{port}"

    def start(self) -> None:
        self._timer.start()

    def finish(self) -> bool:
        with self._lock:
            self._done = True
        self._timer.cancel()
        self._timer.join()  # a cut in progress completes before we report it
        return self._cut

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._cut = True
            cut = shut_down(sockets_to(self._host, self._port) - self._before)
        logger.warning(
            "the store at %s:%d did not answer in %.0f s: shut down %d socket(s) to it",
            self._host,
            self._port,
            self.bound_s,
            cut,
        )


def sockets_to(host: str, port: int) -> set[tuple[int, tuple[str, int]]]:
    """(descriptor, local address) of this process's TCP sockets connected or
    connecting to ``host:port``."""
    try:
        resolved = {
            str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        }
    except OSError:
        return set()
    # An IPv6 socket reaches an IPv4 address as its mapped form.
    addresses = resolved | {f"::ffff:{a}" for a in resolved if ":" not in a}
    return {
        (conn.fd, (conn.laddr.ip, conn.laddr.port))
        for conn in psutil.Process().net_connections(kind="tcp")
        if conn.raddr and conn.raddr.port == port and conn.raddr.ip in addresses and conn.fd >= 0
    }


def shut_down(sockets: set[tuple[int, tuple[str, int]]]) -> int:
    """Shut down (both ways) the sockets ``sockets_to`` named: a thread blocked
    on one gets an error. The number shut down."""
    count = 0
    for fd, local in sockets:
        try:
            # A duplicate of its descriptor: shutdown acts on the socket, and
            # closing the duplicate leaves the owner's descriptor alone.
            with socket.socket(fileno=os.dup(fd)) as dup:
                if dup.getsockname()[:2] != local:
                    continue  # the descriptor was closed and reused meanwhile
                dup.shutdown(socket.SHUT_RDWR)
            count += 1
        except OSError:  # closed meanwhile
            continue
    return count
