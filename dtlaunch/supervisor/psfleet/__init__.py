"""The supervisor's side of the built-in parameter servers (``--servers M``).

- ``placement``  :class:`PlacementKeeper`: the job's versioned block -> server map
- ``reassign``   :class:`BlockReassigner`: moves blocks between running servers
                 at a step boundary (PSLD), two-phase around the map's commit
- ``fleet``      :class:`ServerFleet`: polls the servers' update times for the
                 Monitor, sets BACKUP_WORKERS' b, moves a slow server live, and
                 carries out REASSIGN_BLOCKS
"""

from dtlaunch.supervisor.psfleet.fleet import ServerFleet
from dtlaunch.supervisor.psfleet.placement import PlacementKeeper
from dtlaunch.supervisor.psfleet.reassign import BlockReassigner

__all__ = ["BlockReassigner", "PlacementKeeper", "ServerFleet"]
