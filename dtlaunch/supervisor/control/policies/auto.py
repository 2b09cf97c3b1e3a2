"""``auto``: DLRover's brain for a PS job's workers (§4.2: sample, optimize, adjust).

The job starts with the workers ``--workers`` names (one is DLRover's start).

* **sample**: for ``sample_s`` of training with every worker reporting steps and
  every process measured by its agent, take the median of the CPU cores a worker
  uses (``ŵ``), of the cores the servers use for each worker (``ŝ = ŝ_total /
  N_w``) and of the samples/s a worker trains.
* **optimize**: a server at ``hot`` of its CPU or more is moved first (below),
  and the sample is taken again on its new host; then eq. 10-11
  (``solvers.dlrover.plan_workers``; on hosts of different sizes, where a
  worker's CPU share depends on the slot it gets, the problem behind them over
  the slots a scale fills next, ``plan_workers_on_slots``) with ``C_total``
  the cores the hostfile declares (``cpus=``; one a slot where it declares
  none), bounded by the servers' CPU (a server's limit is fixed while it
  runs), the free slots and ``max_workers``: ``SCALE_WORKERS(N_w)``. When the
  servers' CPU is what bounds the plan and the job's servers may scale
  (``scale_servers=1``, the default), eq. 10-11 with their count free
  (``solvers.dlrover.plan_job``): ``SCALE_SERVERS(N_s)`` with the servers that
  carry the model's ``N_w`` below ``hot`` of their CPU, and ``SCALE_WORKERS``,
  within the slots.
* **adjust**, at most every ``interval_s``: servers using less than ``idle`` of
  their CPU take more workers (§4.2's idle-PS rule, at most √N_w more at a
  time) while the last addition raised the throughput by ``min_gain``; a server
  using ``hot`` of its CPU or more, or throttled by its quota in ``throttled``
  of its CPU periods or more (its agent reads the cgroup's cpu.stat: a BSP
  server's bursts hit the quota while its mean use stays below it), is moved
  live to a free spare host (KILL_RESTART of the server, §4.2's hot PS and
  §5.4's bad host).

Every decision carries its inputs and the model's predicted throughput beside
the measured one. Needs the built-in parameter servers; the resources come from
the agents' measurements (``MonitorSnapshot.resources``), so ``replay --policy
auto`` of a run without them decides nothing.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from dtlaunch.errors import InfeasibleError
from dtlaunch.solvers.dlrover import (
    WorkerPlan,
    added_workers,
    busiest_share,
    hot_server_cores,
    plan_job,
    plan_workers,
    plan_workers_on_slots,
    predicted_throughput,
)
from dtlaunch.supervisor.control.actions import (
    Action,
    KillRestart,
    NoAction,
    ScaleServers,
    ScaleWorkers,
)
from dtlaunch.supervisor.control.monitor import JobResources, MonitorSnapshot, ProcessUse
from dtlaunch.supervisor.control.policies.base import ParamReader, read_windows

__all__ = ["AutoPolicy"]

PHASES = ("sample", "adjust")
# Workers' CPU shares further apart than this (the largest over the smallest) are
# hosts of different sizes: eq. 10's equal workers no longer hold.
MIXED_SHARES = 1.01


@dataclass(slots=True)
class _Sample:
    """The sample phase's readings, one per decision: medians decide, so the
    CPU a process spends starting (imports, the servers' seeding) does not."""

    since: float | None = None
    count: int = 0
    worker_cores: list[float] = field(default_factory=list)  # a worker's mean cores
    server_cores: list[float] = field(default_factory=list)  # per worker
    rate: list[float] = field(default_factory=list)  # samples/s per worker

    def add(
        self, now: float, worker_cores: float, server_cores: float, rate: float, n: int
    ) -> None:
        if self.since is None:
            self.since = now
        self.count += 1
        self.worker_cores.append(worker_cores)
        self.server_cores.append(server_cores / n)
        self.rate.append(rate / n)


class AutoPolicy:
    """Size a PS job's workers from measurements; see module doc."""

    name = "auto"

    def __init__(self, params: dict[str, str] | None = None) -> None:
        reader = ParamReader(self.name, params or {})
        self.l_trans, self.l_per, self.lam = read_windows(reader)
        self.sample_s = reader.number("sample_s", 30.0, low=0.0)
        self.interval_s = reader.number("interval_s", 60.0, low=0.0)
        self.max_workers = reader.integer("max_workers", 0, low=0)  # 0: slots bound
        self.min_workers = reader.integer("min_workers", 1, low=1)
        self.idle = reader.number("idle", 0.9, low=0.0, low_open=True)
        self.hot = reader.number("hot", 0.9, low=0.0, low_open=True)
        self.throttled = reader.number("throttled", 0.15, low=0.0, low_open=True)
        self.min_gain = reader.number("min_gain", 0.05, low=0.0)
        self.scale_servers = reader.integer("scale_servers", 1, low=0) > 0
        reader.finish()
        self.phase = "sample"
        self._sample = _Sample()
        self._one_worker_server_cores: float | None = None  # ŝ with the sampled workers
        self._last_action_at = -math.inf
        self._rate_before: float | None = None  # throughput before the last addition
        self._saturated = False
        # server -> its readings: (when, cores used, share of periods throttled)
        self._readings: dict[int, deque[tuple[float, float, float]]] = {}

    # ------------------------------------------------------------------ decide

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        res = snap.resources
        measured = _measured(snap, res)
        if res is None or measured is None:
            return [
                NoAction(
                    reason="auto: waiting for every worker's steps and the agents' CPU "
                    "measurements",
                    inputs={"phase": self.phase},
                )
            ]
        worker_cores, server_cores, rate = measured
        n = len(res.workers)
        for rank, use in res.servers.items():
            readings = self._readings.setdefault(rank, deque())
            readings.append((snap.now, use.cpu_cores, use.cpu_throttled))
            while readings[0][0] < snap.now - self.l_trans:
                readings.popleft()
        inputs = {
            "phase": self.phase,
            "workers": res.worker_count,
            "running_workers": n,
            "worker_cores": round(worker_cores, 3),
            "server_cores": round(server_cores, 3),
            "server_cores_given": round(res.server_cores_given, 3),
            "total_cores": round(res.total_cores, 3),
            "free_worker_slots": res.free_worker_slots,
            "measured_rate": round(rate, 3),
        }
        if res.finished_workers:
            # Scaling now would add workers with nothing left to read, and plan
            # from the ranks still running as if they were the whole job.
            finished = ", ".join(map(str, res.finished_workers))
            return [
                NoAction(
                    reason=f"auto: worker(s) {finished} finished their data: the job is "
                    f"ending; holding {res.worker_count} workers",
                    inputs=inputs,
                )
            ]
        if self.phase == "sample":
            if snap.restart_pending:  # a server moving: its readings are not the job's
                return [NoAction(reason="auto: waiting for a move to settle", inputs=inputs)]
            return self._sampling(snap, res, worker_cores, server_cores, rate, inputs)
        if snap.now - self._last_action_at < self.interval_s or snap.restart_pending:
            return [NoAction(reason="auto: settling after the last change", inputs=inputs)]
        hot = self._hot_server(snap, res, server_cores, n, inputs)
        if hot is not None:
            return [hot]
        return [self._grow(snap.now, res, server_cores, rate, res.worker_count, inputs)]

    # ------------------------------------------------------------------ phases

    def _sampling(
        self,
        snap: MonitorSnapshot,
        res: JobResources,
        worker_cores: float,
        server_cores: float,
        rate: float,
        inputs: dict[str, object],
    ) -> list[Action]:
        now = snap.now
        sample = self._sample
        sample.add(now, worker_cores, server_cores, rate, len(res.workers))
        assert sample.since is not None
        if now - sample.since < self.sample_s or sample.count < 2:
            left = max(0.0, self.sample_s - (now - sample.since))
            return [NoAction(reason=f"auto: sampling, {left:.0f} s to go", inputs=inputs)]
        w_hat = statistics.median(sample.worker_cores)
        s_hat = statistics.median(sample.server_cores)
        one_rate = statistics.median(sample.rate)
        self._one_worker_server_cores = s_hat
        # A hot server first (§4.2): at its quota it bounds every plan, and the
        # spare host it needs would otherwise go to the workers the plan adds.
        hot = self._hot_server(snap, res, server_cores, len(res.workers), inputs)
        if hot is not None:
            self._sample = _Sample()  # sample again once it runs on its new host
            return [hot]
        self.phase = "adjust"
        inputs = {**inputs, "phase": "optimize", "w_hat": round(w_hat, 3), "s_hat": round(s_hat, 3)}
        if w_hat <= 0:
            return [
                NoAction(
                    reason="auto: the workers used no measurable CPU; nothing to size",
                    inputs=inputs,
                )
            ]
        current = res.worker_count
        ceiling = current + res.free_worker_slots
        if self.max_workers:
            ceiling = min(ceiling, self.max_workers)
        try:
            plan, predicted, how = self._worker_plan(
                res,
                w_hat,
                s_hat,
                one_rate,
                min_workers=min(self.min_workers, ceiling),
                max_workers=max(ceiling, 1),
            )
        except InfeasibleError as err:
            return [NoAction(reason=f"auto: no plan ({err})", inputs=inputs)]
        inputs = {
            **inputs,
            "model_workers": round(plan.model_workers, 3),
            "plan_workers": plan.workers,
            "bound": plan.bound,
            "server_cores_plan": round(plan.server_cores, 3),
            "predicted_rate": round(predicted, 3),
            **how,
        }
        if plan.bound == "servers" and res.servers_scalable and self.scale_servers:
            blocks = snap.ps_layout.block_bytes if snap.ps_layout is not None else ()
            both = self._with_servers(
                now, res, w_hat, s_hat, one_rate, rate, plan, inputs, blocks=blocks
            )
            if both:
                return both
        if plan.workers == current:
            return [
                NoAction(
                    reason=f"auto: {current} workers is the plan ({plan.bound})", inputs=inputs
                )
            ]
        self._acted(now, rate if plan.workers > current else None)
        if how:
            why = (
                f"on hosts of different sizes the workers' shares are {how['shares']} cores, "
                f"worth {how['work']:g} sampled workers of w {w_hat:.2f} (eq. 1-4; bound: "
                f"{plan.bound})"
            )
        else:
            why = (
                f"C_total {res.total_cores:g} cores / (w {w_hat:.2f} + s {s_hat:.2f}) = "
                f"{plan.model_workers:.1f} (eq. 10; bound: {plan.bound})"
            )
        return [
            ScaleWorkers(
                count=plan.workers,
                reason=(
                    f"auto: {current} -> {plan.workers} workers: {why}; predicted "
                    f"{predicted:.1f} samples/s against {rate:.1f} measured"
                ),
                inputs=inputs,
            )
        ]

    def _worker_plan(
        self,
        res: JobResources,
        w_hat: float,
        s_hat: float,
        one_rate: float,
        *,
        min_workers: int,
        max_workers: int,
    ) -> tuple[WorkerPlan, float, dict[str, object]]:
        """Eq. 10-11 when every worker's CPU share is alike; on hosts of different
        sizes the problem behind them (eq. 1-4) over the slots a scale fills next
        (``plan_workers_on_slots``). The plan, its predicted samples/s, and the
        slot plan's inputs ({} for eq. 10).

        Raises:
            InfeasibleError: from the solvers.
        """
        given = res.server_cores_given or None
        running = [use.cpu_limit for use in res.workers.values()]
        shares = [*running, *res.free_worker_shares]
        if not running or max(shares) <= MIXED_SHARES * min(shares):
            plan = plan_workers(
                total_cores=res.total_cores,
                worker_cores=w_hat,
                server_cores_per_worker=s_hat,
                server_cores_given=given,
                min_workers=min_workers,
                max_workers=max_workers,
            )
            predicted = predicted_throughput(
                one_worker_rate=one_rate,
                workers=plan.workers,
                server_cores_given=given or math.inf,
                server_cores_per_worker=s_hat,
            )
            return plan, predicted, {}
        # A worker that left part of its share unused needs no more than it used;
        # one that used it all (CPU-bound) uses whatever share it gets.
        demand = w_hat if w_hat < self.hot * statistics.median(running) else math.inf
        slots = plan_workers_on_slots(
            running=running,
            free=res.free_worker_shares,
            worker_cores=w_hat,
            worker_demand=demand,
            server_cores_per_worker=s_hat,
            server_cores_given=given,
            total_cores=res.total_cores,
            min_workers=min_workers,
            max_workers=max_workers,
        )
        used = sum(min(c, demand) for c in shares[: slots.workers])
        plan = WorkerPlan(
            workers=slots.workers,
            model_workers=res.total_cores / (w_hat + s_hat),
            server_cores=max(0.0, res.total_cores - used),
            bound=slots.bound,
        )
        work = slots.sampled_workers if slots.fed is None else min(slots.sampled_workers, slots.fed)
        how: dict[str, object] = {
            "plan": "slots",
            "shares": [round(c, 3) for c in shares[: slots.workers]],
            "work": round(slots.sampled_workers, 3),
            "worker_demand": "inf" if math.isinf(demand) else round(demand, 3),
        }
        return plan, one_rate * work, how

    def _with_servers(
        self,
        now: float,
        res: JobResources,
        w_hat: float,
        s_hat: float,
        one_rate: float,
        rate: float,
        bounded: WorkerPlan,
        inputs: dict[str, object],
        *,
        blocks: Sequence[int],
    ) -> list[Action]:
        """Eq. 10-11 with the servers' count free: more servers (each given what
        a server has now) and the workers they feed, when that beats the plan the
        servers bound; [] when it does not. ``blocks``: the model's block sizes,
        which no server can split: a model in one big block gains nothing from
        more servers."""
        current, servers = res.worker_count, len(res.servers)
        server_limit = statistics.median(use.cpu_limit for use in res.servers.values())
        try:
            plan = plan_job(
                total_cores=res.total_cores,
                worker_cores=w_hat,
                server_cores_per_worker=s_hat,
                server_limit=server_limit,
                workers_now=current,
                servers_now=servers,
                free_slots=res.free_worker_slots,
                load=self.hot,
                min_workers=min(self.min_workers, current + res.free_worker_slots),
                max_workers=self.max_workers or None,
                block_bytes=blocks,
            )
        except InfeasibleError:
            return []
        if plan.workers <= bounded.workers or plan.servers == servers:
            return []
        share = busiest_share(blocks, plan.servers)
        predicted = predicted_throughput(
            one_worker_rate=one_rate,
            workers=plan.workers,
            server_cores_given=server_limit / share,  # the busiest server bounds the steps
            server_cores_per_worker=s_hat,
        )
        inputs = {
            **inputs,
            "plan_workers": plan.workers,
            "plan_servers": plan.servers,
            "busiest_server_share": round(share, 3),
            "bound": plan.bound,
            "server_cores_plan": round(plan.server_cores, 3),
            "server_limit": round(server_limit, 3),
            "predicted_rate": round(predicted, 3),
        }
        self._acted(now, rate)
        reason = (
            f"auto: {current} -> {plan.workers} workers and {servers} -> {plan.servers} "
            f"servers: C_total {res.total_cores:g} cores / (w {w_hat:.2f} + s {s_hat:.2f}) = "
            f"{plan.model_workers:.1f} (eq. 10; bound: {plan.bound}), their updates "
            f"{plan.workers * s_hat:.2f} cores on servers of {server_limit:g} at {self.hot:g}, "
            f"the busiest with {share:.0%} of the bytes (the {servers} server(s) fed "
            f"{bounded.workers}); predicted {predicted:.1f} "
            f"samples/s against {rate:.1f} measured"
        )
        actions: list[Action] = [ScaleServers(count=plan.servers, reason=reason, inputs=inputs)]
        if plan.workers != current:
            actions.append(ScaleWorkers(count=plan.workers, reason=reason, inputs=inputs))
        return actions

    def _hot_server(
        self,
        snap: MonitorSnapshot,
        res: JobResources,
        server_cores: float,
        workers: int,
        inputs: dict[str, object],
    ) -> Action | None:
        """The hottest server, when a spare host can take it (§4.2: a hot PS gets a
        bigger home). Hot: over its readings of the last ``l_trans`` seconds
        (``_typical``) it uses ``hot`` of its CPU or more, or its quota stops it
        in ``throttled`` of its CPU periods or more (a BSP server works in
        bursts: its quota slows every update while its mean use stays below it)."""
        if not snap.spare_hosts or snap.spare_capacity < 1:
            return None
        typical = self._typical(res)
        rank = max(typical, key=lambda r: self._heat_of(typical[r]), default=None)
        if rank is None or self._heat_of(typical[rank]) < 1.0:
            return None
        use = typical[rank]
        del self._readings[rank]  # its next readings are the new process's
        need = hot_server_cores(
            hot_used=use.cpu_cores,
            servers_used=server_cores,
            one_worker_cores=self._one_worker_server_cores or server_cores / max(workers, 1),
            workers=workers,
            max_cores=max(res.host_cores.values(), default=use.cpu_limit),
        )
        self._acted(snap.now, None)
        return KillRestart(
            role="server",
            rank=rank,
            target_host=snap.spare_hosts[0],
            reason=(
                f"auto: server {rank} is hot, {use.cpu_cores:.2f} of its {use.cpu_limit:g} "
                f"cores, throttled in {use.cpu_throttled:.0%} of its CPU periods; it needs "
                f"{need:.2f} for {workers} workers: moved to a spare host"
            ),
            inputs={
                **inputs,
                "hot_server": rank,
                "hot_cores": round(use.cpu_cores, 3),
                "hot_throttled": round(use.cpu_throttled, 3),
                "hot_limit": use.cpu_limit,
                "cores_needed": round(need, 3),
            },
        )

    def _grow(
        self,
        now: float,
        res: JobResources,
        server_cores: float,
        rate: float,
        n: int,
        inputs: dict[str, object],
    ) -> Action:
        """§4.2's idle PS: servers with CPU to spare take more workers, while each
        addition still raises the throughput."""
        if self._rate_before is not None:
            if rate < self._rate_before * (1.0 + self.min_gain):
                self._saturated = True
            self._rate_before = None
        given = res.server_cores_given
        if self._saturated:
            return NoAction(
                reason="auto: the last workers added did not raise the throughput "
                f"by {self.min_gain:.0%}; holding {n}",
                inputs=inputs,
            )
        if given <= 0 or server_cores >= self.idle * given:
            return NoAction(
                reason=f"auto: the servers are busy ({server_cores:.2f} of "
                f"{given:g} cores); holding {n} workers",
                inputs=inputs,
            )
        # With skewed blocks one server can be busy while the others idle: the
        # steps wait for it, and more workers would only wait longer.
        for rank, use in self._typical(res).items():
            if self._heat_of(use, self.idle) >= 1.0:
                return NoAction(
                    reason=f"auto: server {rank} is busy ({use.cpu_cores:.2f} of its "
                    f"{use.cpu_limit:g} cores, throttled in {use.cpu_throttled:.0%} of its CPU "
                    f"periods); holding {n} workers",
                    inputs=inputs,
                )
        more = added_workers(workers=n, server_cores_given=given, server_cores_used=server_cores)
        room = res.free_worker_slots
        if self.max_workers:
            room = min(room, self.max_workers - n)
        more = min(more, room)
        if more <= 0:
            return NoAction(reason="auto: no room for more workers", inputs=inputs)
        self._acted(now, rate)
        return ScaleWorkers(
            count=n + more,
            reason=(
                f"auto: the servers use {server_cores:.2f} of {given:g} cores: {n} -> "
                f"{n + more} workers (idle PS, at most sqrt(N_w) at a time)"
            ),
            inputs={**inputs, "added": more},
        )

    def _typical(self, res: JobResources) -> dict[int, ProcessUse]:
        """Each server's use over its readings of the last ``l_trans`` seconds
        (medians: one heartbeat's share of throttled periods is coarse)."""
        return {
            rank: dataclasses.replace(
                use,
                cpu_cores=statistics.median(c for _, c, _ in self._readings[rank]),
                cpu_throttled=statistics.median(t for _, _, t in self._readings[rank]),
            )
            for rank, use in res.servers.items()
        }

    def _heat_of(self, use: ProcessUse, share: float | None = None) -> float:
        """How loaded a server is against ``share`` of its CPU (default ``hot``):
        1.0 or more when it uses that share or more, or its quota throttles it in
        ``throttled`` of its CPU periods or more (see ``_hot_server``)."""
        share = self.hot if share is None else share
        used = use.cpu_cores / (share * use.cpu_limit) if use.cpu_limit > 0 else 0.0
        return max(used, use.cpu_throttled / self.throttled)

    def _acted(self, now: float, rate_before: float | None) -> None:
        self._last_action_at = now
        self._rate_before = rate_before


def _measured(snap: MonitorSnapshot, res: JobResources | None) -> tuple[float, float, float] | None:
    """(mean worker cores, servers' cores together, job samples/s), or None while
    a worker has no steps in the short window or no CPU measurement yet."""
    if res is None or not res.workers or snap.awaiting_first_report:
        return None
    if any(rank not in snap.worker_short for rank in res.workers):
        return None
    if any(use.cpu_cores < 0 for use in (*res.workers.values(), *res.servers.values())):
        return None
    worker_cores = sum(u.cpu_cores for u in res.workers.values()) / len(res.workers)
    server_cores = sum(u.cpu_cores for u in res.servers.values())
    rate = sum(snap.worker_short[r].throughput for r in res.workers)
    return worker_cores, server_cores, rate
