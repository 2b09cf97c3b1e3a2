"""``dd``: AntDT-DD for mixed devices (AntDT §VI-B, eq. 4).

Deterministic stragglers (a P100 beside a V100) are slow at every step. LB-BSP
shrinks the slow devices' batches and cannot grow the fast ones' past their
memory; ``dd`` gives every device class a micro-batch ``B_i`` within its bounds
and ``C_i`` gradient-accumulation passes, so that all classes finish the global
step together while the global batch ``B = sum_i C_i B_i`` stays what it was
(the exact solver is ``dtlaunch.solvers.dd``; the SDK's ``bsp_batches`` runs the
passes and ``allreduce_gradients`` weights them).

- **Classes**: the hostfile's ``class=NAME`` of each worker's host. Workers on
  hosts without one are grouped by measured speed: sorted by speed, a class
  holds the workers within ``tolerance`` (default 0.1) of its slowest member.
- **Speed** of a class: the median over its workers of the records per second
  of compute in the short window (communication left out: the allreduce runs
  once per step whatever the split).
- **Bounds**: ``bmin=``/``bmax=`` of the class's hosts. Without ``bmax=`` the
  largest micro-batch the class's workers ran before dd's first plan, the batch
  the job was started with and so known to fit; without ``bmin=`` the
  ``min_batch`` parameter (default 1).
- **When**: once every worker has ``profile`` steps (default 5) in the short
  window (the profiling phase), then again only when a class's speed has moved
  by more than ``change`` (default 0.1) from what the plan in force assumed or a
  worker changed class (moved to another host); and only when the optimum beats
  the plan in force by more than ``margin`` (default 0.05).

Parameters: ``l_trans l_per lambda`` (windows; lambda unused), ``cmin`` (1),
``cmax`` (5), ``margin``, ``apply_after`` (steps after the latest reported step,
default 3), ``profile``, ``change``, ``tolerance``, ``min_batch``.

``apply_after`` is shorter than ``lb-bsp``'s 10: every step of the profiling
phase and of the lead time runs at the equal split's pace, and a plan that
reaches a worker a step late costs nothing but that step's exact global batch
(the passes are local; the collectives per step stay the same).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.solvers.batch import InfeasibleError
from dtlaunch.solvers.dd import DeviceClass, solve_dd
from dtlaunch.supervisor.control.actions import Action, AdjustBatchSize, NoAction
from dtlaunch.supervisor.control.monitor import MonitorSnapshot
from dtlaunch.supervisor.control.policies.base import (
    DEFAULT_MARGIN,
    ParamReader,
    read_windows,
    window_inputs,
)

DEFAULT_PROFILE_STEPS = 5
DEFAULT_CHANGE = 0.1  # a class's speed moved this much: the plan is re-decided
DEFAULT_CLASS_TOLERANCE = 0.1  # undeclared workers this close in speed form one class
DEFAULT_DD_APPLY_AFTER = 3  # steps of lead time (see the module doc)
MAX_ACCUMULATION = 64  # passes per step; more is a typo (AntDT uses up to 5)


@dataclass(frozen=True, slots=True)
class _Class:
    """One device class as dd sees it at a decision."""

    name: str
    ranks: tuple[int, ...]
    throughput: float  # records/s of compute: the median over its workers
    min_batch: int
    max_batch: int
    declared: bool  # class= in the hostfile (else inferred from speed)


class DdPolicy:
    """AntDT-DD: a micro-batch and an accumulation count per device class."""

    name = "dd"

    def __init__(self, params: dict[str, str] | None = None) -> None:
        reader = ParamReader(self.name, params or {})
        self.l_trans, self.l_per, self.lam = read_windows(reader)
        self.min_accumulation = reader.integer("cmin", 1, low=1)
        self.max_accumulation = reader.integer("cmax", 5, low=1)
        self.margin = reader.number("margin", DEFAULT_MARGIN, low=0.0)
        self.apply_after = reader.integer("apply_after", DEFAULT_DD_APPLY_AFTER, low=1)
        self.profile_steps = reader.integer("profile", DEFAULT_PROFILE_STEPS, low=1)
        self.change = reader.number("change", DEFAULT_CHANGE, low=0.0)
        self.tolerance = reader.number("tolerance", DEFAULT_CLASS_TOLERANCE, low=0.0)
        self.min_batch = reader.integer("min_batch", 1, low=1)
        reader.finish()
        if self.min_accumulation > self.max_accumulation:
            raise ConfigError(
                f"policy dd: cmin={self.min_accumulation} exceeds cmax={self.max_accumulation}; "
                "write e.g. dd:cmin=1,cmax=5"
            )
        if self.max_accumulation > MAX_ACCUMULATION:
            raise ConfigError(
                f"policy dd: cmax={self.max_accumulation} is more than {MAX_ACCUMULATION} "
                "passes per step; AntDT uses up to 5"
            )
        self._started_batch: dict[int, int] = {}  # rank -> micro-batch before dd's first plan
        self._planned: dict[str, float] | None = None  # class -> speed the plan in force used
        self._planned_classes: dict[int, str] = {}  # rank -> class in the plan in force
        self._pending_step: int | None = None

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        inputs = window_inputs(snap, self.lam)
        for rank, info in snap.workers.items():
            if rank not in snap.batch_plan:
                self._started_batch.setdefault(rank, max(1, info.batch_size))
        if self._pending_step is not None and snap.latest_step < self._pending_step:
            return [NoAction(reason=f"plan applies at step {self._pending_step}", inputs=inputs)]
        ranks = sorted(snap.workers)
        if len(ranks) < 2:
            return [NoAction(reason="fewer than 2 workers", inputs=inputs)]
        measured = [r for r in ranks if self._profiled(snap, r)]
        if len(measured) < len(ranks):
            return [
                NoAction(
                    reason=f"profiling: {len(measured)} of {len(ranks)} workers have "
                    f"{self.profile_steps} steps in the last {snap.l_trans:g} s",
                    inputs=inputs,
                )
            ]
        classes = self._classes(snap, ranks)
        inputs["classes"] = {c.name: _class_inputs(c) for c in classes}
        if not self._changed(classes):
            return [
                NoAction(
                    reason=f"class speeds within {self.change:.0%} of the plan in force",
                    inputs=inputs,
                )
            ]
        sizes = {r: snap.batch_plan.get(r, self._started_batch.get(r, 1)) for r in ranks}
        passes = {r: snap.accumulation_plan.get(r, 1) for r in ranks}
        total = sum(sizes[r] * passes[r] for r in ranks)
        try:
            plan = solve_dd(
                [
                    DeviceClass(c.throughput, c.min_batch, c.max_batch, len(c.ranks))
                    for c in classes
                ],
                total,
                min_accumulation=self.min_accumulation,
                max_accumulation=self.max_accumulation,
            )
        except InfeasibleError as err:
            return [NoAction(reason=f"no feasible plan: {err}", inputs=inputs)]
        speed = {r: c.throughput for c in classes for r in c.ranks}
        now_s = max(sizes[r] * passes[r] / speed[r] for r in ranks)
        new_sizes: dict[int, int] = {}
        new_passes: dict[int, int] = {}
        for i, cls in enumerate(classes):
            for rank in cls.ranks:
                new_sizes[rank], new_passes[rank] = plan.batch_sizes[i], plan.accumulations[i]
        inputs.update(
            global_batch=total,
            cmin=self.min_accumulation,
            cmax=self.max_accumulation,
            current_sizes=sizes,
            current_accumulations=passes,
            solver_sizes=new_sizes,
            solver_accumulations=new_passes,
            makespan_current_s=now_s,
            makespan_optimal_s=plan.makespan,
            margin=self.margin,
        )
        self._remember(classes)
        if (new_sizes, new_passes) == (sizes, passes) or now_s <= plan.makespan * (1 + self.margin):
            return [
                NoAction(
                    reason=f"the plan in force is within {self.margin:.0%} of the optimum "
                    f"({now_s:.4g} s vs {plan.makespan:.4g} s per step)",
                    inputs=inputs,
                )
            ]
        apply_at = max(snap.latest_step, 0) + self.apply_after
        self._pending_step = apply_at
        shares = ", ".join(
            f"{c.name} {plan.accumulations[i]}x{plan.batch_sizes[i]}" for i, c in enumerate(classes)
        )
        return [
            AdjustBatchSize(
                sizes=new_sizes,
                accumulations=new_passes,
                apply_at_step=apply_at,
                reason=f"device classes {shares}; step {now_s:.4g} s -> {plan.makespan:.4g} s",
                inputs=inputs,
            )
        ]

    def _profiled(self, snap: MonitorSnapshot, rank: int) -> bool:
        stats = snap.worker_short.get(rank)
        return (
            stats is not None
            and stats.reports >= self.profile_steps
            and stats.compute_per_sample_s > 0
        )

    def _classes(self, snap: MonitorSnapshot, ranks: list[int]) -> list[_Class]:
        """The device classes of ``ranks``: declared ones by name, then the
        undeclared workers grouped by speed, each in a deterministic order."""
        speed = {r: 1.0 / snap.worker_short[r].compute_per_sample_s for r in ranks}
        declared: dict[str, list[int]] = {}
        undeclared: list[int] = []
        for rank in ranks:
            device = snap.devices.get(rank)
            if device is not None and device.device_class is not None:
                declared.setdefault(device.device_class, []).append(rank)
            else:
                undeclared.append(rank)
        groups: list[tuple[str, list[int], bool]] = [
            (name, members, True) for name, members in sorted(declared.items())
        ]
        inferred: list[list[int]] = []
        for rank in sorted(undeclared, key=lambda r: (speed[r], r)):
            if inferred and speed[rank] <= speed[inferred[-1][0]] * (1 + self.tolerance):
                inferred[-1].append(rank)
            else:
                inferred.append([rank])
        groups += [(f"speed-{i + 1}", sorted(m), False) for i, m in enumerate(inferred)]
        return [
            self._class(snap, name, members, speed, is_declared)
            for name, members, is_declared in groups
        ]

    def _class(
        self,
        snap: MonitorSnapshot,
        name: str,
        members: list[int],
        speed: dict[int, float],
        declared: bool,
    ) -> _Class:
        lows = [d.min_batch for r in members if (d := snap.devices.get(r)) and d.min_batch]
        highs = [d.max_batch for r in members if (d := snap.devices.get(r)) and d.max_batch]
        started = [self._started_batch.get(r, snap.workers[r].batch_size) for r in members]
        return _Class(
            name=name,
            ranks=tuple(members),
            throughput=statistics.median(speed[r] for r in members),
            min_batch=max(lows) if lows else self.min_batch,
            max_batch=min(highs) if highs else max(started),
            declared=declared,
        )

    def _changed(self, classes: list[_Class]) -> bool:
        """Whether the plan in force is out of date: none yet, a worker changed
        class, or a class's speed moved by more than ``change``."""
        if self._planned is None:
            return True
        if {r: c.name for c in classes for r in c.ranks} != self._planned_classes:
            return True
        for cls in classes:
            before = self._planned.get(cls.name)
            if before is None or abs(cls.throughput - before) > self.change * before:
                return True
        return False

    def _remember(self, classes: list[_Class]) -> None:
        self._planned = {c.name: c.throughput for c in classes}
        self._planned_classes = {r: c.name for c in classes for r in c.ranks}


def _class_inputs(cls: _Class) -> dict[str, Any]:
    return {
        "ranks": list(cls.ranks),
        "throughput": cls.throughput,
        "min_batch": cls.min_batch,
        "max_batch": cls.max_batch,
        "declared": cls.declared,
    }
