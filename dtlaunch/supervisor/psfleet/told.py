"""Waiting until a server's workers were told where its blocks went, before the
server is stopped: a server replaced by a new process (its blocks moved there)
and a server a scale-in emptied (its blocks reassigned). A worker that had not
asked it since would otherwise wait for an answer from a stopped server."""

from __future__ import annotations

import contextlib
import math
import threading
import time

from dtlaunch.ps.control import ServerControl
from dtlaunch.wire.keys import PeerKeys

__all__ = ["STATS_TIMEOUT_S", "wait_until_told"]

POLL_S = 0.2
STATS_TIMEOUT_S = 5.0  # a server sleeping an injected delay still answers within it


def wait_until_told(
    teller: str,
    members_of: str,
    keys: PeerKeys,
    *,
    stop: threading.Event,
    timeout_s: float | None = None,
) -> bool:
    """Until every worker the server at ``members_of`` waits for (a member that
    left is a member no more) was told by the server at ``teller`` where the
    blocks went (``PsStats.redirected``); False when ``stop`` is set first or
    after ``timeout_s``. Blocks the calling thread.

    Raises:
        PsError: a server did not answer within its stats timeout.
    """
    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
    with contextlib.ExitStack() as links:
        told = links.enter_context(ServerControl(teller, keys, timeout=STATS_TIMEOUT_S, stop=stop))
        members = told
        if members_of != teller:
            members = links.enter_context(
                ServerControl(members_of, keys, timeout=STATS_TIMEOUT_S, stop=stop)
            )
        while not stop.is_set() and time.monotonic() < deadline:
            if set(members.stats().workers) <= set(told.stats().redirected):
                return True
            stop.wait(POLL_S)
    return False
