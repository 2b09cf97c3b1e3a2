"""KILL_RESTART in ``JobState``: restart a process (on a spare host when asked),
join an elastic allreduce group, or hand over to a replacement started ahead."""

from __future__ import annotations

from dtlaunch.supervisor.jobstate.base import JobStateBase
from dtlaunch.supervisor.jobstate.nodes import (
    LIVE_PROC_STATES,
    AgentState,
    Command,
    JoinSpec,
    Phase,
    ProcState,
    SendToAgent,
)
from dtlaunch.wire.messages import Kill

__all__ = ["Replacements"]


class Replacements(JobStateBase):
    def kill_restart(
        self,
        role: str,
        rank: int,
        reason: str,
        now: float,
        *,
        target_host: str | None = None,
        join: JoinSpec | None = None,
    ) -> list[Command]:
        """KILL_RESTART (AntDT Table II): stop the process, start it again with the
        same rank, on ``target_host`` when given (a spare host) else on its own.

        With ``join`` the new attempt joins the survivors of an elastic allreduce
        group (their store and what to receive) instead of a fresh group. The
        restart follows its Exited like any restart (attempt + 1). Only a running
        process is restarted; anything else has moved on already.
        """
        slot = self.procs.get(f"{role}-{rank}")
        if slot is None or slot.state is not ProcState.RUNNING or self.phase is not Phase.RUNNING:
            return []
        if target_host is not None and target_host not in self.agents:
            raise ValueError(f"KILL_RESTART target {target_host!r} is not a host of this job")
        slot.state = ProcState.STOPPING
        slot.restart_after_stop = True
        slot.restart_reason = f"KILL_RESTART: {reason}"
        slot.next_host = target_host or ""
        slot.join = join
        return [
            SendToAgent(host=slot.host, message=self._kill_message(slot)),
            self._proc_event(
                "kill_restart",
                slot,
                reason=reason,
                attempt=slot.attempt,
                target_host=target_host or slot.host,
                regroup=join is not None,
            ),
        ]

    def replace_prewarmed(
        self, rank: int, target_host: str, reason: str, now: float
    ) -> list[Command]:
        """KILL_RESTART onto another host without a gap: the replacement starts
        now on ``target_host`` and waits, warm, to join the survivors
        (``dtlaunch.runtime.prewarm``); the old process trains on until
        ``retire()`` stops it. The slot is the new attempt from here on."""
        return self._replace_ahead("worker", rank, target_host, reason, now)

    def replace_server(self, rank: int, target_host: str, reason: str, now: float) -> list[Command]:
        """KILL_RESTART of a built-in PS server onto another host: a fresh server
        starts there (no snapshot restored: its blocks come by migration, see
        ``supervisor.ps_servers``) while the old one serves on until ``retire()``.
        The slot is the new attempt from here on."""
        return self._replace_ahead("server", rank, target_host, reason, now)

    def server_handed_over(self, rank: int) -> None:
        """The retiring server ``rank`` exported its blocks: its exit from now on
        is a retirement, not the failure of the server that counts."""
        self.handed_over.add(f"server-{rank}")

    def abort_server_move(self, rank: int, now: float) -> list[Command]:
        """Give up moving server ``rank`` before its blocks moved: stop the fresh
        server, and the slot is the old process again (on its old host)."""
        proc_id = f"server-{rank}"
        slot = self.procs.get(proc_id)
        retiring = self.retiring.pop(proc_id, None)
        if slot is None or retiring is None or proc_id in self.handed_over:
            return []
        old_host, old_attempt = retiring
        out: list[Command] = []
        if slot.state in LIVE_PROC_STATES or slot.state is ProcState.PENDING:
            kill = Kill(proc_id=proc_id, attempt=slot.attempt, grace_s=self.timing.kill_grace)
            if slot.state is not ProcState.PENDING:
                out.append(SendToAgent(host=slot.host, message=kill))
        out.append(self._proc_event("moved", slot, old_host=slot.host, new_host=old_host))
        slot.host, slot.attempt, slot.state = old_host, old_attempt, ProcState.RUNNING
        slot.ps_fresh_attempt = -1
        return out

    def _replace_ahead(
        self, role: str, rank: int, target_host: str, reason: str, now: float
    ) -> list[Command]:
        slot = self.procs.get(f"{role}-{rank}")
        if slot is None or slot.state is not ProcState.RUNNING or self.phase is not Phase.RUNNING:
            return []
        if target_host not in self.agents or target_host == slot.host:
            raise ValueError(f"a replacement started ahead needs another host, got {target_host!r}")
        self.retiring[slot.proc_id] = (slot.host, slot.attempt)
        out: list[Command] = [
            self._proc_event(
                "kill_restart",
                slot,
                reason=reason,
                attempt=slot.attempt,
                target_host=target_host,
                regroup=role == "worker",
                prewarm=role == "worker",
                migrate=role == "server",
            ),
            self._restart(slot, f"KILL_RESTART: {reason}", now),
            self._proc_event("moved", slot, old_host=slot.host, new_host=target_host),
        ]
        slot.host = target_host
        if role == "worker":
            slot.prewarm = True
        else:
            slot.ps_fresh_attempt = slot.attempt
        return out + self._reconcile(now)

    def retire(self, proc_id: str) -> list[Command]:
        """Stop the process a prewarmed replacement takes over from."""
        retiring = self.retiring.get(proc_id)
        if retiring is None:
            return []
        host, attempt = retiring
        kill = Kill(proc_id=proc_id, attempt=attempt, grace_s=self.timing.kill_grace)
        return [SendToAgent(host=host, message=kill)]

    def free_spare_hosts(self) -> list[str]:
        """Spare hosts with nothing running on them, in hostfile order: where a
        KILL_RESTART can go (AntDT's "cluster not busy")."""
        busy = {
            s.host
            for s in self.procs.values()
            if s.state in LIVE_PROC_STATES or s.state is ProcState.PENDING
        }
        busy |= {host for host, _ in self.retiring.values()}  # a replaced one still runs
        up = {h for h, a in self.agents.items() if a.state is AgentState.UP}
        return [h for h in self.spare_hosts if h not in busy and h in up]

    def free_spare(self, preferred: str | None) -> str | None:
        """Where a KILL_RESTART should go: ``preferred`` if it is a spare host with
        nothing running, else the first such spare host; None (its own host) when
        no spare host is free or none was asked for."""
        if preferred is None:
            return None
        free = self.free_spare_hosts()
        return preferred if preferred in free else next(iter(free), None)

    def address_of(self, proc_id: str) -> str:
        """The address other hosts reach ``proc_id``'s host at ("" if unknown)."""
        slot = self.procs.get(proc_id)
        agent = self.agents.get(slot.host) if slot is not None else None
        if slot is None or agent is None or agent.state is not AgentState.UP:
            return ""
        return self._master_addr_of(slot.host, agent.host_addr)
