"""Supervisor side of re-forming an allreduce group around its survivors.

I/O-free bookkeeping for the protocol described in ``dtlaunch.runtime.elastic``:
which workers can hand their state to a newcomer (they called ``job.attach``),
the one regroup in flight, and how long it may take before the supervisor falls
back to restarting the group. The supervisor sends and receives the messages.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dtlaunch.wire.messages import Regroup, RegroupGo, RegroupReady

__all__ = ["PendingRegroup", "RegroupCoordinator"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingRegroup:
    gen: int
    leaving_rank: int
    store_rank: int
    target_host: str | None
    reason: str
    started: float
    batch_size: int  # the leaving worker's local batch size, for its replacement
    # The replacement was started ahead (on another host) and waits to join; the
    # Regroup goes out once it is ready (announced).
    prewarmed: bool = False
    announced: bool = True
    announced_at: float = 0.0  # from here the group pauses for the hand-over

    def join_env(self) -> dict[str, str]:
        """What the newcomer's SDK reads (``dtlaunch.runtime.elastic.ENV_JOIN``)."""
        return {"DTLAUNCH_JOIN": f"{self.gen}:{self.store_rank}:{self.batch_size}"}


class RegroupCoordinator:
    """Tracks attached workers and at most one regroup at a time."""

    def __init__(self, *, world_size: int, timeout_s: float) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.gen = 0
        self.pending: PendingRegroup | None = None
        self.store_port = 0  # of the pending regroup, once its store listens
        self.store_addr = ""
        self._attached: set[int] = set()

    def attached(self, rank: int) -> PendingRegroup | None:
        """A worker called ``job.attach()``; returns the regroup this completes
        (the newcomer attaches once it has joined), if any."""
        if 0 <= rank < self.world_size:
            self._attached.add(rank)
        done = self.pending
        if done is not None and rank == done.leaving_rank and self.store_port:
            self.pending = None
            self.store_port = 0
            return done
        return None

    def worker_gone(self, rank: int) -> None:
        """A worker process ended: it must attach again before it can be relied on."""
        self._attached.discard(rank)

    def can_regroup(self, rank: int) -> bool:
        """Whether replacing ``rank`` can keep the others running."""
        return (
            self.pending is None
            and self.world_size >= 2
            and 0 <= rank < self.world_size
            and len(self._attached) == self.world_size
        )

    def begin(
        self,
        rank: int,
        *,
        target_host: str | None,
        reason: str,
        now: float,
        prewarmed: bool = False,
        batch_size: int = 0,
    ) -> Regroup:
        """Start replacing ``rank``; the message goes to every worker, at once or,
        for a ``prewarmed`` replacement, when ``announce()`` says it is ready.
        ``batch_size``: the leaving worker's share of the batch plan (0: the
        nominal size), which its replacement starts with."""
        self.gen += 1
        store_rank = min(r for r in range(self.world_size) if r != rank)
        self.pending = PendingRegroup(
            gen=self.gen,
            leaving_rank=rank,
            store_rank=store_rank,
            target_host=target_host,
            reason=reason,
            started=now,
            batch_size=batch_size,
            prewarmed=prewarmed,
            announced=not prewarmed,
            announced_at=now,
        )
        self.store_port = 0
        self.store_addr = ""
        return Regroup(gen=self.gen, leaving_rank=rank, store_rank=store_rank)

    def announce(self, rank: int, now: float) -> Regroup | None:
        """The prewarmed replacement of ``rank`` is ready: the Regroup to send now."""
        pending = self.pending
        if pending is None or pending.announced or rank != pending.leaving_rank:
            return None
        self.pending = replace(pending, announced=True, announced_at=now)
        return Regroup(gen=pending.gen, leaving_rank=rank, store_rank=pending.store_rank)

    def ready(self, rank: int, msg: RegroupReady, addr: str) -> PendingRegroup | None:
        """The store host's answer (it listens at ``addr``); the pending regroup
        when it is the one expected."""
        pending = self.pending
        if pending is None or msg.gen != pending.gen or rank != pending.store_rank:
            return None
        if self.store_port:
            return None  # a duplicate
        self.store_port = msg.store_port
        self.store_addr = addr
        return pending

    def join_go(self, rank: int) -> RegroupGo | None:
        """Where the prewarmed replacement of ``rank`` meets the survivors, once its
        predecessor is gone and the store listens."""
        pending = self.pending
        if pending is None or not pending.prewarmed or rank != pending.leaving_rank:
            return None
        if not self.store_port:
            return None
        return RegroupGo(
            gen=pending.gen,
            master_addr=self.store_addr,
            master_port=self.store_port,
            source_rank=pending.store_rank,
            batch_size=pending.batch_size,
        )

    def expired(self, now: float) -> PendingRegroup | None:
        """The pending regroup if its store is still not up after the timeout (the
        workers never reached the agreed step: the caller falls back). Once the
        store is up, the survivors wait for the newcomer under their own timeout."""
        pending = self.pending
        if pending is None or self.store_port or now - pending.started < self.timeout_s:
            return None
        self.pending = None
        self.store_port = 0
        return pending

    def cancel(self, rank: int) -> PendingRegroup | None:
        """Drop the pending regroup of ``rank`` (the group ended before it re-formed)."""
        pending = self.pending
        if pending is None or rank != pending.leaving_rank:
            return None
        self.pending = None
        self.store_port = 0
        return pending

    def survivors(self) -> list[int]:
        pending = self.pending
        leaving = pending.leaving_rank if pending is not None else -1
        return [r for r in range(self.world_size) if r != leaving]
