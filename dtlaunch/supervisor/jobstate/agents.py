"""The agent side of ``JobState``: agents saying hello, heartbeats, silence,
exits and launch failures, and reconciling what a reconnecting agent runs."""

from __future__ import annotations

from dtlaunch.supervisor.jobstate.base import JobStateBase
from dtlaunch.supervisor.jobstate.failures import ExitVerdict
from dtlaunch.supervisor.jobstate.nodes import (
    LIVE_PROC_STATES,
    AgentSlot,
    AgentState,
    Command,
    EmitEvent,
    LaunchAgent,
    Phase,
    ProcState,
    SendToAgent,
)
from dtlaunch.wire.messages import ProcReport

__all__ = ["AgentLifecycle"]


class AgentLifecycle(JobStateBase):
    def agent_hello(
        self,
        host: str,
        now: float,
        *,
        free_ports: list[int],
        host_addr: str,
        procs: list[ProcReport],
        pid: int = 0,
    ) -> list[Command]:
        agent = self.agents.get(host)
        if agent is None or agent.state in (AgentState.GONE,):
            return []
        out: list[Command] = []
        was = agent.state
        agent.state = AgentState.UP
        agent.last_seen = now
        agent.channel_closed = agent.adopting  # an adopted agent has no SSH channel
        agent.adopting = False
        if free_ports:
            agent.free_ports = list(free_ports)
        agent.host_addr = host_addr or agent.host_addr
        if was in (AgentState.LAUNCHING, AgentState.LOST):
            out.append(
                EmitEvent(kind="agent_up", host=host, data={"pid": pid, "free_ports": free_ports})
            )
        elif was is AgentState.UNRESPONSIVE:
            out.append(EmitEvent(kind="heartbeat_recovered", host=host, role="agent"))
        out += self._adopt_reported(host, procs, now)
        if self.phase is Phase.STOPPING:
            out.append(self._shutdown_message(host))
            return out
        if self.phase is Phase.STARTING and all(
            a.state is AgentState.UP for a in self.agents.values()
        ):
            self.phase = Phase.RUNNING
        return out + self._reconcile(now)

    def agent_seen(self, host: str, now: float) -> list[Command]:
        """Any message from an agent proves it is alive."""
        agent = self.agents.get(host)
        if agent is None or agent.state not in (AgentState.UP, AgentState.UNRESPONSIVE):
            return []
        agent.last_seen = now
        if agent.state is AgentState.UNRESPONSIVE:
            agent.state = AgentState.UP
            return [EmitEvent(kind="heartbeat_recovered", host=host, role="agent")]
        return []

    def heartbeat(self, host: str, now: float, procs: list[ProcReport]) -> list[Command]:
        out = self.agent_seen(host, now)
        for report in procs:
            slot = self.procs.get(report.proc_id)
            if slot is None or slot.attempt != report.attempt or slot.host != host:
                continue
            stopped = report.state == "stopped"
            if stopped and not slot.unresponsive:
                slot.unresponsive = True
                out.append(self._proc_event("unresponsive", slot, state=report.state))
            elif not stopped and slot.unresponsive:
                slot.unresponsive = False
                out.append(self._proc_event("responsive", slot, state=report.state))
        return out

    def agent_exited(self, host: str, now: float, *, definite: bool, detail: str) -> list[Command]:
        """The agent's SSH channel or local process ended.

        ``definite`` means the agent process is known to be dead (we saw its exit
        status); otherwise only the channel closed and the heartbeat decides.
        """
        agent = self.agents.get(host)
        if agent is None:
            return []
        if agent.state in (AgentState.GONE, AgentState.LOST):
            return []
        if self.phase in (Phase.STOPPING, Phase.DONE):
            agent.state = AgentState.GONE
            return [EmitEvent(kind="agent_exit", host=host, data={"detail": detail})]
        if not definite:
            agent.channel_closed = True
            return [
                EmitEvent(kind="agent_exit", host=host, data={"detail": detail, "definite": False})
            ]
        return self._agent_lost(agent, f"agent on {host} died ({detail})", now)

    def agent_bye(self, host: str, reason: str, now: float) -> list[Command]:
        agent = self.agents.get(host)
        if agent is None or agent.state in (AgentState.GONE, AgentState.LOST):
            return []
        if self.phase in (Phase.STOPPING, Phase.DONE):
            agent.state = AgentState.GONE
            gone = EmitEvent(kind="agent_exit", host=host, data={"detail": reason})
            return [gone, *self._maybe_finish(now)]
        return self._agent_lost(agent, f"agent on {host} exited: {reason}", now)

    def tick(self, now: float) -> list[Command]:
        out: list[Command] = []
        dead_after = self.timing.heartbeat_interval * self.timing.dead_after
        for agent in self.agents.values():
            silent = now - agent.last_seen
            if agent.state is AgentState.LAUNCHING and self.phase is not Phase.STOPPING:
                if agent.adopting and now - agent.launched_at > self.timing.agent_timeout:
                    # It did not come back after a resume: presume it dead, start anew.
                    agent.adopting = False
                    out.append(
                        EmitEvent(
                            kind="agent_lost",
                            host=agent.host,
                            data={"reason": "did not reconnect after the supervisor resumed"},
                        )
                    )
                    out += self._launch_agent(agent, now)
                elif now - agent.launched_at > self.timing.agent_timeout:
                    out += self._fail_job(
                        f"the agent on {agent.host} did not connect back within "
                        f"{self.timing.agent_timeout:g} s; check that {agent.host} can reach the "
                        "supervisor's address (firewall, --bind) and see "
                        f"logs/agent-{agent.host}.log",
                        now,
                    )
            elif agent.state is AgentState.UP and silent > dead_after:
                if agent.channel_closed:
                    out += self._agent_lost(agent, f"lost connection to {agent.host}", now)
                else:
                    agent.state = AgentState.UNRESPONSIVE
                    out.append(
                        EmitEvent(
                            kind="heartbeat_lost",
                            host=agent.host,
                            role="agent",
                            data={"silent_s": round(silent, 3)},
                        )
                    )
            elif (
                agent.state is AgentState.UNRESPONSIVE
                and (agent.channel_closed or silent > self.timing.orphan_timeout)
                and self.phase is not Phase.STOPPING
            ):
                out += self._agent_lost(
                    agent, f"agent on {agent.host} silent for {silent:.1f} s", now
                )
        if self.phase is Phase.STOPPING and now >= self.stop_deadline:
            out += self._finish()
        return out

    def agent_launch_failed(self, host: str, error: str, now: float) -> list[Command]:
        """The agent could not even be started (ssh, python, workdir): stop the job."""
        agent = self.agents.get(host)
        if agent is None or agent.state is AgentState.GONE:
            return []
        agent.state = AgentState.GONE
        if self.phase in (Phase.STOPPING, Phase.DONE):
            return self._maybe_finish(now)
        verdict = ExitVerdict(
            succeeded=False, retryable=False, reason="agent launch failed", error=error
        )
        self._add_failure("agent", -1, host, agent.launches - 1, verdict, None, None, [], now)
        out: list[Command] = [EmitEvent(kind="agent_lost", host=host, data={"reason": error})]
        return out + self._fail_job(f"cannot start the agent on {host}: {error}", now)

    def agent_launch_abandoned(self, host: str, now: float) -> list[Command]:
        """The job began stopping before this agent was started: it never will be."""
        agent = self.agents.get(host)
        if agent is None or agent.state is not AgentState.LAUNCHING:
            return []
        agent.state = AgentState.GONE
        return self._maybe_finish(now)

    def _launch_agent(self, agent: AgentSlot, now: float) -> list[Command]:
        agent.state = AgentState.LAUNCHING
        agent.launched_at = now
        agent.last_seen = now
        agent.channel_closed = False
        agent.launches += 1
        return [
            LaunchAgent(host=agent.host),
            EmitEvent(kind="agent_launch", host=agent.host, data={"launch": agent.launches}),
        ]

    def _adopt_reported(self, host: str, procs: list[ProcReport], now: float) -> list[Command]:
        """Reconcile what a (re)connecting agent runs with what we believe."""
        out: list[Command] = []
        by_id = {p.proc_id: p for p in procs}
        for slot in self.procs.values():
            if slot.host != host:
                continue
            report = by_id.get(slot.proc_id)
            if slot.state is ProcState.PENDING and report is not None and slot.bump_before_spawn:
                if report.attempt >= slot.attempt:
                    # Still running from before the supervisor restarted: adopt it.
                    slot.attempt = report.attempt
                    slot.state = ProcState.RUNNING
                    slot.pid = report.pid
                    slot.bump_before_spawn = False
                    out.append(
                        self._proc_event("adopted", slot, pid=report.pid, attempt=slot.attempt)
                    )
                    if slot.restart_if_found:
                        # Its state no longer matches ours: stop it, start it afresh.
                        out.append(SendToAgent(host=host, message=self._kill_message(slot)))
                        slot.state = ProcState.STOPPING
                        slot.restart_after_stop = True
                        slot.restart_reason = slot.restart_if_found
                    slot.restart_if_found = ""
                continue
            if slot.state is not ProcState.RUNNING:
                continue
            if report is None or report.attempt != slot.attempt:
                # It ended while we could not hear about it; its Exited was lost.
                verdict = ExitVerdict(
                    succeeded=False,
                    retryable=True,
                    reason="lost",
                    error=f"{slot.proc_id} vanished while {host} was unreachable",
                )
                out += self._gone(slot)
                out += self._on_failure(slot, verdict, None, None, [], now)
        return out

    def _agent_lost(self, agent: AgentSlot, reason: str, now: float) -> list[Command]:
        agent.state = AgentState.LOST
        out: list[Command] = [
            EmitEvent(kind="agent_lost", host=agent.host, data={"reason": reason})
        ]
        verdict = ExitVerdict(
            succeeded=False, retryable=True, reason="lost connection", error=reason
        )
        lost = [
            s for s in self.procs.values() if s.host == agent.host and s.state in LIVE_PROC_STATES
        ]
        for slot in lost:
            out += self._gone(slot)
            if slot.state is ProcState.STOPPING and slot.restart_after_stop:
                slot.restart_after_stop = False
                out.append(self._restart(slot, slot.restart_reason, now))
                continue
            if slot.state not in LIVE_PROC_STATES:
                continue  # already restarted as part of a group restart
            out += self._on_failure(slot, verdict, None, None, [], now, dead_host=agent.host)
        if self.phase is Phase.RUNNING or self.phase is Phase.STARTING:
            out += self._launch_agent(agent, now)
        else:
            out += self._maybe_finish(now)
        return out
