"""``backup``: BACKUP_WORKERS (AntDT Table II; Sync-OPT, Chen et al. 2016) for PS jobs.

Each BSP step applies with the first ``n - b`` of the ``n`` workers' gradients;
the ``b`` latest are left out. AntDT's baseline puts the dropped records back
through the DDS so none is lost: a worker whose gradient was dropped gives the
step's shards back (``Job.mark_dropped``) and they are read again, at least once.
The setting is static, as in the paper: ``b`` is sent at the first decision and
kept (restarted or moved servers get it again from the supervisor).

Parameters: ``b`` (default 1), and the windows every built-in accepts (unused).
Needs the built-in parameter servers (``--servers M``).
"""

from __future__ import annotations

from dtlaunch.supervisor.control.actions import Action, BackupWorkers, NoAction
from dtlaunch.supervisor.control.monitor import MonitorSnapshot
from dtlaunch.supervisor.control.policies.base import ParamReader, read_windows, window_inputs


class BackupPolicy:
    """Set BACKUP_WORKERS(b) once; see module doc."""

    name = "backup"

    def __init__(self, params: dict[str, str] | None = None) -> None:
        reader = ParamReader(self.name, params or {})
        self.l_trans, self.l_per, self.lam = read_windows(reader)
        self.b = reader.integer("b", 1, low=1)
        reader.finish()
        self._sent = False

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        inputs = window_inputs(snap, self.lam)
        if self._sent:
            return [NoAction(reason=f"backup workers b = {self.b} in force", inputs=inputs)]
        self._sent = True
        return [
            BackupWorkers(
                count=self.b,
                reason=(
                    f"backup workers: every step applies with the first n - {self.b} "
                    "gradients; the dropped workers' records go back to the DDS"
                ),
                inputs={**inputs, "b": self.b, "workers": sorted(snap.workers)},
            )
        ]
