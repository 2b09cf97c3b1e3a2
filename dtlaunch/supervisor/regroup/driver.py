"""Carries out KILL_RESTART in an allreduce job: the messages of the regroup
protocol (``dtlaunch.runtime.elastic``), around the I/O-free ``RegroupCoordinator``
and ``JobState``.

Two ways to replace worker ``r``:

* **prewarmed** (the target is another host): its replacement starts at once
  under ``dtlaunch.runtime.prewarm`` and imports what it needs while ``r`` still
  trains; when it says Hello (as ``join:r``) the workers get ``Regroup``; when
  the survivors' store is up ``r`` is stopped, and once it is gone the
  replacement hears where to meet. The survivors wait only for the hand-over.
* **in place** (same host, where two attempts of one rank cannot run side by
  side): ``Regroup`` at once; when the store is up, ``r`` is killed and its
  replacement started with the store in its environment.

Several workers replaced at once (``kill_restart_many``: a slow host's, which
the policy names in one decision) are one regroup: each replacement starts
prewarmed on a free spare slot, the workers hear the Regroup once every one is
warm, and the group re-forms once, instead of once per worker.

A group that does not get its store up within the coordinator's timeout falls
back to a plain restart (its peers then restart through the group scope).

A **resize** (``dtlaunch scale --workers N`` of an allreduce job) is the same
protocol with more than one rank moving: the new ranks start prewarmed; once
all of them are warm the workers get ``Regroup(world_size=N)``; the ranks a
scale-down removes finish the shard they read (their SDK holds the agreement
back until it is trained and acked, so every record is trained once); at the
agreed step rank 0 hosts the store, the survivors and the newcomers meet there,
and the removed ranks are stopped. If the store is not up in time, the removed
ranks are stopped anyway: the survivors' next collective fails and the group
restarts with the new size.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.control.actions import KillRestart
from dtlaunch.supervisor.jobstate.machine import Command, JobState
from dtlaunch.supervisor.jobstate.nodes import JoinSpec, ProcState
from dtlaunch.supervisor.regroup.coordinator import PendingRegroup, RegroupCoordinator
from dtlaunch.wire.messages import (
    Hello,
    Message,
    Regroup,
    RegroupGo,
    RegroupReady,
    Rehello,
    Welcome,
)

__all__ = ["JOIN_PREFIX", "RegroupDriver"]

log = logging.getLogger(__name__)

JOIN_PREFIX = b"join:"  # a prewarmed replacement's identity until it joins


class RegroupDriver:
    def __init__(
        self,
        coordinator: RegroupCoordinator,
        *,
        state: JobState,
        recorder: EventRecorder,
        send: Callable[[bytes, Message], Awaitable[None]],
        apply: Callable[[list[Command]], None],
        clock: Callable[[], float],
        worker_peer: Callable[[int], bytes],
        measured: Callable[[int, float], None] | None = None,
        planned_batch: Callable[[int], int] = lambda rank: 0,
        welcome: Welcome | None = None,
        resized: Callable[[], None] = lambda: None,
    ) -> None:
        self.coordinator = coordinator
        self._state = state
        self._recorder = recorder
        self._send = send
        self._apply = apply
        self._clock = clock
        self._worker_peer = worker_peer  # rank -> its current attempt's identity
        self._measured = measured  # (rank, seconds the group paused) for the policy
        # rank -> its local batch size in the plan in force (0: the nominal size);
        # a replacement starts with its predecessor's share.
        self._planned_batch = planned_batch
        self._welcome = welcome  # the answer to a waiting newcomer's hello
        self._resized = resized  # a resize is done: the batch plan in force is void
        self._joiners_heard: set[bytes] = set()  # newcomers that said hello to us

    def replacing(self) -> bool:
        """A regroup is in flight: another KILL_RESTART now would restart the group."""
        return self.coordinator.pending is not None

    async def kill_restart(self, action: KillRestart, now: float) -> None:
        """Replace a straggler: around the survivors when they can hand over their
        state (every worker attached), else by restarting it (and, in allreduce
        mode, its group)."""
        coord = self.coordinator
        # The policy names a spare host; one that already runs a process is not spare.
        target = self._state.free_spare(action.target_host)
        if action.role != "worker" or not coord.can_regroup(action.rank):
            self._apply(
                self._state.kill_restart(
                    action.role, action.rank, action.reason, now, target_host=target
                )
            )
            return
        slot = self._state.procs[f"worker-{action.rank}"]
        prewarmed = target is not None and target != slot.host
        msg = self._begin_one(action, target, now, prewarmed=prewarmed)
        if prewarmed:
            assert target is not None
            self._apply(self._state.replace_prewarmed(action.rank, target, action.reason, now))
        else:
            await self._to_all_workers(msg)

    async def kill_restart_many(self, actions: list[KillRestart], now: float) -> None:
        """Replace several workers in one regroup, each onto a free spare slot of
        another host, as many as there are slots for (the rest wait for the
        policy's next decision); a single one, or none that can move, goes the
        ``kill_restart`` way."""
        coord = self.coordinator
        workers = [a for a in actions if a.role == "worker"]
        if len(workers) < 2 or not coord.can_replace([a.rank for a in workers]):
            for action in actions[:1]:
                await self.kill_restart(action, now)
            return
        moving: list[tuple[KillRestart, str]] = []
        for action in workers:
            if len(moving) + 1 >= coord.world_size:
                break  # one worker at least stays to hand the state over
            target = self._state.free_spare(action.target_host)
            slot = self._state.procs[f"worker-{action.rank}"]
            if target is None or target == slot.host:
                continue
            # Started now, the replacement holds the spare slot the next one may not take.
            self._apply(self._state.replace_prewarmed(action.rank, target, action.reason, now))
            moving.append((action, target))
        if len(moving) < 2:
            if moving:  # one could move: begun as a single replacement, already started
                self._begin_one(*moving[0], now, prewarmed=True)
            else:
                await self.kill_restart(workers[0], now)
            return
        ranks = [a.rank for a, _ in moving]
        coord.begin_replacing(
            ranks,
            reason="; ".join(dict.fromkeys(a.reason for a, _ in moving)),
            now=now,
            batch_sizes={rank: self._planned_batch(rank) for rank in ranks},
        )
        assert coord.pending is not None
        self._recorder.emit(
            "regroup",
            phase="prewarm",
            gen=coord.gen,
            ranks=sorted(ranks),
            store_rank=coord.pending.store_rank,
            target_hosts={str(a.rank): target for a, target in moving},
        )

    def _begin_one(
        self, action: KillRestart, target: str | None, now: float, *, prewarmed: bool
    ) -> Regroup:
        """Begin replacing ``action.rank`` alone (recorded); its Regroup."""
        msg = self.coordinator.begin(
            action.rank,
            target_host=target,
            reason=action.reason,
            now=now,
            prewarmed=prewarmed,
            batch_size=self._planned_batch(action.rank),
        )
        self._recorder.emit(
            "regroup",
            phase="prewarm" if prewarmed else "begin",
            gen=msg.gen,
            rank=action.rank,
            store_rank=msg.store_rank,
            target_host=target,
        )
        return msg

    def resize_refusal(self, count: int, *, global_batch: int) -> str | None:
        """Why the group cannot be resized to ``count`` workers now (None: it can)."""
        return self.coordinator.resize_refusal(count, global_batch=global_batch)

    def restarts_to_resize(self) -> bool:
        """Whether a resize restarts the group (no worker attached; see the
        coordinator)."""
        return self.coordinator.restarts_to_resize()

    def restarted(self, count: int, *, reason: str) -> None:
        """The node table restarts the group with ``count`` workers: every worker
        gets its equal share of the global batch from the new start."""
        before = self.coordinator.world_size
        self.coordinator.restarted(count)
        self._recorder.emit("regroup", phase="restart", workers=count, was=before, reason=reason)
        self._resized()

    async def resize(self, count: int, *, joining: list[int], reason: str) -> None:
        """Re-form the group with ``count`` workers; the node table has already
        started ``joining`` (prewarmed) and marked the ranks above as removed."""
        coord = self.coordinator
        before = coord.world_size
        msg = coord.begin_resize(count, joining=joining, reason=reason, now=self._clock())
        self._recorder.emit(
            "regroup",
            phase="prewarm" if msg is None else "begin",
            gen=coord.gen,
            workers=count,
            was=before,
            joining=joining,
            leaving=list(range(count, before)),
            store_rank=0,
        )
        if msg is not None:
            await self._to_all_workers(msg)

    async def from_joiner(self, peer: bytes, msg: Message) -> None:
        """A prewarmed newcomer waiting to join (``dtlaunch.runtime.prewarm``),
        which talks as ``join:<rank>``. One a resumed supervisor has not heard
        hello from is asked for it (``Rehello``), so a resize under way goes on."""
        welcome = self._welcome
        if isinstance(msg, Hello):
            if welcome is None or msg.run_id != welcome.run_id or msg.rank < 0:
                log.warning("join hello from %r for run %s ignored", peer, msg.run_id)
                return
            self._joiners_heard.add(peer)
            await self._send(peer, welcome)
            await self.joiner_hello(msg.rank)
        elif peer not in self._joiners_heard:
            await self._send(peer, Rehello())

    async def worker_greeted(self, rank: int) -> None:
        """A worker said hello: it hears the resize under way (again after a resume)."""
        msg = self.coordinator.greeted(rank)
        if msg is not None:
            await self._send(self._worker_peer(rank), msg)

    async def joiner_hello(self, rank: int) -> None:
        """A prewarmed replacement is ready: the group may act now."""
        msg = self.coordinator.announce(rank, self._clock())
        if msg is None:
            go = self.coordinator.resize_go()  # the store is up already (a resume)
            pending = self.coordinator.pending
            if go is not None and pending is not None and rank in pending.joining:
                await self._send(JOIN_PREFIX + str(rank).encode(), go)
            return
        pending = self.coordinator.pending
        data: dict[str, Any] = {
            "phase": "begin",
            "gen": msg.gen,
            "rank": rank,
            "store_rank": msg.store_rank,
            "warmed_s": round(self._clock() - pending.started, 3) if pending else 0.0,
        }
        if msg.replaced:
            data["ranks"] = msg.replaced
        self._recorder.emit("regroup", **data)
        await self._to_all_workers(msg)

    async def store_ready(self, rank: int, msg: RegroupReady) -> None:
        """The survivors' store listens: tell them where, stop the straggler."""
        coord = self.coordinator
        pending = coord.pending
        addr = self._state.address_of(f"worker-{pending.store_rank}") if pending else ""
        pending = coord.ready(rank, msg, addr)
        if pending is None:
            log.info("regroup answer from worker %d for generation %d ignored", rank, msg.gen)
            return
        self._recorder.emit(
            "regroup",
            phase="store",
            gen=pending.gen,
            step=msg.step,
            store=f"{addr}:{msg.store_port}",
            waited_s=round(self._clock() - pending.started, 3),
        )
        go = RegroupGo(gen=pending.gen, master_addr=addr, master_port=msg.store_port)
        for survivor in coord.survivors():
            await self._send(self._worker_peer(survivor), go)
        if pending.world_size:
            await self._resize_ready(pending.leaving, pending.reason)
            return
        if pending.prewarmed:
            for rank in sorted(pending.replacing):
                self._apply(self._state.retire(f"worker-{rank}"))
            return
        join = JoinSpec(master_addr=addr, master_port=msg.store_port, env=pending.join_env())
        self._apply(
            self._state.kill_restart(
                "worker",
                pending.leaving_rank,
                pending.reason,
                self._clock(),
                target_host=pending.target_host,
                join=join,
            )
        )

    async def _resize_ready(self, leaving: frozenset[int], reason: str) -> None:
        """A resize's store is up: the newcomers join, the removed ranks go."""
        coord = self.coordinator
        joiner_go = coord.resize_go()
        pending = coord.pending
        if joiner_go is not None and pending is not None:
            for rank in sorted(pending.joining):
                await self._send(JOIN_PREFIX + str(rank).encode(), joiner_go)
        self._stop_leavers(leaving, "the group re-formed without it")
        done = coord.complete_shrink()
        if done is not None:
            self._done(done, self._clock())

    def _resize_given_up(self, pending: PendingRegroup, why: str) -> None:
        """The group restarts with the resize's size: the removed ranks go now,
        and every worker starts with its equal share of the batch."""
        self._stop_leavers(pending.leaving, why)
        self._resized()

    def _stop_leavers(self, leaving: frozenset[int], why: str) -> None:
        for rank in sorted(leaving):
            held = self._state.removing.get(f"worker-{rank}")
            if held is not None:
                self._apply(self._state.leave_unheard(rank, held[1], why))

    async def worker_gone(self, rank: int) -> None:
        """A worker process ended; if it was replaced by a waiting one, let that join.
        If it ended the data before the hand-over (the node table then stops its
        replacement), the regroup is over: nobody is left to re-form."""
        self.coordinator.worker_gone(rank)
        abandoned = self.coordinator.abandon_resize(rank)
        if abandoned is not None:
            why = f"worker {rank} ended during the resize"
            self._recorder.emit(
                "regroup", phase="abandoned", gen=abandoned.gen, rank=rank, reason=why
            )
            self._resize_given_up(abandoned, why)
            return
        slot = self._state.procs.get(f"worker-{rank}")
        # stopped as done, or done already (a replacement that never started)
        if slot is not None and (slot.finished_by_predecessor or slot.state is ProcState.SUCCEEDED):
            cancelled = self.coordinator.cancel(rank)
            if cancelled is not None:
                self._recorder.emit(
                    "regroup",
                    phase="cancelled",
                    gen=cancelled.gen,
                    rank=rank,
                    reason="the data ended before the hand-over",
                )
            return
        go = self.coordinator.join_go(rank)
        if go is not None:
            await self._send(JOIN_PREFIX + str(rank).encode(), go)

    def attached(self, rank: int) -> None:
        done = self.coordinator.attached(rank)
        if done is not None:
            self._done(done, self._clock())

    def _done(self, done: PendingRegroup, now: float) -> None:
        data: dict[str, Any] = {
            "phase": "done",
            "gen": done.gen,
            "rank": done.leaving_rank,
            "took_s": round(now - done.started, 3),
            "paused_s": round(now - done.announced_at, 3),
        }
        if done.world_size:
            data["workers"] = done.world_size
        if done.replaced:
            data["ranks"] = sorted(done.replaced)
        self._recorder.emit("regroup", **data)
        if done.world_size:
            self._resized()
        elif self._measured is not None:
            for rank in sorted(done.replacing):
                self._measured(rank, now - done.announced_at)

    def check_timeout(self, now: float) -> None:
        """A group whose store never came up (not a bsp_batches loop? a replacement
        that never started?): fall back to a plain KILL_RESTART."""
        expired = self.coordinator.expired(now)
        if expired is None:
            return
        self._recorder.emit(
            "regroup", phase="abandoned", gen=expired.gen, rank=expired.leaving_rank
        )
        if expired.world_size:
            why = (
                f"the group did not re-form with {expired.world_size} workers within "
                f"{self.coordinator.timeout_s:.0f}s"
            )
            log.warning("%s; restarting it with them", why)
            # Without the removed ranks the group cannot go on; restarted, it
            # starts with the new size (the newcomers with it).
            self._apply(self._state.stalled(["worker-0"], why, now))
            self._resize_given_up(expired, why)
            return
        ranks = sorted(expired.replacing)
        log.warning(
            "the group did not re-form within %.0fs; restarting worker(s) %s the plain way",
            self.coordinator.timeout_s,
            ranks,
        )
        for rank in ranks:
            if expired.prewarmed:
                self._apply(self._state.retire(f"worker-{rank}"))
            self._apply(
                self._state.kill_restart(
                    "worker",
                    rank,
                    expired.reason,
                    now,
                    target_host=None if expired.prewarmed else expired.target_host,
                )
            )

    async def _to_all_workers(self, msg: Message) -> None:
        for rank in range(self.coordinator.world_size):
            await self._send(self._worker_peer(rank), msg)
