"""Supervisor side of re-forming an allreduce group around its survivors.

I/O-free bookkeeping for the protocol described in ``dtlaunch.runtime.elastic``:
which workers can hand their state to a newcomer (they called ``job.attach``),
the one regroup in flight, and how long it may take before the supervisor falls
back to restarting the group. The supervisor sends and receives the messages.

A regroup either replaces ranks (KILL_RESTART: one, or several at once, as a
slow host's workers moved together) or resizes the group (``dtlaunch scale``):
ranks from the new size up leave, new ranks join. The group's size changes
when the resize is done: when every newcomer has attached (received the
state), or, with none, when the survivors' store is up. Several ranks replaced
at once are one regroup: their replacements start prewarmed, the workers hear
it once every one is warm, and it is done when every one has attached.
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
    # A resize: the group's size after it (0: a KILL_RESTART of leaving_rank),
    # the new ranks (prewarmed), the ranks that leave, and of the new ranks
    # those that are warm (said hello) and those that received the state.
    world_size: int = 0
    joining: frozenset[int] = frozenset()
    leaving: frozenset[int] = frozenset()
    warm: frozenset[int] = frozenset()
    joined: frozenset[int] = frozenset()
    # Several ranks replaced at once (world_size 0; leaving_rank is the first),
    # and each one's local batch size in the plan in force, for its replacement.
    replaced: frozenset[int] = frozenset()
    batch_sizes: tuple[tuple[int, int], ...] = ()

    @property
    def replacing(self) -> frozenset[int]:
        """The ranks this KILL_RESTART replaces (none for a resize)."""
        if self.world_size:
            return frozenset()
        return self.replaced or frozenset({self.leaving_rank})

    def batch_size_of(self, rank: int) -> int:
        """The local batch size ``rank``'s replacement starts with (0: its share)."""
        return dict(self.batch_sizes).get(rank, self.batch_size)

    def message(self) -> Regroup:
        return Regroup(
            gen=self.gen,
            leaving_rank=self.leaving_rank,
            store_rank=self.store_rank,
            world_size=self.world_size,
            replaced=sorted(self.replaced),
        )

    def join_env(self) -> dict[str, str]:
        """What the newcomer's SDK reads (``dtlaunch.runtime.elastic.ENV_JOIN``)."""
        return {"DTLAUNCH_JOIN": f"{self.gen}:{self.store_rank}:{self.batch_size}"}


class RegroupCoordinator:
    """Tracks attached workers and at most one regroup at a time."""

    def __init__(self, *, world_size: int, timeout_s: float, gen: int = 0) -> None:
        """``gen``: the newest generation of the run so far (a resumed supervisor's
        regroups must be newer than any its workers have heard of)."""
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.gen = gen
        self.pending: PendingRegroup | None = None
        self.store_port = 0  # of the pending regroup, once its store listens
        self.store_addr = ""
        self._attached: set[int] = set()

    def attached(self, rank: int) -> PendingRegroup | None:
        """A worker called ``job.attach()``; returns the regroup this completes
        (the newcomer attaches once it has joined), if any."""
        done = self.pending
        size = max(self.world_size, done.world_size if done is not None else 0)
        if 0 <= rank < size:
            self._attached.add(rank)
        if done is None or not self.store_port:
            return None
        if done.world_size and rank in done.joining:
            done = replace(done, joined=done.joined | {rank})
            self.pending = done
            return self._complete(done) if done.joined == done.joining else None
        if done.replaced:
            if rank not in done.replaced:
                return None
            done = replace(done, joined=done.joined | {rank})
            self.pending = done
            if done.joined != done.replaced:
                return None
            self.pending = None
            self.store_port = 0
            return done
        if rank == done.leaving_rank:
            self.pending = None
            self.store_port = 0
            return done
        return None

    def worker_gone(self, rank: int) -> None:
        """A worker process ended: it must attach again before it can be relied on."""
        self._attached.discard(rank)

    def can_regroup(self, rank: int) -> bool:
        """Whether replacing ``rank`` can keep the others running."""
        return self.can_replace([rank])

    def can_replace(self, ranks: list[int]) -> bool:
        """Whether replacing ``ranks`` at once can keep the others running: one
        worker at least stays to hand the state over, and every worker attached."""
        return (
            self.pending is None
            and bool(ranks)
            and len(set(ranks)) < self.world_size
            and all(0 <= rank < self.world_size for rank in ranks)
            and len(self._attached) == self.world_size
        )

    def restarts_to_resize(self) -> bool:
        """Whether a resize must restart the group: no worker attached (a script
        that never calls ``job.attach()``, as torchrun scripts do not), so none
        could hand the model to a newcomer; the scripts resume as they do after
        any group restart (torchrun's elastic restart)."""
        return not self._attached

    def restarted(self, count: int) -> None:
        """The group restarts with ``count`` workers (``restarts_to_resize``)."""
        self.world_size = count
        self._attached.clear()

    def resize_refusal(self, count: int, *, global_batch: int) -> str | None:
        """Why the group cannot be resized to ``count`` workers now (None: it can);
        when ``restarts_to_resize``, only by a regroup under way or the batch."""
        if self.pending is not None:
            what = "a resize" if self.pending.world_size else "a worker's replacement"
            return (
                f"{what} (regroup generation {self.pending.gen}) is under way; "
                "ask again when it is done (dtlaunch status shows it)"
            )
        missing = sorted(set(range(self.world_size)) - self._attached)
        if missing and not self.restarts_to_resize():
            return (
                f"worker(s) {missing} have not called job.attach(model, optimizer) yet, "
                "while the others have, so a new worker could not receive the model from "
                "them: ask again once they have (or, in a script that never attaches, the "
                "group restarts with the new size)"
            )
        if 0 < global_batch < count:
            return (
                f"the global batch {global_batch} cannot be split over {count} workers "
                "(each needs at least one record per step); scale to at most "
                f"{global_batch} workers"
            )
        return None

    def begin_resize(
        self, count: int, *, joining: list[int], reason: str, now: float
    ) -> Regroup | None:
        """Resize the group to ``count`` workers: ranks ``count`` and up leave (after
        the shard each reads), ``joining`` start prewarmed. Returns the Regroup for
        the current workers now, or None when it waits for the newcomers to be
        warm (``announce``)."""
        self.gen += 1
        self.pending = PendingRegroup(
            gen=self.gen,
            leaving_rank=-1,
            store_rank=0,  # rank 0 stays in every resize (a group has one worker at least)
            target_host=None,
            reason=reason,
            started=now,
            batch_size=0,
            prewarmed=bool(joining),
            announced=not joining,
            announced_at=now,
            world_size=count,
            joining=frozenset(joining),
            leaving=frozenset(range(count, self.world_size)),
        )
        self.store_port = 0
        self.store_addr = ""
        return None if joining else self.pending.message()

    def restore_resize(
        self,
        *,
        gen: int,
        count: int,
        joining: list[int],
        announced: bool,
        store: tuple[str, int] | None,
        now: float,
    ) -> None:
        """A resumed supervisor takes over the resize its predecessor had begun
        (generation ``gen``, to ``count`` workers from ``self.world_size``): the
        newcomers say hello again, the workers hear the Regroup again when they
        do (``greeted``), and the store host's answer comes again; the timeout
        counts from now."""
        newest = self.gen
        self.begin_resize(count, joining=joining, reason="dtlaunch scale (resumed)", now=now)
        self.gen = max(newest, gen)  # no generation is skipped
        assert self.pending is not None
        self.pending = replace(self.pending, gen=gen, announced=announced)
        if store is not None:
            self.store_addr, self.store_port = store

    def greeted(self, rank: int) -> Regroup | None:
        """A worker said hello (to a resumed supervisor, or again): the resize under
        way, announced, that it must hear (again: it ignores one it has heard)."""
        pending = self.pending
        if pending is None or not pending.world_size or not pending.announced:
            return None
        return pending.message() if 0 <= rank < self.world_size else None

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

    def begin_replacing(
        self,
        ranks: list[int],
        *,
        reason: str,
        now: float,
        batch_sizes: dict[int, int],
    ) -> None:
        """Replace several ranks at once, each by a replacement the caller starts
        prewarmed on another host; the Regroup goes out once every one is warm
        (``announce``). ``batch_sizes``: each rank's share of the plan in force."""
        self.gen += 1
        replaced = frozenset(ranks)
        self.pending = PendingRegroup(
            gen=self.gen,
            leaving_rank=min(replaced),
            store_rank=min(r for r in range(self.world_size) if r not in replaced),
            target_host=None,
            reason=reason,
            started=now,
            batch_size=0,
            prewarmed=True,
            announced=False,
            announced_at=now,
            joining=replaced,
            replaced=replaced,
            batch_sizes=tuple(sorted(batch_sizes.items())),
        )
        self.store_port = 0
        self.store_addr = ""

    def announce(self, rank: int, now: float) -> Regroup | None:
        """The prewarmed replacement of ``rank`` is ready: the Regroup to send now."""
        pending = self.pending
        if pending is None or pending.announced:
            return None
        if pending.world_size or pending.replaced:  # once every newcomer is warm
            if rank not in pending.joining:
                return None
            pending = replace(pending, warm=pending.warm | {rank})
            self.pending = pending
            if pending.warm != pending.joining:
                return None
        elif rank != pending.leaving_rank:
            return None
        self.pending = replace(pending, announced=True, announced_at=now)
        return self.pending.message()

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

    def resize_go(self) -> RegroupGo | None:
        """Where a resize's newcomers meet the survivors, once the store is up."""
        pending = self.pending
        if pending is None or not pending.world_size or not self.store_port:
            return None
        return self._go(pending)

    def complete_shrink(self) -> PendingRegroup | None:
        """A resize without newcomers is done once the survivors' store is up."""
        pending = self.pending
        if pending is None or not pending.world_size or pending.joining or not self.store_port:
            return None
        return self._complete(pending)

    def _complete(self, done: PendingRegroup) -> PendingRegroup:
        self.world_size = done.world_size
        self._attached -= done.leaving
        self.pending = None
        self.store_port = 0
        return done

    def join_go(self, rank: int) -> RegroupGo | None:
        """Where the prewarmed replacement of ``rank`` meets the survivors, once its
        predecessor is gone and the store listens."""
        pending = self.pending
        if pending is None or not pending.prewarmed or rank not in pending.replacing:
            return None
        if not self.store_port:
            return None
        return self._go(pending, rank)

    def _go(self, pending: PendingRegroup, rank: int = -1) -> RegroupGo:
        """Where a newcomer of ``pending`` (``rank``'s, when several ranks are
        replaced) meets the survivors (the store is up), who sends it the state,
        and its batch (0: its equal share)."""
        return RegroupGo(
            gen=pending.gen,
            master_addr=self.store_addr,
            master_port=self.store_port,
            source_rank=pending.store_rank,
            batch_size=pending.batch_size_of(rank),
        )

    def expired(self, now: float) -> PendingRegroup | None:
        """The pending regroup if its store is still not up after the timeout (the
        workers never reached the agreed step: the caller falls back). Once the
        store is up, the survivors wait for the newcomer under their own timeout."""
        pending = self.pending
        if pending is None or self.store_port or now - pending.started < self.timeout_s:
            return None
        if pending.world_size:  # the fallback restarts the group with the new size
            return self._complete(pending)
        self.pending = None
        self.store_port = 0
        return pending

    def abandon_resize(self, rank: int) -> PendingRegroup | None:
        """Worker ``rank`` ended while a resize was under way (not as one of the
        ranks it removes): the group restarts, with the new size, and the resize
        is over. Returns it, or None when no resize is under way."""
        pending = self.pending
        if pending is None or not pending.world_size or rank in pending.leaving:
            return None
        return self._complete(pending)

    def cancel(self, rank: int) -> PendingRegroup | None:
        """Drop the pending regroup of ``rank`` (the group ended before it re-formed)."""
        pending = self.pending
        if pending is None or rank not in pending.replacing:
            return None
        self.pending = None
        self.store_port = 0
        return pending

    def survivors(self) -> list[int]:
        """The workers of the group now that stay in the pending regroup."""
        pending = self.pending
        if pending is None:
            return list(range(self.world_size))
        if pending.world_size:
            return list(range(min(self.world_size, pending.world_size)))
        return [r for r in range(self.world_size) if r not in pending.replacing]
