"""The supervisor's event loop: wire, launcher and clock in; JobState decides.

This is the only place where the job's state machine meets I/O. Every message,
agent exit, tick and signal becomes a stimulus of ``JobState``; every command it
returns is carried out here (send a message, launch an agent, emit an event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

from dtlaunch.errors import DtlaunchError, WalError
from dtlaunch.supervisor.agents import AgentStarter
from dtlaunch.supervisor.commands import CONTROL_MESSAGES, ControlCommands
from dtlaunch.supervisor.control.loop import ActionTargets, ControlLoop, ReportIntake
from dtlaunch.supervisor.control.snapshot import DataEnd
from dtlaunch.supervisor.control.stacks import StackRequests, innermost_frames, stuck_processes
from dtlaunch.supervisor.control.stall import Stall, StallWatch
from dtlaunch.supervisor.history import ResumePlan
from dtlaunch.supervisor.jobstate import (
    AgentState,
    AskToLeave,
    Command,
    EmitEvent,
    Finish,
    JobState,
    LaunchAgent,
    Phase,
    SendToAgent,
    WorkerGone,
    WorkerPeers,
)
from dtlaunch.supervisor.jobstate.workers import WORKER_PREFIX
from dtlaunch.supervisor.launcher import AgentProcess
from dtlaunch.supervisor.psfleet import ServerFleet
from dtlaunch.supervisor.regroup import JOIN_PREFIX, RegroupDriver
from dtlaunch.supervisor.rna import RNA_MESSAGES, RoundService
from dtlaunch.supervisor.services import JobServices
from dtlaunch.supervisor.status import STATUS_PREFIX
from dtlaunch.version import __version__
from dtlaunch.wire.messages import (
    AckShards,
    AgentHeartbeat,
    Attached,
    Bye,
    DatasetReady,
    Exited,
    FetchShards,
    Hello,
    Message,
    Output,
    Ping,
    PlacementReady,
    RegisterDataset,
    RegisterPlacement,
    RegroupReady,
    Rehello,
    ReleaseShards,
    Spawned,
    SpawnFailed,
    Stacks,
    StepReports,
    Welcome,
)
from dtlaunch.wire.sockets import Router

log = logging.getLogger(__name__)

AGENT_PREFIX = b"agent:"
AGENT_EXIT_WAIT_S = 5.0
# Messages taken from the socket per wake-up when they are queued; small enough
# that the control loop and the timers still run between two batches.
RECEIVE_BATCH = 64


class Supervisor:
    def __init__(
        self,
        *,
        state: JobState,
        router: Router,
        agents: AgentStarter,
        services: JobServices,
        run_id: str,
        heartbeat_interval: float,
        resume: ResumePlan | None = None,
        stall_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self._workers = WorkerPeers(state)  # identities at the boundary
        self._router = router
        self._agents_starter = agents
        self._recorder = services.recorder
        self._output = services.output
        self._dds = services.dds
        self._placements = services.placements
        self._resume = resume
        self._run_id = run_id
        self._interval = heartbeat_interval
        self._clock = clock
        controller = services.controller
        self._intake = ReportIntake(controller, recorder=self._recorder, clock=clock)
        self._regroup = (  # allreduce mode: replace stragglers without a group restart
            RegroupDriver(
                services.regroup,
                state=state,
                recorder=self._recorder,
                send=router.send,
                apply=self._apply,
                clock=clock,
                worker_peer=self._workers.peer_of,
                measured=controller.restart_measured if controller is not None else None,
                planned_batch=lambda rank: controller.batch_plan.get(rank, 0) if controller else 0,
                welcome=Welcome(run_id=run_id, heartbeat_interval=heartbeat_interval),
                resized=controller.group_resized if controller is not None else lambda: None,
            )
            if services.regroup is not None
            else None
        )
        # Built-in PS: feed the servers' update times to the Monitor, move stragglers.
        self._fleet = (
            ServerFleet(
                state=state,
                keys=services.ps_keys,
                recorder=self._recorder,
                apply=self._apply,
                clock=clock,
                intake=self._intake,
                interval=controller.interval if controller is not None else heartbeat_interval,
                placements=self._placements,
            )
            if services.ps_keys is not None and state.builtin_ps
            else None
        )
        self._rounds = (  # --policy rna: its groups, probes and rounds
            RoundService(
                services.rounds,
                send=self._send_to_worker,
                recorder=self._recorder,
                address_of=lambda rank: state.address_of(f"worker-{rank}"),
                clock=clock,
            )
            if services.rounds is not None
            else None
        )
        self._commands = ControlCommands(  # dtlaunch stop, dtlaunch scale
            state=state,
            recorder=self._recorder,
            apply=self._apply,
            reply=router.send,
            workers=self._workers,
            workers_changed=self._fleet.workers_changed if self._fleet else lambda *_: None,
            servers_refusal=self._fleet.servers_refusal if self._fleet else lambda _: None,
            group=self._regroup if self._rounds is None else None,  # rna: groups of its own
            global_batch=lambda: self._dds.spec.global_batch if self._dds.spec else 0,
            spawn=self._spawn_task,
        )
        self._control = ControlLoop(
            controller,
            recorder=self._recorder,
            send_to_worker=self._send_to_worker,
            targets=ActionTargets(
                state=state,
                apply=self._apply,
                servers=self._fleet,
                workers=self._regroup,
                scale=self._commands.scale,
                scale_servers=self._commands.scale_servers,
                rna=self._rounds,
            ),
            remaining_steps=self._dds.remaining_steps,
            data_end=self._data_end,
            clock=clock,
            tick_s=heartbeat_interval / 2,
        )
        self._done = asyncio.Event()
        self._agents: dict[str, AgentProcess] = {}
        self._launch_tasks: set[asyncio.Task[None]] = set()
        self._tasks: asyncio.TaskGroup | None = None
        self._ping_seq = 0
        self._signals = 0
        self._refused_at: dict[bytes, float] = {}  # peer -> when we last logged a refusal
        self._stall = StallWatch(stall_timeout_s)  # None: adaptive bound
        self._stack_requests = StackRequests(
            lambda host, msg: self._router.send(AGENT_PREFIX + host.encode(), msg)
        )

    # --------------------------------------------------------------- public

    async def run(self) -> str:
        """Run the job to its end; returns the final status."""
        async with asyncio.TaskGroup() as tg:
            self._tasks = tg
            receiver = tg.create_task(self._receive_loop(), name="receive")
            ticker = tg.create_task(self._tick_loop(), name="tick")
            control = tg.create_task(self._control.run(), name="control")
            fleet = tg.create_task(self._fleet.run(), name="ps") if self._fleet else None
            rounds = tg.create_task(self._rounds.run(), name="rna") if self._rounds else None
            if self._resume is None:
                self._apply(self.state.start(self._clock()))
            else:
                history = self._resume.history
                self._apply(
                    self.state.resume(
                        self._clock(),
                        attempts=history.attempts,
                        hosts=history.hosts,
                        gpus=history.gpus,
                        memory_limits=history.memory_limits,
                        listen_ports=history.listen_ports,
                        restarts=history.restarts,
                        failures=history.failures,
                        adopt=self._resume.adopt,
                        restart_workers=self._resume.restart_workers,
                        released_workers=self._resume.released_workers,
                        leaving=self._resume.leaving,
                        server_target=history.server_target,
                    )
                )
                if self._fleet is not None and history.scales:
                    self._fleet.resume_members(self.state.worker_ranks())
            await self._done.wait()
            for task in (receiver, ticker, control, fleet, rounds):
                if task is not None:
                    task.cancel()
            await self._terminate_stragglers()
            for task in self._launch_tasks:
                task.cancel()
        await self._agents_starter.close()
        return self.state.status

    def _data_end(self) -> DataEnd | None:
        """Once no shard is left to hand out: what each worker holds, for the
        Balancer's end-of-data plan (None before that)."""
        held = self._dds.held_records()
        spec = self._dds.spec
        if held is None or spec is None:
            return None
        return DataEnd(global_batch=spec.global_batch or 0, held=held)

    def actions_taken(self) -> dict[str, int]:
        """Controller actions by name (AntDT Table II), for the summary."""
        return self._control.actions_taken()

    def request_stop(self, reason: str) -> None:
        """From a signal handler: first time stop gracefully, second time hurry."""
        self._signals += 1
        if self._signals == 1:
            log.warning("stopping the job (%s); again to stop at once", reason)
            self._apply(self.state.stop(reason, self._clock()))
        else:
            log.warning("stopping now (%s)", reason)
            self.state.stop_deadline = self._clock()
            self._apply(self.state.tick(self._clock()))

    # ------------------------------------------------------------- commands

    def _apply(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, EmitEvent):
                self._recorder.emit(
                    command.kind,
                    host=command.host,
                    role=command.role,
                    rank=command.rank,
                    **command.data,
                )
            elif isinstance(command, SendToAgent):
                self._spawn_task(
                    self._router.send(AGENT_PREFIX + command.host.encode(), command.message),
                    f"send-{command.host}",
                )
            elif isinstance(command, LaunchAgent):
                task = self._spawn_task(self._launch(command.host), f"launch-{command.host}")
                self._launch_tasks.add(task)
                task.add_done_callback(self._launch_tasks.discard)
            elif isinstance(command, WorkerGone):
                if self._regroup is not None:
                    self._spawn_task(
                        self._regroup.worker_gone(command.rank), f"regroup-{command.rank}"
                    )
                if self._rounds is not None:
                    gone = self._rounds.worker_gone(command.rank, succeeded=command.succeeded)
                    self._spawn_task(gone, f"rna-{command.rank}")
                self._control.worker_gone(command.rank)
                if self._fleet is not None:
                    self._fleet.worker_gone(command.rank)
                self._spawn_task(self._dds.worker_gone(command.rank), f"gone-{command.rank}")
            elif isinstance(command, AskToLeave):  # a scale-down's worker
                self._spawn_task(self._commands.ask_to_leave(command), "leave")
            elif isinstance(command, Finish):
                self._recorder.emit("job_end", status=command.status, reason=self.state.stop_reason)
                self._done.set()

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        assert self._tasks is not None
        return self._tasks.create_task(coro, name=name)

    def _serve(self, coro: Coroutine[Any, Any, None], name: str, peer: bytes) -> None:
        """Run one peer's request as its own task (many share one WAL fsync), under
        the receive loop's guard: a request that fails is logged and dropped. Only
        a failed write of the log (WalError) stops the supervisor."""

        async def guarded() -> None:
            try:
                await coro
            except WalError:
                raise
            except Exception:
                log.exception("error serving %s for %r; request dropped", name, peer)

        self._spawn_task(guarded(), name)

    async def _launch(self, label: str) -> None:
        try:
            # At most --ssh-concurrency hosts at a time, each from its turn until its
            # agent says Hello; its timeouts (connect, probe, --agent-timeout) too.
            self._apply(self.state.agent_launch_queued(label))
            async with self._agents_starter.turn():
                if self._launch_abandoned(label):
                    return
                self._apply(self.state.agent_launch_turn(label, self._clock()))
                info = await self._agents_starter.prepare(label)
                if self._launch_abandoned(label):
                    return
                proc = await self._agents_starter.start(label, info)
                self._agents[label] = proc
                exited = asyncio.ensure_future(proc.wait())
                limit = self.state.timing.agent_timeout
                await self._agents_starter.until_up(label, exited, limit)
        except DtlaunchError as err:
            log.error("%s", err)
            self._apply(self.state.agent_launch_failed(label, str(err), self._clock()))
            return
        outcome = await exited
        if self._agents.get(label) is proc:
            del self._agents[label]
        detail = outcome.detail
        if outcome.definite and detail != "exit code 0":
            detail = await self._agents_starter.died(label, detail)
        self._apply(
            self.state.agent_exited(label, self._clock(), definite=outcome.definite, detail=detail)
        )

    def _launch_abandoned(self, label: str) -> bool:
        """The job began stopping before this agent was started: it never will be."""
        if self.state.phase in (Phase.RUNNING, Phase.STARTING):
            return False
        self._apply(self.state.agent_launch_abandoned(label, self._clock()))
        return True

    async def _terminate_stragglers(self) -> None:
        """Agents that said Bye get a moment to exit; the rest are terminated."""
        waiting = [t for t in self._launch_tasks if not t.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=AGENT_EXIT_WAIT_S)
        procs = list(self._agents.values())
        if procs:
            log.warning("terminating %d agent(s) that did not stop in time", len(procs))
        for proc in procs:
            with contextlib.suppress(DtlaunchError, OSError):
                await proc.terminate()

    # ---------------------------------------------------------------- loops

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval / 2)
            self._ping_seq += 1
            ping = Ping(seq=self._ping_seq)  # one message to every agent: encoded once
            for host, agent in self.state.agents.items():
                if agent.state in (AgentState.UP, AgentState.UNRESPONSIVE):
                    await self._router.send(AGENT_PREFIX + host.encode(), ping)
            now = self._clock()
            self._apply(self.state.tick(now))
            if self.state.phase is Phase.RUNNING:
                stall = self._stall.tick(
                    now,
                    progress=self._progress(),
                    slowest_step_s=self._intake.slowest_recent_step_s,
                )
                if stall is not None:
                    self._stalled(stall, now)

    def _progress(self) -> tuple[int, ...]:
        """Counters that grow while training moves (for the stall watchdog)."""
        queue = self._dds.queue
        shards = (queue.next_lease_id + queue.done_count) if queue is not None else 0
        return (self._intake.steps_reported, self._intake.updates_reported, shards)

    def _stalled(self, stall: Stall, now: float) -> None:
        """No step and no shard moved for the stall bound: say so, with what each
        process did last, and restart the stuck processes as a retryable failure."""
        procs, targets = stuck_processes(self.state, self._intake.last_step, now)
        stuck = [p["proc"] for p in procs]
        reason = (
            f"no step and no shard moved for {stall.waited_s:.0f} s "
            f"(stall bound {stall.bound_s:.0f} s)"
        )
        log.error("the job stalled: %s; restarting %s", reason, ", ".join(stuck) or "nothing")
        self._recorder.emit(
            "stall",
            reason=reason,
            waited_s=round(stall.waited_s, 1),
            bound_s=round(stall.bound_s, 1),
            procs=procs,
        )
        # Where they are stuck, before they are stopped: py-spy via their agents.
        self._spawn_task(self._restart_stalled(stuck, reason, targets), "stall")

    async def _restart_stalled(
        self, stuck: list[str], reason: str, targets: dict[str, list[str]]
    ) -> None:
        """Record the stuck processes' stacks (bounded wait), then restart them."""
        if targets:
            stacks = await self._stack_requests.collect(targets)
            summary: dict[str, Any] = {}
            for proc_id, text in sorted(stacks.items()):
                host = next(h for h, ids in targets.items() if proc_id in ids)
                self._output.note(proc_id, host, f"stall: Python stacks (py-spy)\n{text}")
                summary[proc_id] = {"frames": innermost_frames(text), "log": f"logs/{proc_id}.log"}
            self._recorder.emit("stall_stacks", stacks=summary)
        now = self._clock()
        self._apply(self.state.stalled(stuck, reason, now))
        self._stall.restarted(now)

    async def _receive_loop(self) -> None:
        while True:
            for peer, msg in await self._router.recv_many(RECEIVE_BATCH):
                try:
                    await self._dispatch(peer, msg)
                except Exception:  # one bad message must never take the supervisor down
                    log.exception("error handling %s from %r", type(msg).__name__, peer)
            if self._dds.has_taken:  # one task answers the batch's fetches and acks
                self._serve(self._dds.answer_taken(), "dds", b"")

    async def _dispatch(self, peer: bytes, msg: Message) -> None:
        now = self._clock()
        if peer.startswith(STATUS_PREFIX):
            return  # read-only peers: they ask on their own socket (StatusTracker.serve)
        if peer.startswith(AGENT_PREFIX):
            await self._from_agent(
                peer, peer[len(AGENT_PREFIX) :].decode("utf-8", "replace"), msg, now
            )
        elif peer.startswith(WORKER_PREFIX):
            await self._from_worker(peer, msg)
        elif peer.startswith(JOIN_PREFIX):
            if self._regroup is not None:  # a prewarmed newcomer waiting to join
                await self._regroup.from_joiner(peer, msg)
        elif isinstance(msg, Hello):
            if msg.run_id != self._run_id:
                log.warning("hello from %r for another run %s; ignored", peer, msg.run_id)
                return
            await self._router.send(
                peer, Welcome(run_id=self._run_id, heartbeat_interval=self._interval)
            )
        elif isinstance(msg, CONTROL_MESSAGES):
            await self._commands.handle(peer, msg, now)
        elif isinstance(msg, Ping):
            return
        else:
            log.debug("unexpected %s from %r", type(msg).__name__, peer)

    async def _from_worker(self, peer: bytes, msg: Message) -> None:
        """Data-sharding requests change the queue here, in arrival order; their
        replies wait in tasks for the WAL fsync they share (group commit)."""
        who = self._workers.worker_of(peer)
        if who is None:
            self._refuse(peer, f"{type(msg).__name__} from no worker of this job")
            return
        rank, attempt = who
        if not self._workers.attempt_counts(rank, attempt):
            # A stale attempt, e.g. on a host that was cut off while its rank
            # restarted elsewhere: it is being fenced; it must not pass for the rank.
            self._refuse(peer, f"{type(msg).__name__} from a replaced attempt of worker {rank}")
            return
        if isinstance(msg, Hello):
            if msg.run_id != self._run_id:
                log.warning("worker %d belongs to run %s; ignored", rank, msg.run_id)
                return
            self._workers.hello(rank, peer)
            await self._router.send(
                peer, Welcome(run_id=self._run_id, heartbeat_interval=self._interval)
            )
            await self._control.worker_greeted(rank, msg.attempt)
            if self._regroup is not None:
                await self._regroup.worker_greeted(rank)  # a resize under way
            if self._fleet is not None:
                self._fleet.worker_greeted(rank)  # a scale's new worker joins the steps
            self._serve(
                self._dds.worker_hello(rank, msg.attempt, list(msg.leases)), f"hello-{rank}", peer
            )
        elif rank not in self._workers.greeted:
            # A worker we have not heard Hello from (we were resumed): it must say
            # which leases it holds before it is served, or shards granted just
            # before the crash, whose answer it never got, would stay its forever.
            await self._router.send(peer, Rehello())
        elif isinstance(msg, DatasetReady):
            # A worker's query for the job's data set (it gave none to init()).
            await self._dds.send_dataset(peer)
        elif isinstance(msg, RegisterPlacement):
            answer = (
                self._placements.register(rank, msg.placement)
                if self._placements is not None
                else PlacementReady(
                    placement=None,
                    error="this job runs no parameter servers; "
                    "start it with dtlaunch run --servers M to use dtlaunch.ps.Client",
                )
            )
            await self._router.send(peer, answer)
        elif isinstance(msg, (FetchShards, AckShards)):
            self._dds.take(peer, rank, msg)  # answered after the batch (_receive_loop)
        elif isinstance(msg, ReleaseShards):
            self._serve(self._dds.release(rank, msg), f"release-{rank}", peer)
        elif isinstance(msg, RegisterDataset):
            self._serve(self._dds.handle(peer, rank, msg), f"dds-{rank}", peer)
        elif isinstance(msg, Attached) and self._regroup is not None:
            self._regroup.attached(rank)
        elif isinstance(msg, RegroupReady) and self._regroup is not None:
            await self._regroup.store_ready(rank, msg)
        elif isinstance(msg, RNA_MESSAGES) and self._rounds is not None:
            await self._rounds.receive(rank, msg)
        elif isinstance(msg, StepReports):
            self._intake.worker_reports(rank, msg)
            if msg.step:
                self.state.worker_progressed(rank)

    async def _send_to_worker(self, rank: int, msg: Message) -> None:
        await self._router.send(self._workers.peer_of(rank), msg)

    def _refuse(self, peer: bytes, why: str) -> None:
        """Log a dropped message, at most once per second per peer: a peer that
        floods us with bad messages must not flood the log too."""
        now = self._clock()
        if now - self._refused_at.get(peer, -math.inf) >= 1.0:
            self._refused_at[peer] = now
            log.warning("dropped a message from %r: %s", peer, why)

    async def _from_agent(self, peer: bytes, host: str, msg: Message, now: float) -> None:
        if host not in self.state.agents:
            log.warning("message from unknown agent %r dropped", host)
            return
        if isinstance(msg, Hello):
            if msg.run_id != self._run_id:
                log.warning("agent %s belongs to run %s; ignored", host, msg.run_id)
                return
            if msg.version != __version__:
                log.warning(
                    "agent %s runs dtlaunch %s, supervisor %s", host, msg.version, __version__
                )
            await self._router.send(
                peer, Welcome(run_id=self._run_id, heartbeat_interval=self._interval)
            )
            self._agents_starter.said_hello(host)
            self._apply(
                self.state.agent_hello(
                    host,
                    now,
                    free_ports=msg.free_ports,
                    host_addr=msg.host_addr,
                    procs=msg.procs,
                    pid=msg.pid,
                    memory_bytes=msg.memory_bytes,
                    limits=msg.limits,
                )
            )
            return
        agent = self.state.agents[host]
        if agent.state in (AgentState.LAUNCHING, AgentState.LOST):
            # We do not know this agent's state (e.g. it reconnected): ask again;
            self.state.heard_before_hello(host, msg)  # the node table keeps its exits
            await self._router.send(peer, Rehello())
            return
        if isinstance(msg, AgentHeartbeat):
            self._apply(self.state.heartbeat(host, now, msg.procs))
            return
        self._apply(self.state.agent_seen(host, now))
        if isinstance(msg, Output):
            self._output.write(msg.proc_id, host, msg.stream, msg.data)
        elif isinstance(msg, Spawned):
            self._output.attempt_started(msg.proc_id, host, msg.attempt, msg.pid)
            self._apply(self.state.spawned(host, msg.proc_id, msg.attempt, msg.pid, now))
        elif isinstance(msg, SpawnFailed):
            self._apply(self.state.spawn_failed(host, msg.proc_id, msg.attempt, msg.error, now))
        elif isinstance(msg, Exited):
            self._output.flush_partial(msg.proc_id, host)
            self._apply(self.state.exited(host, msg, now))
        elif isinstance(msg, Stacks):
            self._stack_requests.answer(host, msg)
        elif isinstance(msg, Bye):
            self._apply(self.state.agent_bye(host, msg.reason, now))
