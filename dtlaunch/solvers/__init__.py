"""Pure optimisation solvers used by the straggler policies.

Everything here is a pure function of its arguments: no I/O, no logging, no
global state, so policies, ``replay --policy`` and tests get identical answers.

* :mod:`dtlaunch.solvers.batch` — exact integer batch balancing, AntDT eq. 3:
  :func:`solve_batch_sizes`, :func:`makespan`, :class:`InfeasibleError`.
"""

from __future__ import annotations

from dtlaunch.solvers.batch import InfeasibleError, makespan, solve_batch_sizes

__all__ = ["InfeasibleError", "makespan", "solve_batch_sizes"]
