"""Pure optimisation solvers used by the straggler and load policies.

Everything here is a pure function of its arguments: no I/O, no logging, no
global state (randomness only from a generator the caller passes), so policies,
``replay --policy`` and tests get identical answers.

* :mod:`dtlaunch.solvers.batch` — exact integer batch balancing, AntDT eq. 3:
  :func:`solve_batch_sizes`, :func:`makespan`, :class:`InfeasibleError`.
* :mod:`dtlaunch.solvers.dd` — AntDT-DD eq. 4, a batch size and a
  gradient-accumulation count per device class, exact: :func:`solve_dd`,
  :func:`solve_dd_workers`, :class:`DeviceClass`, :class:`DDPlan`.
* :mod:`dtlaunch.solvers.psld` — PSLD §4: per-server performance fits, the
  reassignment trigger, the superior server set (Alg. 1) and ε-greedy block
  assignment (Alg. 2-3): :func:`fit_server`, :func:`should_reassign`,
  :func:`superior_servers`, :func:`assign_blocks`.
* :mod:`dtlaunch.solvers.proportional` — PSLD's strawman, bytes by speed:
  :func:`assign_proportional`.
"""

from __future__ import annotations

from dtlaunch.solvers.batch import InfeasibleError, makespan, solve_batch_sizes
from dtlaunch.solvers.dd import DDPlan, DeviceClass, dd_makespan, solve_dd, solve_dd_workers
from dtlaunch.solvers.proportional import assign_proportional
from dtlaunch.solvers.psld import (
    BlockAssignment,
    ServerFit,
    SuperiorSet,
    assign_blocks,
    fit_server,
    predicted_makespan,
    should_reassign,
    superior_servers,
)

__all__ = [
    "BlockAssignment",
    "DDPlan",
    "DeviceClass",
    "InfeasibleError",
    "ServerFit",
    "SuperiorSet",
    "assign_blocks",
    "assign_proportional",
    "dd_makespan",
    "fit_server",
    "makespan",
    "predicted_makespan",
    "should_reassign",
    "solve_batch_sizes",
    "solve_dd",
    "solve_dd_workers",
    "superior_servers",
]
