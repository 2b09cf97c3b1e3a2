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
* :mod:`dtlaunch.solvers.spread` — the blocks over a changed number of
  servers (a scale-out or scale-in), moving few bytes: :func:`spread_blocks`.
* :mod:`dtlaunch.solvers.rna` — RNA §3.2-§4: staleness weights of a worker's
  pending gradients, the learning-rate factor, the recursive grouping by iteration
  time and the power-of-d probe's response quantiles: :func:`staleness_weights`,
  :func:`lr_factor`, :func:`split_groups`, :func:`probe_response_quantile`,
  :func:`probe_median_response`.
* :mod:`dtlaunch.solvers.dlrover` — DLRover §4.1-4.2: the workers for the
  declared cores (eq. 10-11), the idle-PS and hot-PS rules:
  :func:`plan_workers`, :func:`added_workers`, :func:`hot_server_cores`,
  :func:`predicted_throughput`.
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
from dtlaunch.solvers.rna import (
    lr_factor,
    probe_median_response,
    probe_response_quantile,
    split_groups,
    staleness_weights,
)
from dtlaunch.solvers.spread import spread_blocks

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
    "lr_factor",
    "makespan",
    "predicted_makespan",
    "probe_median_response",
    "probe_response_quantile",
    "should_reassign",
    "solve_batch_sizes",
    "solve_dd",
    "solve_dd_workers",
    "split_groups",
    "spread_blocks",
    "staleness_weights",
    "superior_servers",
]
