"""A scripted policy for failover tests (``--policy tests.scripts.failover_policy:Scripted``):
KILL_RESTART of worker ``worker`` once ``worker_at`` of the work is done, then of
server ``server`` at ``server_at``, each onto a free spare host, through the real
Controller, supervisor and agents. Nothing else."""

from __future__ import annotations

from dtlaunch.policy import Action, KillRestart, MonitorSnapshot, NoAction


class Scripted:
    name = "scripted"
    l_trans = 5.0
    l_per = 10.0
    lam = 1.5

    def __init__(
        self, worker: int = 2, worker_at: float = 0.25, server: int = 1, server_at: float = 0.5
    ) -> None:
        self._plan = [("worker", worker, worker_at), ("server", server, server_at)]
        self._total: int | None = None

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        if snap.remaining_steps is None:
            return [NoAction(reason="remaining work unknown")]
        if self._total is None:
            self._total = max(1, snap.remaining_steps)
        done = 1.0 - snap.remaining_steps / self._total
        if self._plan and done >= self._plan[0][2] and snap.spare_hosts:
            role, rank, _ = self._plan.pop(0)
            return [
                KillRestart(
                    role=role,
                    rank=rank,
                    target_host=snap.spare_hosts[0],
                    reason=f"scripted: {role} {rank} at {done:.0%} of the work",
                )
            ]
        return [NoAction(reason="nothing due")]
