"""Where an RNA group meets before it forms: its store, and every member at it.

``RoundWorker`` (``rna_rounds``) reads its messages through an ``Inbox``: the
queue the client fills, plus the messages read ahead while a group was being
met (handled afterwards, in order). ``meet`` takes one member to a
generation's store and waits there for the others, and gives up as soon as a
newer generation's message is in the inbox: the coordinator gave this one up
(a member of it died before it formed, or it was a crashed supervisor's).

The members agree at the store on one verdict - whoever decides first sets
it - so none forms a group another one gave up.

Going to a store is bounded. A store that went away refuses: the connect is
tried in slices, and between two the inbox is read, so a newer generation ends
the attempt at once instead of after the group's timeout. A port taken over by
a listener that never answers (a gloo pair's) would keep torch's client
forever: ``store.connect_store`` cuts it after its bound. A group already
superseded when it is read (a message read late: this thread was in a round,
or it is a crashed supervisor's) gets one short visit, enough to set the
verdict for members waiting at a store that lives, and no more.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from typing import Any

from torch._C._distributed_c10d import PrefixStore

from dtlaunch.runtime.store import connect_store
from dtlaunch.wire.messages import RnaGroup, RnaOpenStore

STOP = object()  # the inbox item that ends the communication thread
GATHER_POLL_S = 0.02  # how often the store is asked who is there (or a message ends it)
CONNECT_SLICE_S = 1.0  # a refused store is tried again after reading the inbox
SUPERSEDED_VISIT_S = 0.5  # the bound of a visit to a superseded group's store


class Inbox:
    """The communication thread's messages, in order, with those read ahead."""

    def __init__(self, incoming: queue.Queue[object], stopped: threading.Event) -> None:
        self._incoming = incoming
        self._read_ahead: deque[object] = deque()
        self._stopped = stopped

    def next(self, timeout: float) -> object:
        """The next message (one read ahead first).

        Raises:
            queue.Empty: none came in ``timeout`` seconds.
        """
        if self._read_ahead:
            return self._read_ahead.popleft()
        return self._incoming.get(timeout=timeout)

    def read_ahead(self, timeout: float = 0.0) -> None:
        """Set aside every message waiting; with ``timeout``, wait that long
        for one when none is."""
        with contextlib.suppress(queue.Empty):
            if timeout > 0:
                self._read_ahead.append(self._incoming.get(timeout=timeout))
            while True:
                self._read_ahead.append(self._incoming.get_nowait())

    def superseded(self, gen: int) -> bool:
        """The thread is stopping, or a message of a generation after ``gen``
        was read ahead."""
        return self._stopped.is_set() or any(
            item is STOP or (isinstance(item, RnaGroup | RnaOpenStore) and item.gen > gen)
            for item in self._read_ahead
        )


def meet(msg: RnaGroup, rank: int, inbox: Inbox, hosted: Any | None) -> Any | None:
    """Go to ``msg``'s store (``hosted``: this worker's own, when it hosts
    it) and wait until every member is there: the store, or None when a newer
    generation came first (the group was given up; its message is next).

    Raises:
        TimeoutError: a member did not come in ``msg.timeout_s``, another
            member gave the group up meanwhile, or the store did not answer.
        RuntimeError: the store refused past ``msg.timeout_s`` (torch's error).
    """
    deadline = time.monotonic() + msg.timeout_s
    store = hosted if hosted is not None else _connect(msg, inbox, deadline)
    if store is None:
        return None
    here = PrefixStore(f"rna/{msg.gen}/here", store)
    here.set(str(rank), "1")
    keys = [str(m) for m in msg.members]
    while True:
        if here.check(keys):
            verdict = here.compare_set("verdict", "", "go")
        elif inbox.superseded(msg.gen) or time.monotonic() >= deadline:
            verdict = here.compare_set("verdict", "", "gone")
        elif here.check(["verdict"]):
            verdict = here.get("verdict")
        else:
            inbox.read_ahead(GATHER_POLL_S)
            continue
        if verdict == b"go":
            return store
        if inbox.superseded(msg.gen):
            return None
        missing = [m for m in msg.members if not here.check([str(m)])]
        raise TimeoutError(f"group {msg.gen} was given up: members {missing} did not come")


def _connect(msg: RnaGroup, inbox: Inbox, deadline: float) -> Any | None:
    """A client of ``msg``'s store, or None once a newer generation is read."""
    while True:
        inbox.read_ahead()
        hurry = inbox.superseded(msg.gen)  # only to say so at the store
        slice_s = min(CONNECT_SLICE_S, max(deadline - time.monotonic(), 0.1))
        grace_s = None  # connect_store's
        if hurry:
            slice_s = grace_s = SUPERSEDED_VISIT_S
        try:
            return connect_store(msg.store_addr, msg.store_port, slice_s, grace_s=grace_s)
        except TimeoutError:
            if hurry:
                return None
            raise  # something there, and it never answers: not worth a second wait
        except RuntimeError:
            if hurry:
                return None
            if time.monotonic() >= deadline:
                raise
