"""``lb-bsp``: the LB-BSP baseline, batch-size balancing only (ADJUST_BS).

Every interval it estimates each worker's throughput ``v_i`` over the short window
and solves AntDT eq. 3 (``min max B_i / v_i`` with the global batch fixed). It
emits ``AdjustBatchSize`` when the current sizes' makespan is more than
``margin`` above the optimum; that margin, and waiting until a previous plan has
applied, keep it from flapping between near-equal plans every interval.

Parameters: ``l_trans l_per lambda`` (windows; lambda unused here),
``margin`` (default 0.05), ``min_batch`` (default 1), ``apply_after`` (steps
after the latest reported step, default 10), ``tolerance`` (throughputs within
this fraction of the median count as equal, default 0.03), ``noise`` (a plan
must gain more than this many standard errors of the slowest worker's mean
step, default 3; 0: off).
"""

from __future__ import annotations

from dtlaunch.supervisor.control.actions import Action, NoAction
from dtlaunch.supervisor.control.monitor import MonitorSnapshot
from dtlaunch.supervisor.control.policies.base import (
    ParamReader,
    read_balancer,
    read_windows,
    window_inputs,
)


class LbBspPolicy:
    """LB-BSP: rebalance batch sizes whenever it pays by more than ``margin``."""

    name = "lb-bsp"

    def __init__(self, params: dict[str, str] | None = None) -> None:
        reader = ParamReader(self.name, params or {})
        self.l_trans, self.l_per, self.lam = read_windows(reader)
        self.balancer = read_balancer(reader)
        reader.finish()

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        inputs = window_inputs(snap, self.lam)
        plan = self.balancer.propose(snap, reason="rebalance batch sizes", inputs=inputs)
        if isinstance(plan, str):
            return [NoAction(reason=plan, inputs=inputs)]
        return [plan]
