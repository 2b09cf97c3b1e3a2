"""The job's node table as an I/O-free state machine.

Stimuli (agent said hello, a process exited, time passed, a stop was asked for)
go in through methods; each returns the commands the supervisor must carry out
(launch an agent, send a message to one, emit an event, finish). Nothing here
touches a socket, a file or the clock, so tests drive it step by step with a
fake time.

Restart rules (AntDT §V-D): a retryable failure restarts its process with the
same rank and ``attempt + 1`` (= ``TORCHELASTIC_RESTART_COUNT``) until the rank has
used ``max_restarts``; an unretryable one stops the job. With restart scope
``group`` (the default in allreduce mode, as torchrun does) every worker of the
group is stopped and restarted together, because a static ``torch.distributed``
world cannot lose a member and go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dtlaunch.supervisor.jobstate.agents import AgentLifecycle
from dtlaunch.supervisor.jobstate.endpoints import (
    MASTER_PORT_SLOTS,
    SERVERS_PER_HOST_MAX,
    Endpoints,
)
from dtlaunch.supervisor.jobstate.failures import ExitVerdict, classify_exit, traceback_tail
from dtlaunch.supervisor.jobstate.nodes import (
    LIVE_PROC_STATES,
    AgentSlot,
    AgentState,
    Command,
    EmitEvent,
    FailureRecord,
    Finish,
    LaunchAgent,
    Phase,
    ProcSlot,
    ProcState,
    RestartRecord,
    SendToAgent,
    Timing,
    WorkerGone,
)
from dtlaunch.supervisor.jobstate.replace import Replacements
from dtlaunch.supervisor.placement import Assignment
from dtlaunch.wire.messages import Exited, Kill, Shutdown, Spawn

__all__ = [
    "MASTER_PORT_SLOTS",
    "SERVERS_PER_HOST_MAX",
    "AgentState",
    "Command",
    "EmitEvent",
    "Finish",
    "JobState",
    "LaunchAgent",
    "Phase",
    "ProcSlot",
    "ProcState",
    "SendToAgent",
    "SpawnBuilder",
    "Timing",
    "WorkerGone",
]


# A function that builds the Spawn for a process: (slot, master_addr, master_port).
SpawnBuilder = Callable[[ProcSlot, str, int], Spawn]


class JobState(AgentLifecycle, Replacements, Endpoints):
    """All the supervisor knows about the job's agents and processes."""

    def __init__(
        self,
        assignments: list[Assignment],
        *,
        timing: Timing,
        max_restarts: int,
        restart_scope: str,
        build_spawn: SpawnBuilder,
        builtin_ps: bool = False,
        master_addr_of: Callable[[str, str], str],
        spare_hosts: Sequence[str] = (),
    ) -> None:
        self.timing = timing
        self.max_restarts = max_restarts
        self.restart_scope = restart_scope
        self._build_spawn = build_spawn
        self.builtin_ps = builtin_ps  # servers are python -m dtlaunch.ps on agent-chosen ports
        self._master_addr_of = master_addr_of  # (host label, agent host_addr) -> address
        self.procs: dict[str, ProcSlot] = {}
        for a in assignments:
            slot = ProcSlot(assignment=a, host=a.host)
            self.procs[slot.proc_id] = slot
        self.spare_hosts = list(spare_hosts)
        # Built-in PS: which of a host's free ports each server binds, by index,
        # kept for the job (a server moving away must not shift the others').
        self.ps_port_index: dict[tuple[str, int], int] = {}
        for host in dict.fromkeys(a.host for a in assignments if a.role == "server"):
            local = sorted(a.rank for a in assignments if a.role == "server" and a.host == host)
            for i, rank in enumerate(local):
                self.ps_port_index[host, rank] = MASTER_PORT_SLOTS + i
        # proc id -> (host, attempt) of a replaced process that still runs while
        # its prewarmed replacement waits (see replace_prewarmed).
        self.retiring: dict[str, tuple[str, int]] = {}
        self.handed_over: set[str] = set()  # retiring servers whose blocks moved on
        # Spare hosts get an agent too, so a KILL_RESTART onto one starts at once.
        self.agents: dict[str, AgentSlot] = {
            host: AgentSlot(host=host)
            for host in dict.fromkeys([*(a.host for a in assignments), *spare_hosts])
        }
        self.phase = Phase.STARTING
        self.status = ""
        self.stop_reason = ""
        self.stop_deadline = 0.0
        self.failures: list[FailureRecord] = []
        self.restarts: list[RestartRecord] = []
        self.started_at = 0.0

    # ------------------------------------------------------------- stimuli

    def start(self, now: float) -> list[Command]:
        self.started_at = now
        out: list[Command] = []
        for agent in self.agents.values():
            out += self._launch_agent(agent, now)
        return out

    def resume(
        self,
        now: float,
        *,
        attempts: dict[str, int],
        restarts: list[RestartRecord],
        failures: list[FailureRecord],
        adopt: set[str],
        restart_workers: str = "",
        hosts: dict[str, str] | None = None,
    ) -> list[Command]:
        """A supervisor restarted with --resume: the agents in ``adopt`` (those the
        dead supervisor had started) are expected to reconnect; others are launched.

        Processes keep their last attempt; those no agent reports running are
        restarted (the next spawn bumps the attempt) once all agents are back.
        """
        self.started_at = now
        self.restarts = list(restarts)
        self.failures = list(failures)
        for slot in self.procs.values():
            slot.attempt = attempts.get(slot.proc_id, 0)
            moved_to = (hosts or {}).get(slot.proc_id, slot.host)
            if moved_to in self.agents:  # replaced on a spare host before the crash
                slot.host = moved_to
            slot.bump_before_spawn = slot.proc_id in attempts
            if slot.role == "worker":
                slot.restart_if_found = restart_workers
        out: list[Command] = [EmitEvent(kind="resume", data={"attempts": attempts})]
        for agent in self.agents.values():
            if agent.host not in adopt:
                out += self._launch_agent(agent, now)
                continue
            agent.state = AgentState.LAUNCHING
            agent.adopting = True
            agent.channel_closed = True  # no SSH channel to it: heartbeats decide
            agent.launched_at = now
            agent.last_seen = now
        return out

    def spawned(self, host: str, proc_id: str, attempt: int, pid: int, now: float) -> list[Command]:
        slot = self.procs.get(proc_id)
        if slot is None or slot.attempt != attempt or slot.state is not ProcState.STARTING:
            return []
        slot.state = ProcState.RUNNING
        slot.pid = pid
        slot.started_at = now
        return [self._proc_event("running", slot, pid=pid, attempt=attempt)]

    def spawn_failed(
        self, host: str, proc_id: str, attempt: int, error: str, now: float
    ) -> list[Command]:
        slot = self.procs.get(proc_id)
        if slot is None or slot.attempt != attempt:
            return []
        slot.state = ProcState.FAILED
        verdict = ExitVerdict(succeeded=False, retryable=False, reason="spawn failed", error=error)
        self._record_failure(slot, verdict, None, None, [error], now)
        out: list[Command] = [self._proc_event("spawn_failed", slot, error=error)]
        return out + self._fail_job(f"{slot.proc_id} could not be started on {host}: {error}", now)

    def exited(self, host: str, msg: Exited, now: float) -> list[Command]:
        aborted: list[Command] = []
        moving = msg.proc_id.startswith("server-") and msg.proc_id not in self.handed_over
        if self.retiring.get(msg.proc_id) == (host, msg.attempt) and moving:
            # A server died before it handed its blocks over: it is still the one
            # that counts. Give the move up, then handle its exit as any failure.
            aborted = self.abort_server_move(int(msg.proc_id.rpartition("-")[2]), now)
        return aborted + self._exited(host, msg, now)

    def _exited(self, host: str, msg: Exited, now: float) -> list[Command]:
        if self.retiring.get(msg.proc_id) == (host, msg.attempt):
            # The replaced process is gone: its shards go back, its rank's
            # replacement may join.
            del self.retiring[msg.proc_id]
            role, _, rank = msg.proc_id.rpartition("-")
            retired: list[Command] = [
                EmitEvent(
                    kind="exit",
                    host=host,
                    role=role,
                    rank=int(rank),
                    data={"exit_code": msg.exit_code, "signal": msg.signal, "retired": True},
                )
            ]
            # A retired server handed its blocks over before it was stopped.
            return [*retired, WorkerGone(rank=int(rank))] if role == "worker" else retired
        slot = self.procs.get(msg.proc_id)
        if slot is None or slot.attempt != msg.attempt or slot.state not in LIVE_PROC_STATES:
            return []
        verdict = classify_exit(
            exit_code=msg.exit_code,
            signal=msg.signal,
            runtime_s=msg.runtime_s,
            stderr_tail=msg.stderr_tail,
            oom_killed=msg.oom_killed,
        )
        out: list[Command] = [
            self._proc_event(
                "exit",
                slot,
                exit_code=msg.exit_code,
                signal=msg.signal,
                runtime_s=round(msg.runtime_s, 3),
                requested=msg.requested,
                verdict=verdict.reason,
            )
        ]
        slot.unresponsive = False
        out += self._gone(slot)
        if slot.state is ProcState.STOPPING or msg.requested or self.phase is Phase.STOPPING:
            if slot.restart_after_stop and self.phase in (Phase.RUNNING, Phase.STARTING):
                slot.restart_after_stop = False
                out.append(self._restart(slot, slot.restart_reason, now))
                if slot.next_host:
                    out.append(
                        self._proc_event("moved", slot, old_host=slot.host, new_host=slot.next_host)
                    )
                    slot.host, slot.next_host = slot.next_host, ""
                return out + self._reconcile(now)
            slot.state = ProcState.SUCCEEDED if verdict.succeeded else ProcState.STOPPED
            return out + self._maybe_finish(now)
        if verdict.succeeded:
            slot.state = ProcState.SUCCEEDED
            return out + self._maybe_complete(now)
        return out + self._on_failure(
            slot, verdict, msg.exit_code, msg.signal, msg.stderr_tail, now
        )

    def stop(self, reason: str, now: float) -> list[Command]:
        if self.phase in (Phase.STOPPING, Phase.DONE):
            return []
        out: list[Command] = [EmitEvent(kind="stop_requested", data={"reason": reason})]
        return out + self._begin_stopping("stopped", reason, now)

    # --------------------------------------------------------------- helpers

    def _gone(self, slot: ProcSlot) -> list[Command]:
        return [WorkerGone(rank=slot.rank)] if slot.role == "worker" else []

    def _on_failure(
        self,
        slot: ProcSlot,
        verdict: ExitVerdict,
        exit_code: int | None,
        signal: int | None,
        stderr_tail: list[str],
        now: float,
        *,
        dead_host: str = "",
    ) -> list[Command]:
        self._record_failure(slot, verdict, exit_code, signal, stderr_tail, now)
        out: list[Command] = [
            self._proc_event(
                "failure",
                slot,
                reason=verdict.reason,
                error=verdict.error,
                retryable=verdict.retryable,
                attempt=slot.attempt,
                exit_code=exit_code,
                signal=signal,
                traceback=traceback_tail(stderr_tail),
            )
        ]
        slot.state = ProcState.FAILED
        if not verdict.retryable:
            return out + self._fail_job(
                f"{slot.proc_id} on {slot.host} failed with an unretryable error: {verdict.error}",
                now,
            )
        if slot.attempt >= self.max_restarts:
            return out + self._fail_job(
                f"{slot.proc_id} on {slot.host} failed ({verdict.error}) and has used all "
                f"{self.max_restarts} restarts (--max-restarts)",
                now,
            )
        why = (
            verdict.error
            if verdict.error.startswith(verdict.reason)
            else f"{verdict.reason}: {verdict.error}"
        )
        if self.restart_scope == "group" and slot.role == "worker":
            return out + self._restart_group(slot, why, now, dead_host=dead_host)
        out.append(self._restart(slot, why, now))
        return out + self._reconcile(now)

    def _restart(self, slot: ProcSlot, reason: str, now: float) -> EmitEvent:
        # Never an attempt number used before (an aborted move's may still exit late).
        slot.attempt = max(slot.attempt, slot.spent_attempts) + 1
        slot.spent_attempts = slot.attempt
        slot.state = ProcState.PENDING
        slot.unresponsive = False
        self.restarts.append(
            RestartRecord(
                role=slot.role,
                rank=slot.rank,
                host=slot.host,
                reason=reason,
                at_s=round(now - self.started_at, 3),
                attempt=slot.attempt,
            )
        )
        return self._proc_event("restart", slot, reason=reason, attempt=slot.attempt)

    def _restart_group(
        self, trigger: ProcSlot, reason: str, now: float, *, dead_host: str
    ) -> list[Command]:
        out: list[Command] = [self._restart(trigger, reason, now)]
        for proc_id in list(self.retiring):  # a replaced worker still running goes too
            if proc_id.startswith("worker-"):  # (a server hands its blocks over first)
                out += self.retire(proc_id)
        group_reason = f"group restart after {trigger.proc_id} failed ({reason})"
        for slot in self.procs.values():
            if slot.role != "worker" or slot is trigger:
                continue
            if slot.state in (ProcState.STARTING, ProcState.RUNNING) and slot.host != dead_host:
                # Restarted (attempt bumped) once its Exited for this attempt arrives.
                out.append(SendToAgent(host=slot.host, message=self._kill_message(slot)))
                slot.state = ProcState.STOPPING
                slot.restart_after_stop = True
                slot.restart_reason = group_reason
            elif slot.state in (ProcState.SUCCEEDED, ProcState.FAILED) or (
                slot.host == dead_host and slot.state in LIVE_PROC_STATES
            ):
                out.append(self._restart(slot, group_reason, now))
        return out + self._reconcile(now)

    def _kill_message(self, slot: ProcSlot) -> Kill:
        return Kill(proc_id=slot.proc_id, attempt=slot.attempt, grace_s=self.timing.kill_grace)

    def _reconcile(self, now: float) -> list[Command]:
        """Spawn every pending process whose agent is ready."""
        if self.phase is not Phase.RUNNING:
            return []
        out: list[Command] = []
        # A group restart waits until every old worker is gone.
        group_barrier = self.restart_scope == "group" and any(
            s.role == "worker" and s.state is ProcState.STOPPING for s in self.procs.values()
        )
        master = self.procs.get("worker-0")
        for slot in self.procs.values():
            if slot.state is not ProcState.PENDING:
                continue
            if slot.role == "worker" and group_barrier:
                continue
            agent = self.agents[slot.host]
            if agent.state is not AgentState.UP:
                continue
            if slot.join is not None:
                master_addr, master_port = slot.join.master_addr, slot.join.master_port
            else:
                master_addr, master_port = self._master_endpoint(master, slot)
            if slot.role == "worker" and master_port == 0:
                continue
            if self.builtin_ps and not self._place_ps(slot):
                continue  # a port or a server endpoint is not known yet
            if slot.bump_before_spawn:
                slot.bump_before_spawn = False
                out.append(self._restart(slot, "lost while the supervisor was down", now))
            slot.state = ProcState.STARTING
            spawn = self._build_spawn(slot, master_addr, master_port)
            slot.join = None  # only this attempt joins the survivors
            slot.prewarm = False
            out.append(SendToAgent(host=slot.host, message=spawn))
            out.append(self._proc_event("spawn", slot, attempt=slot.attempt, argv=spawn.argv))
        return out

    def _record_failure(
        self,
        slot: ProcSlot,
        verdict: ExitVerdict,
        exit_code: int | None,
        signal: int | None,
        stderr_tail: list[str],
        now: float,
    ) -> None:
        self._add_failure(
            slot.role,
            slot.rank,
            slot.host,
            slot.attempt,
            verdict,
            exit_code,
            signal,
            stderr_tail,
            now,
        )

    def _add_failure(
        self,
        role: str,
        rank: int,
        host: str,
        attempt: int,
        verdict: ExitVerdict,
        exit_code: int | None,
        signal: int | None,
        stderr_tail: list[str],
        now: float,
    ) -> None:
        self.failures.append(
            FailureRecord(
                role=role,
                rank=rank,
                host=host,
                exit_code=exit_code,
                signal=signal,
                error=verdict.error,
                reason=verdict.reason,
                retryable=verdict.retryable,
                at_s=round(now - self.started_at, 3),
                attempt=attempt,
                traceback=traceback_tail(stderr_tail),
            )
        )

    def _maybe_complete(self, now: float) -> list[Command]:
        workers = [s for s in self.procs.values() if s.role == "worker"]
        if all(s.state is ProcState.SUCCEEDED for s in workers):
            return self._begin_stopping("succeeded", "all workers finished", now)
        return []

    def _fail_job(self, reason: str, now: float) -> list[Command]:
        if self.phase in (Phase.STOPPING, Phase.DONE):
            return []
        return self._begin_stopping("failed", reason, now)

    def _begin_stopping(self, status: str, reason: str, now: float) -> list[Command]:
        self.phase = Phase.STOPPING
        self.status = status
        self.stop_reason = reason
        self.stop_deadline = now + self.timing.kill_grace + 10.0
        out: list[Command] = [EmitEvent(kind="decision", data={"status": status, "reason": reason})]
        for agent in self.agents.values():
            if agent.state in (AgentState.UP, AgentState.UNRESPONSIVE, AgentState.LAUNCHING):
                out.append(self._shutdown_message(agent.host))
        return out + self._maybe_finish(now)

    def _shutdown_message(self, host: str) -> SendToAgent:
        return SendToAgent(
            host=host, message=Shutdown(grace_s=self.timing.kill_grace, reason=self.stop_reason)
        )

    def _maybe_finish(self, now: float) -> list[Command]:
        if self.phase is not Phase.STOPPING:
            return []
        # An agent still launching may yet connect; it must hear Shutdown first.
        # The stop deadline bounds the wait.
        waiting = (AgentState.UP, AgentState.UNRESPONSIVE, AgentState.LAUNCHING)
        if any(a.state in waiting for a in self.agents.values()):
            return []
        return self._finish()

    def _finish(self) -> list[Command]:
        if self.phase is Phase.DONE:
            return []
        self.phase = Phase.DONE
        for slot in self.procs.values():
            if slot.state in LIVE_PROC_STATES or slot.state is ProcState.PENDING:
                slot.state = ProcState.STOPPED
        return [Finish(status=self.status)]

    def _proc_event(self, kind: str, slot: ProcSlot, **data: Any) -> EmitEvent:
        return EmitEvent(kind=kind, host=slot.host, role=slot.role, rank=slot.rank, data=data)

    def first_failure(self) -> FailureRecord | None:
        return self.failures[0] if self.failures else None
