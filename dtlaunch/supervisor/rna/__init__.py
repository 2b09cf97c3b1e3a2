"""RNA's rounds on the supervisor (RNA §3.2, §3.3); the worker side is
``dtlaunch.runtime.rna``.

- ``coordinator``  :class:`RoundCoordinator`: I/O-free groups, probes and rounds
- ``groups``       :class:`GroupedCoordinator`: hierarchical RNA's groups (§4), one
                   coordinator each, exchanging through a parameter server
- ``service``      :class:`RoundService`: the coordinator's messages and events
"""

from dtlaunch.supervisor.rna.coordinator import GroupPhase, RoundCoordinator
from dtlaunch.supervisor.rna.groups import GroupedCoordinator
from dtlaunch.supervisor.rna.service import RNA_MESSAGES, RoundService

__all__ = ["RNA_MESSAGES", "GroupPhase", "GroupedCoordinator", "RoundCoordinator", "RoundService"]
