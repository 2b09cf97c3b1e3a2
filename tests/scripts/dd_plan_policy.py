"""A scripted AntDT-DD plan (``--policy tests.scripts.dd_plan_policy:FixedPlan``):
once every worker has reported ``after`` steps, one ADJUST_BS that gives rank 0
``c0`` passes of ``b0`` records and rank 1 ``c1`` passes of ``b1`` per step,
through the real Controller, wire and SDK. Nothing else."""

from __future__ import annotations

from dtlaunch.policy import Action, AdjustBatchSize, MonitorSnapshot, NoAction


class FixedPlan:
    name = "dd-scripted"
    l_trans = 5.0
    l_per = 10.0
    lam = 1.5

    def __init__(self, b0: int = 5, c0: int = 3, b1: int = 9, c1: int = 1, after: int = 2) -> None:
        self._plan: AdjustBatchSize | None = None
        self._sizes, self._passes, self._after = {0: b0, 1: b1}, {0: c0, 1: c1}, after

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        if self._plan is not None:
            return [NoAction(reason="plan sent")]
        if len(snap.workers) < 2 or min(i.last_step for i in snap.workers.values()) < self._after:
            return [NoAction(reason="waiting for steps")]
        self._plan = AdjustBatchSize(
            sizes=self._sizes,
            accumulations=self._passes,
            apply_at_step=snap.latest_step + 3,
            reason="scripted dd plan",
        )
        return [self._plan]
