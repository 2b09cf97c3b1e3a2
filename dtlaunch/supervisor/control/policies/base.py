"""What every policy shares: the ``Policy`` protocol, defaults, parameter parsing,
and the batch balancer behind ADJUST_BS (AntDT eq. 3).

Default windows and lambda, chosen for jobs of minutes to days:

- ``lambda = 1.5``: the value of AntDT's experiments; the paper advises > 1.3, and
  below that ordinary step-time noise on shared machines raises false alarms.
- ``l_trans = 60 s``: AntDT used 5 min for jobs of hours, but a job of a few
  minutes would end before a 5-minute window filled. One minute still averages
  tens of steps, and catches contention while it lasts.
- ``l_per = 300 s``: five short windows, so a burst shorter than a few minutes
  never makes a node look persistent, and the expensive KILL_RESTART (tens of
  seconds) is only considered after minutes of evidence. Day-long jobs reproduce
  the paper with ``nd:l_trans=300,l_per=600``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Protocol

from dtlaunch.errors import ConfigError
from dtlaunch.solvers.batch import InfeasibleError, solve_batch_sizes
from dtlaunch.solvers.dd import solve_dd_workers
from dtlaunch.solvers.tail import raise_for_tail
from dtlaunch.supervisor.control.actions import Action, AdjustBatchSize
from dtlaunch.supervisor.control.monitor import DataEnd, MonitorSnapshot, WindowStats

DEFAULT_LAMBDA = 1.5
DEFAULT_L_TRANS = 60.0
DEFAULT_L_PER = 300.0
DEFAULT_MARGIN = 0.05  # rebalance only if the makespan is > 5 % above the optimum
# Throughputs within 3 % of the median count as the median: step-time noise on a
# shared machine is of that order, and chasing it moves a record back and forth
# between equally fast workers (each move lengthens some steps).
DEFAULT_TOLERANCE = 0.03
DEFAULT_APPLY_AFTER = 10  # steps: > report batching + decision + broadcast latency
# A plan must gain more than this many standard errors of the mean step time of
# the worker that sets the current makespan (Balancer.propose): the slowest of
# eight equally noisy means is about 1.4 of them above the rest by chance alone.
DEFAULT_NOISE_Z = 3.0


class Policy(Protocol):
    """A straggler-mitigation solution the Controller runs every interval.

    ``l_trans``/``l_per`` (seconds) and ``lam`` (slowness ratio lambda) tell the
    caller how to build the Monitor (``Monitor(l_trans=p.l_trans, l_per=p.l_per)``).
    ``decide`` must be quick and must not do I/O; it returns at least one action
    (``NoAction`` with its reason when there is nothing to do).
    """

    name: str
    l_trans: float
    l_per: float
    lam: float

    def decide(self, snap: MonitorSnapshot) -> list[Action]: ...


class ParamReader:
    """Typed access to a policy's ``k=v`` parameters with errors naming the fix."""

    def __init__(self, policy: str, raw: dict[str, str]) -> None:
        self.policy = policy
        self._raw = dict(raw)
        self._known: list[str] = []

    def number(self, key: str, default: float, *, low: float, low_open: bool = False) -> float:
        """A float >= ``low`` (> ``low`` if ``low_open``)."""
        self._known.append(key)
        text = self._raw.get(key)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > low if low_open else value >= low)
        if not ok:
            bound = f"> {low:g}" if low_open else f">= {low:g}"
            raise ConfigError(f"policy {self.policy}: {key} must be a number {bound}, got {text!r}")
        return value

    def integer(self, key: str, default: int, *, low: int) -> int:
        """An int >= ``low``."""
        self._known.append(key)
        text = self._raw.get(key)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise ConfigError(
                f"policy {self.policy}: {key} must be an integer >= {low}, got {text!r}"
            )
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        """One of ``choices``."""
        self._known.append(key)
        text = self._raw.get(key, default)
        if text not in choices:
            raise ConfigError(
                f"policy {self.policy}: {key} must be one of {', '.join(choices)}, got {text!r}"
            )
        return text

    def finish(self) -> None:
        """Refuse parameters nobody asked for (typos must not pass silently)."""
        unknown = sorted(set(self._raw) - set(self._known))
        if unknown:
            valid = ", ".join(self._known) or "(none)"
            raise ConfigError(
                f"policy {self.policy}: unknown parameter {', '.join(unknown)}; "
                f"valid parameters: {valid}"
            )


def read_windows(params: ParamReader) -> tuple[float, float, float]:
    """``(l_trans, l_per, lambda)`` from the parameters every built-in accepts."""
    l_trans = params.number("l_trans", DEFAULT_L_TRANS, low=0.0, low_open=True)
    l_per = params.number("l_per", max(DEFAULT_L_PER, l_trans), low=0.0, low_open=True)
    lam = params.number("lambda", DEFAULT_LAMBDA, low=1.0, low_open=True)
    if l_per < l_trans:
        raise ConfigError(
            f"policy {params.policy}: l_per ({l_per:g} s) must be >= l_trans ({l_trans:g} s)"
        )
    return l_trans, l_per, lam


def read_balancer(params: ParamReader) -> Balancer:
    """The ``Balancer`` from the ``margin min_batch apply_after tolerance noise``
    parameters."""
    return Balancer(
        margin=params.number("margin", DEFAULT_MARGIN, low=0.0),
        min_batch=params.integer("min_batch", 1, low=1),
        apply_after=params.integer("apply_after", DEFAULT_APPLY_AFTER, low=1),
        tolerance=params.number("tolerance", DEFAULT_TOLERANCE, low=0.0),
        noise_z=params.number("noise", DEFAULT_NOISE_Z, low=0.0),
    )


def within_tolerance(v: list[float], tolerance: float) -> list[float]:
    """``v`` with every throughput within ``tolerance`` of the median set to it."""
    if tolerance <= 0 or not v:
        return list(v)
    mid = statistics.median(v)
    return [mid if abs(x - mid) <= tolerance * mid else x for x in v]


class Balancer:
    """ADJUST_BS planning shared by ``lb-bsp`` and ``nd``, with hysteresis.

    Workers with a report in the short window are balanced among themselves with
    their current sizes' sum as the global batch (so the total never changes);
    workers absent from the window keep their size. Throughputs within
    ``tolerance`` of the median are taken as equal to it (noise, not speed). A
    plan is emitted only when the current makespan exceeds the optimum by more
    than ``margin`` and no earlier plan is still waiting for its ``apply_at_step``,
    and none before every placed worker has sent its first report (the first
    decision would otherwise split the batch among whoever reported first).

    Nor when the gain is within the noise: it must exceed ``noise_z`` standard
    errors of the mean step time of the worker that sets the current makespan
    (the windows' pooled spread, ``pooled_sd``, over the square root of its
    steps). Why: where step times vary a lot from step to step (random delays,
    a busy shared host) the slowest of a few steps' means is slow by chance,
    and the next window's is another worker. Each plan chasing it moved records
    to whoever was lucky, the sizes drifted apart plan after plan, down to
    batches of 1 (benchmarks/rna.py scenario a: 17 plans for delays alike on
    every worker, then a tail of tiny steps that diverged). Windows that hold
    no spread yet (one step each: a job's first plan) are not held back. A
    window that spans two batch sizes counts their difference as spread too,
    which only makes the test stricter.

    Once every shard is handed out (``MonitorSnapshot.data_end``), the one
    plan left to make is for the end of the data (``_end_of_data``).
    """

    def __init__(
        self,
        *,
        min_batch: int,
        margin: float,
        apply_after: int,
        tolerance: float = 0.0,
        noise_z: float = 0.0,
    ) -> None:
        self.min_batch = min_batch
        self.margin = margin
        self.apply_after = apply_after
        self.tolerance = tolerance
        self.noise_z = noise_z
        self._pending_step: int | None = None

    def propose(
        self, snap: MonitorSnapshot, *, reason: str, inputs: dict[str, Any]
    ) -> AdjustBatchSize | str:
        """An ``AdjustBatchSize`` or, when none is due, the reason why not."""
        if self._pending_step is not None and snap.latest_step < self._pending_step:
            return f"previous ADJUST_BS applies at step {self._pending_step}"
        if snap.awaiting_first_report:
            waiting = ", ".join(map(str, snap.awaiting_first_report))
            return f"waiting for the first step report of worker {waiting}"
        ranks = sorted(r for r in snap.worker_short if r in snap.workers)
        if len(ranks) < 2:
            return "fewer than 2 workers reported in the short window"
        measured = [snap.worker_short[r].throughput for r in ranks]
        models = [_line(snap.worker_short[r]) for r in ranks]
        # The plan in force, not the reported sizes: summing a mix of old and new
        # sizes (workers without a BSP barrier) would let the global batch drift.
        current = [snap.batch_plan.get(r, snap.workers[r].batch_size) for r in ranks]
        total = sum(current)
        # bmax= in the hostfile: the largest batch a device's memory holds (hard)
        limits = [d.max_batch if (d := snap.devices.get(r)) else None for r in ranks]
        if snap.data_end is not None:
            return self._end_of_data(snap.data_end, snap, ranks, models, current, limits, inputs)
        try:
            sizes, v = self._solve(models, current, limits)
        except InfeasibleError as err:
            return f"no feasible batch split: {err}"
        now_ms, best_ms = _makespan(models, current), _makespan(models, sizes)
        inputs = {
            **inputs,
            "throughput": dict(zip(ranks, measured, strict=True)),
            "throughput_used": dict(zip(ranks, v, strict=True)),
            "step_model": {
                r: [st.fixed_s, st.per_sample_s]
                for r in ranks
                if (st := snap.worker_short[r]).fixed_s is not None
            },
            "step_model_from": {
                r: line for r in ranks if (line := snap.worker_short[r].line) is not None
            },
            "tolerance": self.tolerance,
            "current_sizes": dict(zip(ranks, current, strict=True)),
            "solver_sizes": dict(zip(ranks, sizes, strict=True)),
            "global_batch": total,
            "min_batch": self.min_batch,
            **({"max_batch": dict(zip(ranks, limits, strict=True))} if any(limits) else {}),
            "makespan_current_s": now_ms,
            "makespan_optimal_s": best_ms,
            "margin": self.margin,
        }
        if sizes == current or now_ms <= best_ms * (1.0 + self.margin):
            return (
                f"batch sizes within {self.margin:.0%} of the optimal makespan "
                f"({now_ms:.4g} s vs {best_ms:.4g} s)"
            )
        slowest = max(range(len(ranks)), key=lambda k: models[k][0] + models[k][1] * current[k])
        st = snap.worker_short[ranks[slowest]]
        sd = pooled_sd([snap.worker_short[r] for r in ranks])
        error = sd / st.reports**0.5
        slope_error = _slope_error(snap, ranks, current, sizes, sd)
        if now_ms - best_ms <= self.noise_z * math.hypot(error, slope_error):
            slope_part = (
                f" and the peers' slope moves it by +- {slope_error * 1000:.1f} ms"
                if slope_error
                else ""
            )
            return (
                f"the plan's gain ({(now_ms - best_ms) * 1000:.1f} ms a step) is within the "
                f"noise: worker {ranks[slowest]}'s mean step is "
                f"{st.mean_bpt * 1000:.1f} +- {error * 1000:.1f} ms over {st.reports} steps"
                f"{slope_part} (noise {self.noise_z:g})"
            )
        apply_at = max(snap.latest_step, 0) + self.apply_after
        self._pending_step = apply_at
        return AdjustBatchSize(
            sizes=dict(zip(ranks, sizes, strict=True)),
            apply_at_step=apply_at,
            reason=f"{reason}; makespan {now_ms:.4g} s -> {best_ms:.4g} s",
            inputs=inputs,
        )

    def _end_of_data(
        self,
        end: DataEnd,
        snap: MonitorSnapshot,
        ranks: list[int],
        models: list[tuple[float, float]],
        current: list[int],
        limits: list[int | None],
        inputs: dict[str, Any],
    ) -> AdjustBatchSize | str:
        """Once every shard is handed out: raise the batch of a worker whose held
        records would end the job on its steps alone (``solvers.tail``), up to
        the equal share of the global batch (or its ``bmax=``). Nothing else is
        planned from here: what is left is these records."""
        held = end.held
        # Before a plan applies, every worker still reads apply_after steps.
        most: list[int] = []
        fewest: list[int] = []
        for rank, size in zip(ranks, current, strict=True):
            records, oldest = held.get(rank, (0, 0))
            most.append(max(0, records - self.apply_after * size))
            fewest.append(max(0, records - oldest - self.apply_after * size))
        # The equal share of the data set's global batch (not of the plan's, which
        # an earlier end-of-data plan may have raised).
        share = math.ceil((end.global_batch or sum(current)) / len(ranks))
        caps = [min(share, limit) if limit else share for limit in limits]
        raised = raise_for_tail(models, current, most, fewest, caps, margin=self.margin)
        if not raised:
            return (
                "end of data: every shard is handed out, no worker would end sooner "
                "at a larger batch"
            )
        sizes = list(current)
        for r in raised:
            sizes[r.index] = r.new
        first = raised[0]
        apply_at = max(snap.latest_step, 0) + self.apply_after
        self._pending_step = apply_at
        changes = ", ".join(f"worker {ranks[r.index]} {r.old} -> {r.new}" for r in raised)
        return AdjustBatchSize(
            sizes=dict(zip(ranks, sizes, strict=True)),
            apply_at_step=apply_at,
            reason=(
                f"end of data: every shard is handed out and worker {ranks[first.index]} "
                f"holds up to {most[first.index]} records for its last steps ({changes}): the "
                f"last record in ~{first.after_s:.3g} s instead of ~{first.before_s:.3g} s"
            ),
            inputs={
                **inputs,
                "held_records": {r: list(held[r]) for r in ranks if r in held},
                "records_left": {
                    r: [lo, hi] for r, lo, hi in zip(ranks, fewest, most, strict=True)
                },
                "current_sizes": dict(zip(ranks, current, strict=True)),
                "caps": dict(zip(ranks, caps, strict=True)),
                "step_model": dict(zip(ranks, [list(m) for m in models], strict=True)),
            },
        )

    def _solve(
        self,
        models: list[tuple[float, float]],
        current: list[int],
        limits: list[int | None],
    ) -> tuple[list[int], list[float]]:
        """Eq. 3 over each worker's step line ``T(B) = fixed + per_sample x B``.

        ``limits``: each worker's largest batch (``bmax=``; None: unbounded). With
        any limit, eq. 3 is eq. 4 with one pass per step, which the AntDT-DD
        solver solves exactly with per-worker upper bounds.

        The exact solver balances ``B / v``; a line with a fixed part makes ``v``
        depend on ``B``. So solve with ``v`` at the current sizes, re-evaluate
        ``v`` at the plan, and repeat until the plan stands (a few rounds). A
        worker without a fitted line has no fixed part: one round, as eq. 3.
        Returns the plan with the smallest makespan and the ``v`` it used.
        """
        total = sum(current)
        sizes = current
        best: tuple[float, list[int], list[float]] | None = None
        for _ in range(MAX_PLAN_ROUNDS):
            rates = [_rate(m, b) for m, b in zip(models, sizes, strict=True)]
            v = within_tolerance(rates, self.tolerance)
            plan = self._split(v, total, limits)
            span = _makespan(models, plan)
            if best is None or span < best[0]:
                best = (span, plan, v)
            if plan == sizes:
                break
            sizes = plan
        assert best is not None  # MAX_PLAN_ROUNDS >= 1
        return best[1], best[2]

    def _split(self, v: list[float], total: int, limits: list[int | None]) -> list[int]:
        if not any(limits):
            return solve_batch_sizes(v, total, self.min_batch)
        highs = [max(limit or total, self.min_batch) for limit in limits]
        plan = solve_dd_workers(
            v, self.min_batch, highs, total, min_accumulation=1, max_accumulation=1
        )
        return list(plan.batch_sizes)


MAX_PLAN_ROUNDS = 8


def pooled_sd(windows: list[WindowStats]) -> float:
    """The step-time spread of the workers' windows pooled (each window's variance
    weighted by its degrees of freedom; 0 when no window has two steps).

    Why pooled: a short window of two or three steps (one cut at a regime
    change) can show almost no spread by chance, and the worker whose mean is
    slowest by chance is often just that one; the step-to-step noise is mostly
    the machine's and alike across the workers."""
    dof = sum(st.reports - 1 for st in windows)
    if dof <= 0:
        return 0.0
    return float((sum((st.reports - 1) * st.sd_bpt**2 for st in windows) / dof) ** 0.5)


def _slope_error(
    snap: MonitorSnapshot, ranks: list[int], current: list[int], sizes: list[int], sd: float
) -> float:
    """How far the plan's step estimate may be off through the measured slope
    of the workers whose line is their peers' (``MonitorSnapshot.measured_slope``):
    its standard error times the records such a worker's batch moves by, the
    largest of them (0 without such workers or a measured slope).

    Why: a worker shrunk far from its peers' batch has no line of its own;
    what a plan gains by moving its records rests on that slope. Measured
    from a few small changes under large step noise it may be ten times the
    truth, and a plan that shrinks a worker whose step is mostly a fixed cost
    then promises gains that never come (benchmarks/rna.py scenario b)."""
    measured = snap.measured_slope
    if measured is None or measured.weight <= 0:
        return 0.0
    se = sd / math.sqrt(measured.weight)
    moved = [
        abs(new - old)
        for r, old, new in zip(ranks, current, sizes, strict=True)
        if snap.worker_short[r].line == "peers"
    ]
    return se * max(moved, default=0)


def _line(st: WindowStats) -> tuple[float, float]:
    """``(fixed_s, per_sample_s)`` of a worker's step time; proportional (eq. 3)
    unless the Monitor gave its window a line (fitted, or from its peers)."""
    if st.fixed_s is not None and st.per_sample_s is not None:
        return st.fixed_s, st.per_sample_s
    return 0.0, 1.0 / st.throughput


def _rate(model: tuple[float, float], size: int) -> float:
    """Samples/s at batch ``size`` (at least one sample, so never 0/0)."""
    fixed, per_sample = model
    b = max(size, 1)
    return b / (fixed + per_sample * b)


def _makespan(models: list[tuple[float, float]], sizes: list[int]) -> float:
    return max(f + s * b for (f, s), b in zip(models, sizes, strict=True))


def window_inputs(snap: MonitorSnapshot, lam: float) -> dict[str, Any]:
    """The part of every decision's ``inputs`` that describes the windows."""
    return {
        "now": snap.now,
        "l_trans": snap.l_trans,
        "l_per": snap.l_per,
        "lambda": lam,
        "latest_step": snap.latest_step,
        "bpt_short": {r: s.mean_bpt for r, s in snap.worker_short.items()},
        "bpt_long": {r: s.mean_bpt for r, s in snap.worker_long.items()},
        "bpt_eq_short": {r: s.mean_bpt_eq for r, s in snap.worker_short.items()},
        "bpt_eq_long": {r: s.mean_bpt_eq for r, s in snap.worker_long.items()},
        "mean_bpt_eq_short": snap.mean_bpt_eq_short,
        "mean_bpt_eq_long": snap.mean_bpt_eq_long,
        "update_long": {r: s.mean_bpt for r, s in snap.server_long.items()},
        "mean_update_long": snap.mean_update_long,
        "server_comm_long": dict(snap.server_comm_long),
        # the peers' lines' slope (s/record) and its weight, once measured
        **(
            {"measured_slope": [m.seconds_per_record, m.weight]}
            if (m := snap.measured_slope) is not None
            else {}
        ),
    }
