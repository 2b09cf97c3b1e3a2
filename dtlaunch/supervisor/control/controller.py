"""The Controller (AntDT §V-E): feeds the Monitor and asks the policy every interval.

I/O-free: reports and time come in, actions go out; the supervisor carries the
actions out and records each decision, with what it saw, as an event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.control.actions import (
    Action,
    AdjustBatchSize,
    KillRestart,
    NoAction,
    ReassignBlocks,
    action_name,
)
from dtlaunch.supervisor.control.monitor import (
    DataEnd,
    JobResources,
    MonitorSnapshot,
    PsLayout,
    WorkerDevice,
)
from dtlaunch.supervisor.control.policies import monitor_for
from dtlaunch.supervisor.control.policies.base import Policy
from dtlaunch.wire.messages import PsUpdate, StepReports


def host_device(host: HostSpec) -> WorkerDevice:
    """The device a hostfile line declares (``class=``, ``bmin=``, ``bmax=``)."""
    return WorkerDevice(
        host=host.label,
        device_class=host.device_class,
        min_batch=host.min_batch,
        max_batch=host.max_batch,
    )


_GRID_ROUNDING_S = 1e-6  # anchor + k x tick may land a hair before anchor + interval


class TickGrid:
    """The control loop's ticks: ``anchor + k x tick``, whatever each tick's work
    took (a sleep of one tick after the work would drift by the work). A tick the
    loop missed while blocked is skipped, not caught up."""

    def __init__(self, anchor: float, tick_s: float) -> None:
        if not tick_s > 0:
            raise ValueError(f"tick must be > 0, got {tick_s}")
        self.anchor, self.tick_s = anchor, tick_s
        self._k = 0  # the last tick handed out

    def wait_s(self, now: float) -> float:
        """How long to sleep from ``now`` until the next tick."""
        return max(0.0, self.anchor + (self._k + 1) * self.tick_s - now)

    def arrived(self, now: float) -> float:
        """The grid time of the tick a wake-up at ``now`` serves (the latest one
        passed, never one already served)."""
        self._k = max(self._k + 1, int((now - self.anchor) / self.tick_s))
        return self.anchor + self._k * self.tick_s


class Controller:
    def __init__(
        self,
        policy: Policy,
        *,
        interval: float,
        spare_hosts: list[str],
        host_devices: Mapping[str, WorkerDevice] | None = None,
    ) -> None:
        """``host_devices``: host -> its device as the hostfile declares it."""
        self.policy = policy
        self.interval = interval
        self.monitor = monitor_for(policy)
        self.monitor.set_spare_capacity(len(spare_hosts), hosts=spare_hosts)
        self.counts: Counter[str] = Counter()
        self.plan = ""  # the reason of the policy's latest decision, an action or not
        # The batch plan in force: rank -> local batch size of the last ADJUST_BS.
        # The one copy: policies see it in their snapshot, a restarted worker or a
        # regroup's newcomer is given its rank's share of it.
        self.batch_plan: dict[int, int] = {}
        # rank -> passes per step of the last ADJUST_BS that set them (dd); absent: 1
        self.accumulation_plan: dict[int, int] = {}
        self._next_decision = 0.0
        self._restarting: set[tuple[str, int]] = set()
        self._moving: set[int] = set()  # servers in a live move (ps_servers)
        # KILL_RESTART cost, measured: from the decision to the new process's first
        # step report (the survivors wait that long in an allreduce job).
        self._restart_began: dict[int, float] = {}
        self._replaced: set[int] = set()  # ranks whose old process has ended
        self.restart_cost_s: float | None = None  # workers
        self.server_restart_cost_s: float | None = None  # servers: a move costs another price
        self._host_devices = dict(host_devices or {})
        self._worker_hosts: dict[int, str] = {}  # rank -> host it runs on, as last told
        # PS mode: the placement map in force, and a REASSIGN_BLOCKS still being carried out
        self.ps_layout: PsLayout | None = None
        self.reassigning = False
        self.reassign_cost_s: float | None = None  # the last one's pause, as measured
        self._last_view: MonitorSnapshot | None = None  # the last decision's

    def observe(self, rank: int, reports: StepReports, now: float) -> None:
        """Feed a worker's step reports (idle ones too: the Monitor knows which
        steps say nothing about a worker's speed)."""
        if not reports.step:
            return
        if rank in self._replaced:
            self._replaced.discard(rank)
            began = self._restart_began.pop(rank, None)
            if began is not None:
                self.restart_cost_s = max(0.0, now - min(reports.age_s) - began)
        reports = reports.in_step_order()
        self.monitor.report_steps(
            rank,
            ends=[now - age if age < now else 0.0 for age in reports.age_s],
            steps=reports.step,
            batch_sizes=[size if size > 1 else 1 for size in reports.batch_size],
            compute_s=reports.compute_s,
            comm_s=reports.comm_s,
            samples=reports.samples,
            server_samples=[
                tuple((c.server, c.nbytes, c.comm_s) for c in comms) for comms in reports.servers
            ],
        )

    def placement_changed(self, layout: PsLayout) -> None:
        """The job's parameter-server placement map is now ``layout`` (the first
        worker's, or a reassignment's once committed)."""
        self.ps_layout = layout

    def reassignment_over(self, cost_s: float | None = None) -> None:
        """A REASSIGN_BLOCKS was carried out (``cost_s``: the workers' pause it
        cost, the price of the next) or given up (the map says which)."""
        self.reassigning = False
        if cost_s is not None:
            self.reassign_cost_s = max(0.0, cost_s)

    def observe_server(
        self, rank: int, updates: list[PsUpdate], now: float, *, ages: list[float] | None = None
    ) -> None:
        """Feed a server's applied updates (its T_s), each ``ages[i]`` seconds old."""
        if updates and ("server", rank) in self._restarting and rank not in self._moving:
            # A server restarted in place (no move) is back: the restart is over.
            self._restarting.discard(("server", rank))
        for i, update in enumerate(updates):
            at = max(0.0, now - (ages[i] if ages is not None else 0.0))
            self.monitor.report_server(rank, now=at, step=update.version, update_s=update.update_s)

    def server_moving(self, rank: int) -> None:
        """A server KILL_RESTART is being carried out as a live move."""
        self._moving.add(rank)

    def server_replaced(self, rank: int, cost_s: float) -> None:
        """Server ``rank``'s blocks now live in a new process: its windows start
        over, and what the move cost the job (the workers' pause) is the price of
        the next KILL_RESTART."""
        self.monitor.server_gone(rank)
        self._restarting.discard(("server", rank))
        self._moving.discard(rank)
        self.server_restart_cost_s = max(0.0, cost_s)

    def server_removed(self, rank: int) -> None:
        """A scale-in stopped server ``rank``: nothing of it is judged any more."""
        self.monitor.server_gone(rank)
        self._restarting.discard(("server", rank))
        self._moving.discard(rank)

    def server_restart_failed(self, rank: int) -> None:
        """A server move gave up: the server is judged again from scratch."""
        self.monitor.server_gone(rank)
        self._restarting.discard(("server", rank))
        self._moving.discard(rank)

    def restart_measured(self, rank: int, cost_s: float) -> None:
        """What replacing ``rank`` cost the job, measured by whoever carried it out
        (an elastic regroup: only the survivors' pause, not the replacement's start)."""
        self.restart_cost_s = max(0.0, cost_s)
        self._restart_began.pop(rank, None)
        self._replaced.discard(rank)

    def group_resized(self) -> None:
        """An allreduce group re-formed with another size: every worker trains its
        equal share of the global batch in one pass, so no earlier plan holds."""
        self.batch_plan.clear()
        self.accumulation_plan.clear()

    def worker_gone(self, rank: int) -> None:
        """A worker ended: its windows start empty, its restart (if ours) is over."""
        self.monitor.worker_gone(rank)
        self._restarting.discard(("worker", rank))
        if rank in self._restart_began:
            self._replaced.add(rank)

    def due(self, now: float, *, scheduled: float | None = None) -> bool:
        """Whether ``decide`` at ``now`` would decide (else it returns nothing): its
        inputs cost a walk over every process, not worth taking every tick.

        ``scheduled``: the tick's time on its caller's grid (``now`` is later by
        the event loop's lateness). The schedule counts in grid time, so a tick
        less late than the previous deciding one is still due; the tolerance
        absorbs the grid's float rounding.
        """
        return (now if scheduled is None else scheduled) >= self._next_decision - _GRID_ROUNDING_S

    def recent_view(self, now: float) -> MonitorSnapshot:
        """The Monitor's view for a reader that needs none fresher than the
        policy's (the status's stragglers): the last decision's while it is at
        most a control interval old, else a fresh one. A fresh view of 1,000
        workers costs ~20 ms of the supervisor's loop, a quarter of a status
        answer, and the straggler column then says what the policy saw."""
        last = self._last_view
        if last is not None and 0.0 <= now - last.now <= self.interval:
            return last
        return self.monitor.snapshot(now)

    def decide(
        self,
        now: float,
        *,
        remaining_steps: int | None,
        data_end: DataEnd | None = None,
        scheduled: float | None = None,
        free_spare_hosts: list[str] | None = None,
        worker_hosts: Mapping[int, str] | None = None,
        replacing: bool = False,
        resources: JobResources | None = None,
    ) -> list[Action]:
        """The policy's actions when a decision is due, else nothing.

        ``data_end``: once no shard is left to hand out, what each worker holds
        (``MonitorSnapshot.data_end``).
        ``scheduled``: the tick's grid time (see ``due``).
        ``free_spare_hosts``: the spare hosts with nothing running now (None: keep
        the list given at construction, e.g. when re-deciding offline).
        ``worker_hosts``: rank -> the host each worker runs on now (None: as last told).
        ``replacing``: a worker's replacement is still joining the group (its
        predecessor may have ended already): the restart has not settled.
        ``resources``: the processes' measured use and the declared capacity.
        """
        if not self.due(now, scheduled=scheduled):
            return []
        self._next_decision = (now if scheduled is None else scheduled) + self.interval
        if free_spare_hosts is not None:
            self.monitor.set_spare_capacity(len(free_spare_hosts), hosts=free_spare_hosts)
        if worker_hosts is not None:
            self._worker_hosts = dict(worker_hosts)
        snap = self.monitor.snapshot(
            now,
            remaining_steps=remaining_steps,
            data_end=data_end,
            restart_pending=bool(self._restarting) or replacing,
            restart_cost_s=self.restart_cost_s,
            server_restart_cost_s=self.server_restart_cost_s,
            batch_plan=self.batch_plan,
            accumulation_plan=self.accumulation_plan,
            devices=self._devices(),
            ps_layout=self.ps_layout,
            reassign_pending=self.reassigning,
            reassign_cost_s=self.reassign_cost_s,
            resources=resources,
        )
        self._last_view = snap
        decided = self.policy.decide(snap)
        if decided:  # what the policy did, else why it held (status shows it)
            self.plan = decided[-1].reason
        actions = [a for a in decided if not isinstance(a, NoAction)]
        for action in actions:
            self.counts[action_name(action)] += 1
            if isinstance(action, AdjustBatchSize):
                self.batch_plan.update(action.sizes)
                for rank in action.sizes:
                    self.accumulation_plan[rank] = action.accumulations.get(rank, 1)
            if isinstance(action, ReassignBlocks):
                self.reassigning = True
            if isinstance(action, KillRestart):
                self._restarting.add((action.role, action.rank))
                if action.role == "worker":
                    self._restart_began[action.rank] = now
        return actions

    def _devices(self) -> dict[int, WorkerDevice]:
        """rank -> the device of the host it runs on (a bare host when undeclared)."""
        return {
            rank: self._host_devices.get(host) or WorkerDevice(host=host)
            for rank, host in sorted(self._worker_hosts.items())
        }
