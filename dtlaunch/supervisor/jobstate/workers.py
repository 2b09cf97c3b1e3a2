"""Who a worker is at the supervisor's socket: its identity, checked at the boundary.

A worker connects as ``worker:<rank>@<attempt>`` (:func:`worker_identity`;
``dtlaunch.runtime.client`` builds the same).
``WorkerPeers`` turns a routing identity into ``(rank, attempt)`` when it names a
worker of this job and an attempt that still counts, remembers which attempt said
Hello, and answers where a message meant for "worker r" goes. The attempt is what
fences a stale process: after a network cut its rank restarted elsewhere, and the
old attempt, reconnecting, must neither pass for the rank nor take its route.
"""

from __future__ import annotations

from dtlaunch.supervisor.jobstate.machine import JobState

__all__ = [
    "MAX_RANK_DIGITS",
    "WORKER_PREFIX",
    "WorkerPeers",
    "parse_worker_identity",
    "worker_identity",
]

WORKER_PREFIX = b"worker:"
MAX_RANK_DIGITS = 9  # a billion workers, a billion restarts: anything longer is garbage
_PARSED_MAX = 100_000  # identities remembered by WorkerPeers.worker_of


def worker_identity(rank: int, attempt: int) -> bytes:
    """The ZeroMQ routing identity of attempt ``attempt`` of worker ``rank``'s SDK
    (``dtlaunch.runtime.client`` builds the same). The attempt is part of it so
    that a stale attempt (its host was cut off, the rank restarted elsewhere)
    neither takes the new attempt's connection over nor passes for it."""
    return WORKER_PREFIX + f"{rank}@{attempt}".encode()


def parse_worker_identity(peer: bytes) -> tuple[int, int] | None:
    """``(rank, attempt)`` from a worker identity in canonical form, else None."""
    rank_text, at, attempt_text = peer[len(WORKER_PREFIX) :].partition(b"@")
    if not peer.startswith(WORKER_PREFIX) or not at:
        return None
    for digits in (rank_text, attempt_text):
        if not digits.isdigit() or len(digits) > MAX_RANK_DIGITS:
            return None
    rank, attempt = int(rank_text), int(attempt_text)
    return (rank, attempt) if worker_identity(rank, attempt) == peer else None


class WorkerPeers:
    """The worker side of the supervisor's boundary (no I/O: it reads ``JobState``)."""

    def __init__(self, state: JobState) -> None:
        self._state = state
        self.greeted: set[int] = set()  # ranks that said Hello to this supervisor
        # rank -> the identity of the attempt that said Hello last: where what is
        # meant for "worker r" goes (a retiring attempt may still talk meanwhile).
        self._hello_from: dict[int, bytes] = {}
        # identity -> ((rank, attempt), its proc id), for identities that parsed:
        # every message a worker sends asks (thousands a second at 1,000 workers).
        self._parsed: dict[bytes, tuple[tuple[int, int], str]] = {}

    def worker_of(self, peer: bytes) -> tuple[int, int] | None:
        """``(rank, attempt)`` when ``peer`` names a worker of this job, else None: a
        rank the node table does not hold would otherwise reach the queue (and the
        WAL) before anything noticed it."""
        known = self._parsed.get(peer)
        if known is None:
            who = parse_worker_identity(peer)
            if who is None:
                return None
            if len(self._parsed) >= _PARSED_MAX:  # restarts make new identities
                self._parsed.clear()
            known = self._parsed[peer] = (who, f"worker-{who[0]}")
        who, proc_id = known
        if proc_id not in self._state.procs and proc_id not in self._state.removing:
            return None
        return who

    def attempt_counts(self, rank: int, attempt: int) -> bool:
        """The rank's current attempt (or a later one a resumed supervisor has not
        heard of yet), or its replaced one that trains on until its prewarmed
        replacement joins; not an attempt given up for another."""
        proc_id = f"worker-{rank}"
        leaving = self._state.removing.get(proc_id)  # a scale-down's, finishing its shard
        if leaving is not None and leaving[1] == attempt:
            return True
        slot = self._state.procs.get(proc_id)
        retiring = self._state.retiring.get(proc_id)
        return (slot is not None and attempt >= slot.attempt) or (
            retiring is not None and retiring[1] == attempt
        )

    def said_hello(self, rank: int, attempt: int) -> bool:
        """Whether attempt ``attempt`` of worker ``rank`` is the one that said Hello last."""
        return self._hello_from.get(rank) == worker_identity(rank, attempt)

    def hello(self, rank: int, peer: bytes) -> None:
        self.greeted.add(rank)
        self._hello_from[rank] = peer

    def peer_of(self, rank: int) -> bytes:
        """Where a message for worker ``rank`` goes: the attempt that said Hello
        last, else the current attempt."""
        slot = self._state.procs.get(f"worker-{rank}")
        return self._hello_from.get(rank) or worker_identity(rank, slot.attempt if slot else 0)
