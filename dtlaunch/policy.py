"""The public API of a straggler policy: what a ``--policy pkg.mod:MyPolicy`` imports.

A policy is a class with ``decide(snap) -> list[Action]`` (and optionally
``name``, ``l_trans``, ``l_per``, ``lam``; see :class:`Policy`). Every control
interval the Controller hands it a :class:`MonitorSnapshot` (per-node sliding
windows, AntDT §V-D) and carries out what it returns, under the same names from
the decision to the wire (AntDT Table II)::

    AdjustBatchSize(sizes, apply_at_step)   ADJUST_BS: rank -> local batch size
                                            (accumulations: rank -> passes, dd)
    AdjustLR(factors, apply_at_step)        ADJUST_LR: rank -> learning-rate factor
    BackupWorkers(count)                    BACKUP_WORKERS: PS steps skip the slowest
    KillRestart(role, rank, target_host)    KILL_RESTART: replace a node
    ScaleWorkers(count)                     SCALE_WORKERS: run this many workers (PS jobs)
    ScaleServers(count)                     SCALE_SERVERS: run this many built-in servers
    NoAction(reason)                        NONE: nothing this interval

Every action carries ``reason`` (one sentence for a person) and ``inputs`` (what
the decision saw), recorded as a ``decision`` event for ``dtlaunch replay``.
A minimal policy::

    from dtlaunch.policy import MonitorSnapshot, NoAction, Action

    class Quiet:
        def decide(self, snap: MonitorSnapshot) -> list[Action]:
            return [NoAction(reason=f"{len(snap.workers)} workers, nothing to do")]

``dtlaunch run --policy mymod:Quiet`` runs it; ``dtlaunch replay RUN --policy
mymod:Quiet`` re-decides a recorded run with it.
"""

from dtlaunch.supervisor.control.actions import (
    Action,
    AdjustBatchSize,
    AdjustLR,
    BackupWorkers,
    KillRestart,
    NoAction,
    ScaleServers,
    ScaleWorkers,
    action_name,
)
from dtlaunch.supervisor.control.monitor import (
    JobResources,
    MonitorSnapshot,
    NodeInfo,
    ProcessUse,
    WindowStats,
    WorkerDevice,
)
from dtlaunch.supervisor.control.policies.base import Policy

__all__ = [
    "Action",
    "AdjustBatchSize",
    "AdjustLR",
    "BackupWorkers",
    "JobResources",
    "KillRestart",
    "MonitorSnapshot",
    "NoAction",
    "NodeInfo",
    "Policy",
    "ProcessUse",
    "ScaleServers",
    "ScaleWorkers",
    "WindowStats",
    "WorkerDevice",
    "action_name",
]
