"""The supervisor's side of the built-in parameter servers (``--servers M``).

Two duties, both through ``dtlaunch.ps.control.ServerControl`` on a thread of
their own (those sockets block; the supervisor's loop must not):

* **Monitor feed.** Every control interval each running server is asked for the
  updates it applied since the last ask: AntDT's T_s (§II), the injected delay
  apart. They go to the Controller's Monitor, where nd looks for a persistent
  server straggler (§VI-A), and to the event log (``server_reports``).
* **BACKUP_WORKERS(b)**: the b the policy set goes to every server, and again
  to one that comes back without it (a restarted process starts with b = 0).
* **KILL_RESTART of a server as a live move** (§VI-A with PSLD §5.2's versioned
  migration). A fresh server starts on a free spare host
  (``JobState.replace_server``) while the straggler serves on. Once the new one
  listens (``migrate``: the exchange itself), the straggler exports every
  block with its optimizer state at its next step boundary and from then on
  sends each client that asks it to the new server (``moved_to``); the new
  server imports the blocks at that version
  and takes over the membership. Training waits only from that boundary to the
  import; the clients follow on their own, at whatever point of their step the
  redirect reaches them. The straggler is stopped once every member has been
  sent on (or after ``REDIRECT_WAIT_S``). The pause measured is the policy's
  next restart cost.

A move that fails (the new server never listens, or the straggler never reaches
a step boundary) is logged and recorded; the straggler keeps its blocks and the
job goes on with it.

* **REASSIGN_BLOCKS** (PSLD): some blocks change servers, live, between steps
  (``reassign``), recorded as ``ps_reassign`` events with the pause measured. A
  reassignment left pending (by a supervisor that died, or a release that
  failed after the commit) is completed or rolled back before anything else
  moves a block or stops a server: at the first poll at which every server it
  names listens again (a resumed supervisor learns the endpoints only as the
  agents say hello), and again every ``SCALE_RETRY_S`` while that fails. Until
  then a source holds the moved blocks and every worker waits for them, so
  stopping a server of the old map (a scale-in's drain) would leave them
  waiting for a process that is gone.
* **Servers added or removed** (``dtlaunch scale --servers``): every poll takes
  the next step ``scaling.next_server_step`` names, a reassignment onto the new
  number of servers or stopping the servers it emptied, recorded as ``ps_scale``
  events.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dtlaunch.events import EventRecorder
from dtlaunch.ps.control import ServerControl
from dtlaunch.ps.exchange import PsError
from dtlaunch.solvers import spread_blocks
from dtlaunch.supervisor.control.actions import KillRestart, ReassignBlocks
from dtlaunch.supervisor.control.loop import ReportIntake
from dtlaunch.supervisor.control.monitor import PsLayout
from dtlaunch.supervisor.jobstate.machine import Command, JobState, ProcState
from dtlaunch.supervisor.psfleet.migrate import MOVE_TIMEOUT_S, migrate
from dtlaunch.supervisor.psfleet.placement import PlacementKeeper
from dtlaunch.supervisor.psfleet.reassign import BlockReassigner, Reassigned
from dtlaunch.supervisor.psfleet.scaling import Drain, Rescale, Wait, next_server_step
from dtlaunch.supervisor.psfleet.told import STATS_TIMEOUT_S, wait_until_told
from dtlaunch.wire.keys import PeerKeys
from dtlaunch.wire.messages import PsPlacementMap, PsStats, PsUpdate

__all__ = ["ServerFleet"]

log = logging.getLogger(__name__)

SCALE_RETRY_S = 5.0  # after a scale step failed (rolled back), the next try
# A server a scale-in emptied is stopped once its members were told, or after this
# (a worker waiting for data asks it nothing until data comes).
DRAIN_WAIT_S = 30.0

T = TypeVar("T")


class ServerFleet:
    def __init__(
        self,
        *,
        state: JobState,
        keys: PeerKeys,
        recorder: EventRecorder,
        apply: Callable[[list[Command]], None],
        clock: Callable[[], float],
        intake: ReportIntake,
        interval: float,
        placements: PlacementKeeper | None = None,
    ) -> None:
        self._state = state
        self._keys = keys
        self._recorder = recorder
        self._apply = apply
        self._clock = clock
        self._intake = intake
        self._controller = intake.controller
        self._interval = interval
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ps-control")
        # Moves wait for a server to start and for a step boundary: on their own
        # thread, so the Monitor keeps being fed meanwhile.
        self._move_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ps-move")
        self._stop = threading.Event()
        # Used on the pool's thread only: one link per server, and what was fed.
        self._controls: dict[int, ServerControl] = {}
        self._seen: dict[int, tuple[int, int]] = {}  # rank -> (incarnation, last version)
        self._moves: dict[int, threading.Event] = {}  # rank -> its move's stop
        self._targets: dict[int, tuple[str, ...]] = {}  # rank -> the host it moves to
        self._tasks: set[asyncio.Task[None]] = set()
        self._backup: int | None = None  # BACKUP_WORKERS' b, once a policy set it
        # The workers each server's steps wait for, once `dtlaunch scale` changed
        # them (None: the ones the servers started with), and the ranks a scale
        # added that have not said hello yet: a step does not wait for a process
        # still starting (Python, torch) but joins it once it is there.
        self._members: set[int] | None = None
        self._not_yet_greeted: set[int] = set()
        self._placements = placements
        self._reassigner = (
            BlockReassigner(
                keeper=placements,
                endpoint_of=state.server_endpoint,
                keys=keys,
                timeout=MOVE_TIMEOUT_S,
                stop=self._stop,
            )
            if placements is not None
            else None
        )
        self._reassigning = False
        self._recover_retry_at = 0.0  # a failed recovery is tried again from then
        self._recover_waiting = ""  # what the recovery waits for, as last recorded
        self._scale_retry_at = 0.0  # a failed scale step is tried again from then
        self._scale_waiting = ""  # why the scale waits, as last recorded
        self._draining: set[int] = set()  # servers a scale-in emptied, being stopped
        if placements is not None:
            placements.tell_endpoints(state.server_endpoint)
            placements.listen(self._map_changed)
        if placements is not None and self._controller is not None:
            controller = self._controller
            placements.listen(lambda placement: controller.placement_changed(layout_of(placement)))

    # --------------------------------------------------------------- public

    async def run(self) -> None:
        """Feed the Monitor every interval until cancelled; then stop every move."""
        try:
            while True:
                await asyncio.sleep(self._interval)
                await self.poll()
        finally:
            self._stop.set()  # a request being waited for gives up at once
            for move in self._moves.values():
                move.set()
            for task in list(self._tasks):
                task.cancel()
            self._pool.submit(self._close_controls)
            self._pool.shutdown(wait=False)
            self._move_pool.shutdown(wait=False)

    async def poll(self) -> None:
        """Ask every running server for its new updates; feed and record them."""
        for rank, stop in list(self._moves.items()):
            if self._state.procs[f"server-{rank}"].host not in self._targets.get(rank, ()):
                stop.set()  # the job gave this move up (its server died): stop waiting
        for rank, endpoint in self._running():
            try:
                stats = await self._blocking(self._stats, rank, endpoint)
                if self._backup is not None and stats.backup != self._backup:
                    await self._blocking(self._set_backup, rank, self._backup)
                members = self._members
                if members is not None and set(stats.assigned) != members:
                    await self._blocking(self._set_members, rank, endpoint, sorted(members))
            except Exception as exc:  # restarting, busy: next time
                log.debug("server %d: no statistics this time: %s", rank, exc)
                continue
            updates = self._new_updates(rank, stats)
            if updates:
                self._intake.server_updates(rank, updates, server_now=stats.now_s)
        if not self._recover_pending():
            self._step_servers()

    def workers_changed(self, before: list[int], after: list[int]) -> None:
        """A scale changed the workers from ``before`` to ``after``: added ones join
        the membership when they say hello, removed ones once they are gone (they
        train the shard they read to its end first; ``worker_gone``)."""
        members = self._members if self._members is not None else set(before)
        self._not_yet_greeted = (self._not_yet_greeted | (set(after) - set(before))) & set(after)
        self._members = (members | set(after)) - self._not_yet_greeted
        self._spawn(self._push_members(), "ps-members")

    def worker_gone(self, rank: int) -> None:
        """A worker ended; one a scale removed leaves the membership now."""
        members = self._members
        if members is not None and rank in members and rank not in self._state.worker_ranks():
            members.discard(rank)
            self._spawn(self._push_members(), "ps-members")

    def worker_greeted(self, rank: int) -> None:
        if rank in self._not_yet_greeted and self._members is not None:
            self._not_yet_greeted.discard(rank)
            self._members.add(rank)
            self._spawn(self._push_members(), "ps-members")

    def resume_members(self, ranks: list[int]) -> None:
        """A resumed supervisor of a scaled job: the servers may hold a membership
        the dead one had not updated yet; the job's workers are the members."""
        self._members = set(ranks)

    def servers_refusal(self, count: int) -> str | None:
        """Why the servers cannot be scaled to ``count`` now (None: they can): a
        new server takes its blocks from the job's map, which the first worker
        registers, and a server needs a block to hold."""
        if self._placements is None:
            return "this job's servers are not dtlaunch's built-in ones"
        placement = self._placements.placement
        if placement is None:
            return (
                "no worker has registered the model's parameter blocks yet (the first "
                "dtlaunch.ps.Client does); scale the servers once the workers train"
            )
        if count > len(placement.blocks):
            return (
                f"the model is cut into {len(placement.blocks)} parameter block(s), and a "
                f"server beyond them would hold nothing: ask for at most "
                f"{len(placement.blocks)} servers (a job started with a smaller "
                "--ps-block-bytes cuts the model finer)"
            )
        return None

    def set_backup(self, count: int) -> None:
        """BACKUP_WORKERS(count) on every server from the next poll on (within an
        interval), and on any server that comes back without it."""
        self._backup = count

    def kill_restart(self, action: KillRestart, now: float) -> bool:
        """Start moving server ``action.rank`` onto a free spare host; False when
        it cannot move (no free spare host, not running, already moving)."""
        rank = action.rank
        slot = self._state.procs.get(f"server-{rank}")
        target = self._state.free_spare(action.target_host)
        old = self._state.server_endpoint(rank)
        if (
            slot is None
            or slot.state is not ProcState.RUNNING
            or target is None
            or target == slot.host
            or rank in self._moves
            or self._reassigning
            or (self._placements is not None and self._placements.pending is not None)
            or not old
        ):
            return False
        commands = self._state.replace_server(rank, target, action.reason, now)
        if not commands:
            return False
        self._apply(commands)
        self._moves[rank] = threading.Event()  # set: give this move up
        if self._controller is not None:
            self._controller.server_moving(rank)
        self._targets[rank] = (target,)
        self._spawn(self._move(rank, old, target), f"ps-move-{rank}")
        return True

    def reassign(self, action: ReassignBlocks, now: float) -> bool:
        """Start moving blocks to ``action.owner``; False when it cannot start (no
        map, another reassignment or a server move under way, a stale plan)."""
        keeper = self._placements
        if (
            keeper is None
            or keeper.placement is None
            or keeper.pending is not None
            or keeper.placement.version != action.from_version
            or self._reassigning
            or self._moves
        ):
            return False
        self._reassigning = True
        self._spawn(self._reassign(list(action.owner)), "ps-reassign")
        return True

    # ------------------------------------------------- servers added or removed

    def _step_servers(self) -> None:
        """One step towards the servers the job should run (``scaling``), when no
        reassignment or move is under way."""
        keeper = self._placements
        if keeper is None or keeper.placement is None or self._reassigning or self._moves:
            return
        if self._clock() < self._scale_retry_at:
            return
        ready = {
            slot.rank: slot.state is ProcState.RUNNING
            and bool(self._state.server_endpoint(slot.rank))
            for slot in self._state.procs.values()
            if slot.role == "server"
        }
        placement = keeper.placement
        step = next_server_step(
            map_servers=placement.servers, target=self._state.server_target, ready=ready
        )
        if isinstance(step, Wait):
            if step.reason != self._scale_waiting:
                self._scale_waiting = step.reason
                self._scale_event("waiting", reason=step.reason)
        elif isinstance(step, Drain):
            for rank in step.ranks:
                if rank not in self._draining:
                    self._draining.add(rank)
                    self._spawn(self._drain(rank), f"ps-drain-{rank}")
        elif isinstance(step, Rescale):
            self._scale_waiting = ""
            owner = spread_blocks(
                [b.nbytes for b in placement.blocks],
                [b.server for b in placement.blocks],
                step.servers,
            )
            self._reassigning = True
            self._spawn(
                self._reassign(list(owner), scale=step), f"ps-scale-{step.was}-{step.servers}"
            )

    async def _drain(self, rank: int) -> None:
        """Stop server ``rank``, which holds no block of the job's map, once every
        worker its steps waited for was told where its blocks went (a worker that
        had not asked it since would wait for an answer from a stopped server),
        or after ``DRAIN_WAIT_S``."""
        endpoint = self._state.server_endpoint(rank)
        wait = functools.partial(
            wait_until_told, endpoint, endpoint, self._keys, stop=self._stop, timeout_s=DRAIN_WAIT_S
        )
        try:
            told = bool(endpoint) and await self._blocking(wait, pool=self._move_pool)
        except Exception as exc:  # gone or silent: stopping it loses nothing
            log.info("server %d: waiting for its members to be told: %s", rank, exc)
            told = False
        finally:
            self._draining.discard(rank)
        commands = self._state.server_drained(rank)
        if not commands:  # scaled back up meanwhile: it serves on
            return
        self._apply(commands)
        if self._controller is not None:
            self._controller.server_removed(rank)
        self._pool.submit(self._forget, rank)
        self._scale_event("drained", servers=[rank], all_told=told)

    def _map_changed(self, placement: PsPlacementMap) -> None:
        """The node table learns how many servers hold blocks (an OOM of a server
        may add servers only once there is a map to spread)."""
        self._state.ps_map_servers = placement.servers
        self._state.ps_map_blocks = len(placement.blocks)

    def _scale_event(self, phase: str, **data: Any) -> None:
        self._recorder.emit("ps_scale", role="supervisor", rank=0, phase=phase, **data)

    # ---------------------------------------------------------- reassignments

    async def _reassign(self, owner: list[int], *, scale: Rescale | None = None) -> None:
        """Move the blocks to ``owner`` (a policy's REASSIGN_BLOCKS, or a step of
        a ``scale``, onto its number of servers), recording how it went."""
        assert self._reassigner is not None
        assert self._placements is not None
        began = self._clock()
        event = self._reassign_event
        servers = scale.servers if scale is not None else None
        cost_s: float | None = None  # the pause, once carried out
        if scale is not None:
            event = functools.partial(self._scale_event, servers=scale.servers)
            event("begin", was=scale.was, owner=owner)
        else:
            event("begin", owner=owner)
        try:
            done: Reassigned = await self._blocking(
                self._reassigner.carry_out, owner, servers, pool=self._move_pool
            )
        except Exception as exc:
            log.error("reassigning parameter blocks failed: %s", exc)
            event("failed", error=str(exc) or type(exc).__name__)
            if scale is not None:
                self._scale_retry_at = self._clock() + SCALE_RETRY_S
        else:
            cost_s = done.pause_s
            event(
                "done",
                version=done.version,
                at_version=done.at_version,
                pause_s=round(done.pause_s, 4),
                hold_s=round(done.hold_s, 4),
                blocks=done.blocks,
                bytes=done.nbytes,
                tries=done.tries,
                lead=done.lead,
                took_s=round(self._clock() - began, 3),
                phases_s=done.phases_s,
            )
        finally:
            self._reassigning = False
            self._placements.announce()
            if self._controller is not None:
                self._controller.reassignment_over(cost_s)

    def _recover_pending(self) -> bool:
        """Start completing or rolling back the reassignment left pending, once
        every server it names listens; True while one is pending (nothing else
        may move blocks or stop a server meanwhile: see the module doc)."""
        keeper = self._placements
        if keeper is None or keeper.pending is None:
            return False
        if self._reassigning or self._clock() < self._recover_retry_at:
            return True  # under way (a reassignment recovers first), or retried later
        running = dict(self._running())
        missing = [s for s in keeper.pending.servers() if s not in running]
        if missing:
            why = f"server(s) {missing} not listening yet"
            if why != self._recover_waiting:
                self._recover_waiting = why
                self._reassign_event("recover_waiting", reason=why)
            return True
        self._recover_waiting = ""
        self._reassigning = True
        self._spawn(self._recover(), "ps-reassign-recover")
        return True

    async def _recover(self) -> None:
        assert self._reassigner is not None
        assert self._placements is not None
        try:
            outcome = await self._blocking(self._reassigner.recover, pool=self._move_pool)
        except Exception as exc:  # the file stays: tried again after SCALE_RETRY_S
            log.error("a reassignment left pending: %s; trying again", exc)
            self._reassign_event("recover_failed", error=str(exc) or type(exc).__name__)
            self._recover_retry_at = self._clock() + SCALE_RETRY_S
        else:
            self._reassign_event("recovered", outcome=outcome)
        finally:
            self._reassigning = False
            self._placements.announce()

    def _reassign_event(self, phase: str, **data: Any) -> None:
        self._recorder.emit("ps_reassign", role="supervisor", rank=0, phase=phase, **data)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------------- moves

    async def _move(self, rank: int, old: str, target: str) -> None:
        new = self._state.server_endpoint(rank)
        began = self._clock()
        stop = self._moves[rank]
        self._event(rank, "begin", from_endpoint=old, to_endpoint=new, target_host=target)
        try:
            if not new:
                raise PsError(f"no port known for server {rank} on {target}")
            moved = await self._blocking(migrate, old, new, self._keys, stop, pool=self._move_pool)
        except Exception as exc:  # any failure before the hand-over: undo
            self._moves.pop(rank, None)
            log.error("moving parameter server %d to %s failed: %s", rank, target, exc)
            self._apply(self._state.abort_server_move(rank, self._clock()))
            self._event(rank, "failed", error=str(exc) or type(exc).__name__)
            if self._controller is not None:
                self._controller.server_restart_failed(rank)
            return
        self._state.server_handed_over(rank)
        self._event(
            rank,
            "moved",
            version=moved.version,
            pause_s=round(moved.pause_s, 4),
            took_s=round(self._clock() - began, 3),
        )
        if self._controller is not None:
            self._controller.server_replaced(rank, moved.pause_s)
        try:
            # The old server answers "moved" until every member of the new one
            # has heard it; a member still computing a long step asks later.
            wait = functools.partial(wait_until_told, old, new, self._keys, stop=stop)
            everyone = await self._blocking(wait, pool=self._move_pool)
        except Exception as exc:  # it holds nothing now: stop it anyway
            log.warning("server %d: waiting for the redirects: %s", rank, exc)
            everyone = False
        finally:
            self._moves.pop(rank, None)
        self._apply(self._state.retire(f"server-{rank}"))
        self._event(rank, "done", all_redirected=everyone)

    def _event(self, rank: int, phase: str, **data: Any) -> None:
        self._recorder.emit("ps_move", role="server", rank=rank, phase=phase, **data)

    # ------------------------------------------------------------ statistics

    def _running(self) -> list[tuple[int, str]]:
        out = []
        for slot in self._state.procs.values():
            if slot.role != "server" or slot.state is not ProcState.RUNNING:
                continue
            endpoint = self._state.server_endpoint(slot.rank)
            if endpoint and slot.rank not in self._moves:
                out.append((slot.rank, endpoint))
        return sorted(out)

    def _link(self, rank: int, endpoint: str) -> ServerControl:
        control = self._controls.get(rank)
        if control is None or control.endpoint != endpoint:
            if control is not None:
                control.close()
            control = self._controls[rank] = ServerControl(
                endpoint, self._keys, timeout=STATS_TIMEOUT_S, stop=self._stop
            )
        return control

    def _stats(self, rank: int, endpoint: str) -> PsStats:
        control = self._link(rank, endpoint)
        incarnation, last = self._seen.get(rank, (0, 0))
        stats = control.stats(since_version=last)
        if last and stats.incarnation != incarnation:
            stats = control.stats()  # a new process: all of its own updates
        return stats

    def _set_backup(self, rank: int, count: int) -> None:
        self._controls[rank].set_backup(count)

    def _set_members(self, rank: int, endpoint: str, workers: list[int]) -> None:
        self._link(rank, endpoint).membership(workers, backup=self._backup or 0)

    async def _push_members(self) -> None:
        """The membership to every running server now (a server that misses it,
        or restarts, gets it at a later poll)."""
        members = self._members
        if members is None:
            return
        for rank, endpoint in self._running():
            try:
                await self._blocking(self._set_members, rank, endpoint, sorted(members))
            except Exception as exc:  # restarting, busy: the next poll
                log.info("server %d: membership not set now (%s); next poll", rank, exc)
        self._recorder.emit("ps_members", workers=sorted(members))

    def _new_updates(self, rank: int, stats: PsStats) -> list[PsUpdate]:
        incarnation, last = self._seen.get(rank, (0, 0))
        if stats.incarnation != incarnation:
            last = 0  # a new process (restart, move): its own updates only
        fresh = [u for u in stats.updates if u.version > last]
        newest = max([last, *(u.version for u in fresh)])
        self._seen[rank] = (stats.incarnation, newest)
        return fresh

    def _forget(self, rank: int) -> None:
        """A server a scale-in stopped: its link and what was fed of it go."""
        control = self._controls.pop(rank, None)
        if control is not None:
            control.close()
        self._seen.pop(rank, None)

    def _close_controls(self) -> None:
        for control in self._controls.values():
            control.close()
        self._controls.clear()

    async def _blocking(
        self, fn: Callable[..., T], *args: Any, pool: ThreadPoolExecutor | None = None
    ) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool or self._pool, fn, *args)


def layout_of(placement: PsPlacementMap) -> PsLayout:
    """The Monitor's view of a placement map."""
    return PsLayout(
        version=placement.version,
        servers=placement.servers,
        block_bytes=tuple(b.nbytes for b in placement.blocks),
        owner=tuple(b.server for b in placement.blocks),
    )
