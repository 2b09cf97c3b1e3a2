"""The supervisor's side of the built-in parameter servers (``--servers M``).

- ``placement``  :class:`PlacementKeeper`: the job's versioned block -> server map
- ``fleet``      :class:`ServerFleet`: polls the servers' update times for the
                 Monitor, sets BACKUP_WORKERS' b, and moves a slow server live
"""

from dtlaunch.supervisor.psfleet.fleet import ServerFleet
from dtlaunch.supervisor.psfleet.placement import PlacementKeeper

__all__ = ["PlacementKeeper", "ServerFleet"]
