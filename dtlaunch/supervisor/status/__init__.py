"""What ``dtlaunch status`` is shown, on the supervisor's side.

- ``fold``     :class:`StatusFold`: events folded into a bounded snapshot (I/O-free;
               ``dtlaunch status`` replays an ended job's events through it too)
- ``tracker``  :class:`StatusTracker`: the read-only endpoint's answers, adding
               what only the live supervisor knows (node table, queue, Monitor);
               it answers them on the status clients' own socket
- ``metrics``  ``--metrics-port``: the same live view, read on the loop at each
               scrape, as a Prometheus endpoint (imported by ``job.py`` only, so
               that ``dtlaunch status`` does not load prometheus_client)
- ``summary``  ``summary.json`` of a finished job, from its node table (``job.py``)
"""

from dtlaunch.supervisor.status.fold import StatusFold
from dtlaunch.supervisor.status.tracker import STATUS_PREFIX, StatusTracker

__all__ = ["STATUS_PREFIX", "StatusFold", "StatusTracker"]
