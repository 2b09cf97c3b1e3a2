"""The straggler control loop's edge (AntDT §V-E): step reports in, actions out.

``ControlLoop`` is where the I/O-free ``Controller`` meets the job:

* **Intake.** Every worker's step reports and every server's applied updates are
  recorded as events, policy or not, so that ``replay`` can plot a run and
  re-decide it offline (columns keep the lines short; ``t`` is when each step
  ended, in the event log's ``mono`` seconds, as worker reports arrive batched).
  Injected straggler delays are recorded apart (``injected``), so a benchmark
  can say what it injected. With a policy, the reports also feed the Controller.
* **Decisions.** Every tick while the job runs, the Controller asks the policy
  when a decision is due; each action is recorded as a ``decision`` event with
  its inputs and carried out here, under the name it was decided with:
  ADJUST_BS and ADJUST_LR go to every worker named, for the same step;
  BACKUP_WORKERS to the parameter servers (``psfleet``); KILL_RESTART as a live
  server move (``psfleet``), a regroup around the survivors (``regroup``) or a
  restart by the node table (``jobstate``); REASSIGN_BLOCKS to ``psfleet``.

The batch plan lives in the Controller; a restarted worker is given its share
of it as soon as it says Hello (``worker_greeted``).
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.control.actions import (
    AdjustBatchSize,
    AdjustLR,
    BackupWorkers,
    KillRestart,
    ReassignBlocks,
    RnaGroups,
    ScaleServers,
    ScaleWorkers,
    action_fields,
)
from dtlaunch.supervisor.control.controller import Controller, TickGrid
from dtlaunch.supervisor.control.monitor import DataEnd, JobResources, ProcessUse
from dtlaunch.supervisor.jobstate import Command, JobState, Phase, ProcSlot, ProcState
from dtlaunch.wire import messages as wire
from dtlaunch.wire.messages import Message, PsUpdate, StepReports
from dtlaunch.wire.messages.steering import SECONDS_DIGITS

__all__ = [
    "ActionTargets",
    "ControlLoop",
    "ReportIntake",
    "Scaler",
    "ServerMover",
    "WorkerReplacer",
    "job_resources",
    "to_message",
]

log = logging.getLogger(__name__)

RECENT_STEPS = 32  # per node, for the stall watchdog's adaptive bound


def to_message(action: AdjustBatchSize | AdjustLR) -> wire.AdjustBatchSize | wire.AdjustLR:
    """The message that carries a global action to the workers: same name, same
    plan, without the decision's reason and inputs (those go to the event log)."""
    if isinstance(action, AdjustBatchSize):
        return wire.AdjustBatchSize(
            sizes=[
                wire.RankBatch(rank=r, batch_size=b, accumulation=action.accumulations.get(r, 1))
                for r, b in sorted(action.sizes.items())
            ],
            apply_at_step=action.apply_at_step,
        )
    return wire.AdjustLR(
        factors=[wire.RankFactor(rank=r, factor=f) for r, f in sorted(action.factors.items())],
        apply_at_step=action.apply_at_step,
    )


class ServerMover(Protocol):
    """What carries BACKUP_WORKERS and a server's KILL_RESTART (``psfleet``)."""

    def set_backup(self, count: int) -> None: ...

    def kill_restart(self, action: KillRestart, now: float) -> bool:
        """False when the server cannot move (then it is restarted in place)."""
        ...

    def reassign(self, action: ReassignBlocks, now: float) -> bool:
        """False when the blocks cannot move now (another move under way)."""
        ...


# SCALE_WORKERS(count) or SCALE_SERVERS(count) at ``now`` for ``reason``: None
# when done, else why not.
Scaler = Callable[[int, float, str], str | None]


def job_resources(state: JobState) -> JobResources:
    """The running processes' last measurements (``cpu_percent`` of one CPU from
    their agents' heartbeats) and the capacity the hostfile declares: ``cpus=``,
    else one core a slot. A process without its own CPU limit may use its
    share of its host's cores."""
    cores = {
        host: state.limits.host_cpus.get(host) or float(n) for host, n in state.host_slots.items()
    }

    def share(host: str) -> float:
        return cores.get(host, 1.0) / max(1, state.host_slots.get(host, 1))

    def use(slot: ProcSlot) -> ProcessUse:
        return ProcessUse(
            host=slot.host,
            cpu_cores=slot.cpu_percent / 100.0 if slot.rss_bytes else -1.0,
            cpu_limit=slot.cpu_limit or share(slot.host),
            rss_bytes=slot.rss_bytes,
            memory_limit=slot.memory_limit,
            cpu_throttled=slot.cpu_throttled,
        )

    running = [s for s in state.procs.values() if s.state is ProcState.RUNNING]
    workers = [s for s in state.procs.values() if s.role == "worker"]
    return JobResources(
        workers={s.rank: use(s) for s in running if s.role == "worker"},
        servers={s.rank: use(s) for s in running if s.role == "server"},
        host_cores=cores,
        free_worker_slots=state.free_worker_slots(),
        free_worker_shares=tuple(
            state.limits.first_cpus(host) or share(host) for host in state.free_worker_hosts()
        ),
        servers_scalable=state.builtin_ps and not state.tf_tasks and state.ps_map_servers > 0,
        job_workers=len(workers),
        finished_workers=tuple(sorted(s.rank for s in workers if s.state is ProcState.SUCCEEDED)),
    )


class WorkerReplacer(Protocol):
    """What replaces a worker around its survivors (``regroup``)."""

    async def kill_restart(self, action: KillRestart, now: float) -> None: ...

    async def kill_restart_many(self, actions: list[KillRestart], now: float) -> None:
        """Several workers replaced together (a slow host's): one regroup."""
        ...

    def check_timeout(self, now: float) -> None: ...

    def replacing(self) -> bool:
        """Whether a replacement is still in flight (until the newcomer joined)."""
        ...


class RnaPartitioner(Protocol):
    """RNA's round service: RNA_GROUPS (hierarchical RNA's groups)."""

    async def partition(self, groups: Sequence[Sequence[int]], reason: str) -> str | None:
        """Why the groups cannot change now, or None (done)."""
        ...


class ActionTargets:
    """Who carries out the actions that are not messages to the workers."""

    def __init__(
        self,
        *,
        state: JobState,
        apply: Callable[[list[Command]], None],
        servers: ServerMover | None = None,
        workers: WorkerReplacer | None = None,
        scale: Scaler | None = None,
        scale_servers: Scaler | None = None,
        rna: RnaPartitioner | None = None,
    ) -> None:
        self.state = state
        self.apply = apply  # carries out the node table's commands
        self.servers = servers  # the built-in parameter servers, when the job has them
        self.workers = workers  # allreduce mode: regroups around the survivors
        self.scale = scale  # SCALE_WORKERS, as dtlaunch scale does it
        self.scale_servers = scale_servers  # SCALE_SERVERS, as dtlaunch scale --servers
        self.rna = rna  # RNA_GROUPS: --policy rna's round service


class ReportIntake:
    """Step reports of workers and servers: into the event log and the Controller."""

    def __init__(
        self,
        controller: Controller | None,
        *,
        recorder: EventRecorder,
        clock: Callable[[], float],
    ) -> None:
        self.controller = controller  # None: --policy none (reports are still recorded)
        self._recorder = recorder
        self._clock = clock
        # For the stall watchdog: what moved, and how slow a step can be.
        self.steps_reported = 0
        self.updates_reported = 0
        self._recent_bpt: dict[tuple[str, int], deque[float]] = {}
        self.last_step: dict[int, tuple[int, float]] = {}  # rank -> (step, when it arrived)

    def slowest_recent_step_s(self) -> float:
        """The slowest of the last steps of every node (worker BPT, server update)."""
        return max((max(times) for times in self._recent_bpt.values() if times), default=0.0)

    def _note_times(self, role: str, rank: int, seconds: list[float]) -> None:
        recent = self._recent_bpt.setdefault((role, rank), deque(maxlen=RECENT_STEPS))
        recent.extend(seconds)

    def worker_reports(self, rank: int, reports: StepReports) -> None:
        """A batch of worker ``rank``'s step reports: recorded, then fed."""
        now = self._clock()
        at, reports = self._recorder.elapsed(), reports.in_step_order()
        digits = SECONDS_DIGITS
        # The columns as the worker sent them (its SDK rounds the seconds), plus
        # when each step ended on the job's clock.
        columns: dict[str, Any] = {
            "step": reports.step,
            "batch_size": reports.batch_size,
            "compute_s": reports.compute_s,
            "comm_s": reports.comm_s,
            "samples": reports.samples,
            "injected_s": reports.injected_s,
            "t": [round(at - age if age < at else 0.0, digits) for age in reports.age_s],
        }
        if reports.servers:
            # PS mode: per step, [server, bytes, seconds] of each server it exchanged with.
            columns["servers"] = [
                [[c.server, c.nbytes, c.comm_s] for c in comms] for comms in reports.servers
            ]
        self._recorder.emit("reports", role="worker", rank=rank, **columns)
        self.steps_reported += len(reports.step)
        self._note_times("worker", rank, list(map(operator.add, reports.compute_s, reports.comm_s)))
        if reports.step:
            self.last_step[rank] = (reports.step[-1], now)
        if self.controller is not None:
            self.controller.observe(rank, reports, now)
        if any(reports.injected_s):
            self._record_injected(
                "worker",
                rank,
                sum(reports.injected_s),
                [step for step, s in zip(reports.step, reports.injected_s, strict=True) if s],
            )

    def server_updates(self, rank: int, updates: list[PsUpdate], *, server_now: float) -> None:
        """A server's applied updates (AntDT §II: T_s), as polled by ``psfleet``:
        ``server_now`` is the server's clock when it answered, so each update's
        age (``server_now - ended_s``) places it in time here."""
        if not updates:
            return
        now = self._clock()
        ordered = sorted(updates, key=lambda u: u.version)
        ages = [max(0.0, server_now - u.ended_s) if u.ended_s > 0 else 0.0 for u in ordered]
        at = self._recorder.elapsed()
        self._recorder.emit(
            "server_reports",
            role="server",
            rank=rank,
            version=[u.version for u in ordered],
            update_s=[round(u.update_s, 6) for u in ordered],
            injected_s=[round(u.injected_s, 6) for u in ordered],
            dropped=[list(u.dropped) for u in ordered],
            t=[round(max(0.0, at - age), 6) for age in ages],
        )
        self.updates_reported += len(ordered)
        self._note_times("server", rank, [u.update_s for u in ordered])
        if self.controller is not None:
            self.controller.observe_server(rank, ordered, now, ages=ages)
        slowed = [u.version for u in ordered if u.injected_s]
        self._record_injected("server", rank, sum(u.injected_s for u in ordered), slowed)

    def _record_injected(self, role: str, rank: int, delay_s: float, steps: list[int]) -> None:
        if delay_s > 0:
            self._recorder.emit(
                "injected", role=role, rank=rank, delay_s=round(delay_s, 4), steps=steps
            )


class ControlLoop:
    """Decisions every tick while the job runs, carried out (see module doc)."""

    def __init__(
        self,
        controller: Controller | None,
        *,
        recorder: EventRecorder,
        send_to_worker: Callable[[int, Message], Awaitable[None]],
        targets: ActionTargets,
        remaining_steps: Callable[[], int | None],
        clock: Callable[[], float],
        tick_s: float,
        data_end: Callable[[], DataEnd | None] = lambda: None,
    ) -> None:
        self.controller = controller  # None: --policy none (nothing to decide)
        self._recorder = recorder
        self._send_to_worker = send_to_worker  # to the rank's current attempt
        self._targets = targets
        self._remaining_steps = remaining_steps
        self._data_end = data_end
        self._clock = clock
        self._tick_s = tick_s

    def actions_taken(self) -> dict[str, int]:
        """Actions by name (AntDT Table II), for the summary."""
        return dict(self.controller.counts) if self.controller is not None else {}

    def worker_gone(self, rank: int) -> None:
        if self.controller is not None:
            self.controller.worker_gone(rank)

    async def worker_greeted(self, rank: int, attempt: int) -> None:
        """A restarted worker starts with the nominal batch size: give it its
        share of the plan in force at once (step 0: "from your next step")."""
        if self.controller is None or attempt == 0:
            return
        plan = self.controller.batch_plan
        if rank in plan:
            in_force = AdjustBatchSize(
                sizes=dict(plan),
                apply_at_step=0,
                accumulations=dict(self.controller.accumulation_plan),
            )
            await self._send_to_worker(rank, to_message(in_force))

    # ------------------------------------------------------------- decisions

    async def run(self) -> None:
        """Decide while the job runs, until cancelled (nothing to do without a policy)."""
        if self.controller is None:
            return
        # Ticks fall on a fixed grid from here, recorded so that ``replay --policy``
        # ticks on the same one: a sleep of one tick after each tick's work would
        # drift by that work, and a replay on its own grid would then see a
        # different cut of the reports at each decision.
        grid = TickGrid(self._clock(), self._tick_s)
        self._recorder.emit(
            "control_schedule", tick_s=grid.tick_s, interval_s=self.controller.interval
        )
        while True:
            await asyncio.sleep(grid.wait_s(self._clock()))
            now = self._clock()
            scheduled = grid.arrived(now)
            if self._targets.state.phase is Phase.RUNNING:
                await self.decide(now, scheduled=scheduled)
                if self._targets.workers is not None:
                    self._targets.workers.check_timeout(now)

    async def decide(self, now: float, *, scheduled: float | None = None) -> None:
        """Ask the policy; record each decision with its inputs; carry it out.
        ``scheduled``: the tick's grid time (``now`` less the loop's lateness)."""
        assert self.controller is not None
        if not self.controller.due(now, scheduled=scheduled):
            return
        decided = self.controller.decide(
            now,
            scheduled=scheduled,
            remaining_steps=self._remaining_steps(),
            data_end=self._data_end(),
            free_spare_hosts=self._targets.state.free_spare_hosts(),
            worker_hosts=self._targets.state.worker_hosts(),
            replacing=self._targets.workers is not None and self._targets.workers.replacing(),
            resources=job_resources(self._targets.state),
        )
        replaced: list[KillRestart] = []  # workers around survivors: one regroup for all
        for action in decided:
            self._recorder.emit(
                "decision", policy=self.controller.policy.name, **action_fields(action)
            )
            if (
                isinstance(action, KillRestart)
                and action.role == "worker"
                and self._targets.workers is not None
            ):
                replaced.append(action)
                continue
            if isinstance(action, AdjustBatchSize):
                message = to_message(action)
                for rank in action.sizes:
                    await self._send_to_worker(rank, message)
            elif isinstance(action, AdjustLR):
                message = to_message(action)
                for rank in action.factors:
                    await self._send_to_worker(rank, message)
            elif isinstance(action, BackupWorkers):
                if self._targets.servers is not None:
                    self._targets.servers.set_backup(action.count)
                else:
                    log.warning("BACKUP_WORKERS needs the built-in parameter servers; ignored")
            elif isinstance(action, KillRestart):
                await self._kill_restart(action, now)
            elif isinstance(action, ScaleWorkers | ScaleServers):
                workers = isinstance(action, ScaleWorkers)
                scale = self._targets.scale if workers else self._targets.scale_servers
                refused = (
                    scale(action.count, now, f"{action.NAME} by the policy")
                    if scale is not None
                    else f"this job cannot change its {'workers' if workers else 'servers'}"
                )
                if refused is not None:
                    log.warning("%s(%d) not carried out: %s", action.NAME, action.count, refused)
            elif isinstance(action, RnaGroups):
                rna = self._targets.rna
                refused = (
                    await rna.partition(action.groups, action.reason)
                    if rna is not None
                    else "this job runs no RNA rounds"
                )
                if refused is not None:
                    log.warning("RNA_GROUPS %s not carried out: %s", action.groups, refused)
                    refusal_heard = getattr(self.controller.policy, "groups_refused", None)
                    if callable(refusal_heard):
                        refusal_heard()
            elif isinstance(action, ReassignBlocks):
                servers = self._targets.servers
                if servers is None or not servers.reassign(action, now):
                    log.warning("REASSIGN_BLOCKS cannot start now; the policy decides again")
                    self.controller.reassignment_over()
        if replaced and self._targets.workers is not None:
            await self._targets.workers.kill_restart_many(replaced, now)

    async def _kill_restart(self, action: KillRestart, now: float) -> None:
        servers, workers, state = self._targets.servers, self._targets.workers, self._targets.state
        if action.role == "server" and servers is not None and servers.kill_restart(action, now):
            return  # moved live onto a spare host
        if workers is not None:
            await workers.kill_restart(action, now)
            return
        self._targets.apply(
            state.kill_restart(
                action.role,
                action.rank,
                action.reason,
                now,
                target_host=state.free_spare(action.target_host),
            )
        )
