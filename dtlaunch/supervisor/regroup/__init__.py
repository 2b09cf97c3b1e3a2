"""Re-forming an allreduce group around its survivors (KILL_RESTART without a
group restart); the worker side is ``dtlaunch.runtime.elastic``.

- ``coordinator``  :class:`RegroupCoordinator`: I/O-free bookkeeping of the one
                   regroup in flight and who can hand state over
- ``driver``       :class:`RegroupDriver`: the protocol's messages around it
"""

from dtlaunch.supervisor.regroup.coordinator import RegroupCoordinator
from dtlaunch.supervisor.regroup.driver import JOIN_PREFIX, RegroupDriver

__all__ = ["JOIN_PREFIX", "RegroupCoordinator", "RegroupDriver"]
