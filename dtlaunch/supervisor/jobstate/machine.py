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

One machine, one class, in sections: construction and queries; the job's life
(start, resume, stop, tick); agents (hello, heartbeats, silence, exits,
reconciling what a reconnecting agent runs); processes (spawns, exits, failures,
the stall watchdog's verdict, restarts and the restart rules); KILL_RESTART,
hand-overs to a replacement started ahead, and spare hosts; endpoints (an
attempt's MASTER_PORT, the parameter servers' ports). It is long on purpose:
its parts share every field, and split into mixins each part had to restate
the others' signatures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.quantities import format_size
from dtlaunch.supervisor.jobstate.failures import (
    CRASH_LOOP_RUNTIME_S,
    ExitVerdict,
    classify_exit,
    exception_name,
    failure_signature,
    last_exception_line,
    traceback_tail,
)
from dtlaunch.supervisor.jobstate.limits import LimitRules, memory_skewed
from dtlaunch.supervisor.jobstate.nodes import (
    LIVE_PROC_STATES,
    AgentSlot,
    AgentState,
    AskToLeave,
    Command,
    EmitEvent,
    FailureRecord,
    Finish,
    JoinSpec,
    LaunchAgent,
    Phase,
    ProcSlot,
    ProcState,
    RestartRecord,
    SendToAgent,
    Timing,
    WorkerGone,
)
from dtlaunch.supervisor.jobstate.scaling import added_assignment, plan_scale
from dtlaunch.supervisor.jobstate.tftasks import tf_cluster
from dtlaunch.supervisor.placement import ROLE_SERVER, Assignment
from dtlaunch.wire.messages import Exited, Kill, Message, ProcReport, Shutdown, Spawn

__all__ = [
    "LEAVE_GRACE_S",
    "LISTENERS_PER_HOST_MAX",
    "MASTER_PORT_SLOTS",
    "AgentState",
    "AskToLeave",
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


# The first agent free ports alternate as MASTER_PORT; processes that listen (the
# built-in PS servers, TensorFlow's tasks) take the rest, one each for the job
# (the agent finds FREE_PORTS = MASTER_PORT_SLOTS + LISTENERS_PER_HOST_MAX).
MASTER_PORT_SLOTS = 2
LISTENERS_PER_HOST_MAX = 30
# A lost host is tried again after 2, 4, 8, 16 s, then every 30 s.
RELAUNCH_BACKOFF_MAX_S = 30.0
# A host lost for the n-th time takes no moved or restarted process for
# 30 s x 2^(n-1), at most 30 min (Horovod's elastic mode blacklists a failed
# host for good; a flapping one here comes back once it has stayed away).
HOST_COOLDOWN_BASE_S = 30.0
HOST_COOLDOWN_MAX_S = 1800.0
# Each running process's memory and CPU (from the agents' heartbeats) go into the
# event log this often, for `replay --plot`: about 30 bytes a process.
RESOURCE_SAMPLE_S = 15.0

# A function that builds the Spawn for a process: (slot, master_addr, master_port).
SpawnBuilder = Callable[[ProcSlot, str, int], Spawn]

# Agents that may still connect or answer: a stopping job waits for them to go.
_REACHABLE_AGENT_STATES = (AgentState.UP, AgentState.UNRESPONSIVE, AgentState.LAUNCHING)
# Processes that hold their host: running or about to be spawned there.
_BUSY_PROC_STATES = (*LIVE_PROC_STATES, ProcState.PENDING)
# A worker a scale-down removed finishes the shard it reads, then leaves (every
# record once); one that has not exited this long after being asked is stopped.
LEAVE_GRACE_S = 120.0


def _rank_of(proc_id: str) -> int:
    """The rank in a proc id (``worker-<rank>``, ``server-<rank>``)."""
    return int(proc_id.rpartition("-")[2])


def _limits_of(slot: ProcSlot) -> dict[str, float]:
    """The limit fields of a spawn event: only those that are set."""
    limits: dict[str, float] = {}
    if slot.memory_limit:
        limits["memory_limit"] = slot.memory_limit
    if slot.cpu_limit:
        limits["cpu_limit"] = slot.cpu_limit
    return limits


def _gpu_of(slot: ProcSlot) -> dict[str, int]:
    """The ``gpu`` field of a process event: present only on a GPU host."""
    return {"gpu": slot.gpu} if slot.gpu >= 0 else {}


def _port_of(slot: ProcSlot) -> dict[str, int]:
    """The ``port`` field of a spawn event: where a listening process binds."""
    return {"port": slot.listen_port} if slot.listen_port else {}


class JobState:
    """All the supervisor knows about the job's agents and processes."""

    # ----------------------------------------------------- construction and queries

    def __init__(
        self,
        assignments: list[Assignment],
        *,
        timing: Timing,
        max_restarts: int,
        restart_scope: str,
        build_spawn: SpawnBuilder,
        builtin_ps: bool = False,
        tf_tasks: str = "",
        master_addr_of: Callable[[str, str], str],
        spare_hosts: Sequence[str] = (),
        host_slots: Mapping[str, int] | None = None,
        host_gpus: Mapping[str, int] | None = None,
        limits: LimitRules | None = None,
    ) -> None:
        self.timing = timing
        self.limits = limits or LimitRules()
        self.max_restarts = max_restarts
        self.restart_scope = restart_scope
        self._build_spawn = build_spawn
        self.builtin_ps = builtin_ps  # servers are python -m dtlaunch.ps on agent-chosen ports
        # --framework tf: "allreduce" or "ps" (which TF tasks the processes are, see
        # tftasks); every process listens on an agent-chosen port and gets TF_CONFIG.
        # In PS mode worker 0, TF's chief, is the one whose success ends the job.
        self.tf_tasks = tf_tasks
        self._master_addr_of = master_addr_of  # (host label, agent host_addr) -> address
        self.procs: dict[str, ProcSlot] = {}
        for a in assignments:
            slot = ProcSlot(
                assignment=a,
                host=a.host,
                memory_limit=self.limits.first_memory(a.host),
                cpu_limit=self.limits.first_cpus(a.host),
            )
            self.procs[slot.proc_id] = slot
        self.spare_hosts = list(spare_hosts)
        # Slots per host (the hostfile's): how many moved workers a spare takes.
        self.host_slots = dict(host_slots or {})
        # GPUs per host (the hostfile's gpus=): each worker there holds one.
        self.host_gpus = dict(host_gpus or {})
        # Which of a host's free ports each listening process binds, by index,
        # kept for the job: a restarted task keeps its host:port (TF's coordinator
        # and the PS clients expect it), and a process moving away must not shift
        # the others'.
        self.listen_port_index: dict[tuple[str, str], int] = {}
        for host in dict.fromkeys(a.host for a in assignments):
            local = [s for s in self.procs.values() if s.host == host and self._listens(s)]
            for i, slot in enumerate(local):
                self.listen_port_index[host, slot.proc_id] = MASTER_PORT_SLOTS + i
        # (host, proc id) -> the port it was given: fixed from then on, even when
        # the agent reports other free ports in a later Hello (each Hello probes
        # anew, and a port its processes hold is not free), and across a resume.
        self.listen_ports: dict[tuple[str, str], int] = {}
        # proc id -> (host, attempt) of a replaced process that still runs while
        # its prewarmed replacement waits (see replace_prewarmed).
        self.retiring: dict[str, tuple[str, int]] = {}
        self.handed_over: set[str] = set()  # retiring servers whose blocks moved on
        # proc id -> (host, attempt) of an earlier attempt an agent still ran when
        # it came back after being declared lost: stopped (fenced) so that no rank
        # runs twice; its slot is not spawned on that host until it has exited.
        self.fenced: dict[str, tuple[str, int]] = {}
        # proc id -> (host, attempt) of a worker a scale-down removed, until it has
        # exited: its exit gives its data back; the rank is not restarted.
        self.removing: dict[str, tuple[str, int]] = {}
        # proc id -> the last attempt of a removed worker: a scale-up that adds the
        # rank again starts after it, so no identity of the old process counts.
        self._removed_attempts: dict[str, int] = {}
        self._leave_by: dict[str, float] = {}  # removed proc id -> when it is stopped
        # How many built-in servers the job should run: a scale-in lowers it at
        # once, and the servers from it up serve on until their blocks moved off
        # (``server_drained``); a scale-out adds their slots.
        self.server_target = sum(1 for a in assignments if a.role == ROLE_SERVER)
        self.ps_map_servers = 0  # the servers of the job's block map (0: none registered yet)
        self.ps_map_blocks = 0  # and its blocks: more servers than blocks hold nothing
        self._scale_restart = False  # a scale restarts the group: the new one starts together
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
        self.now = 0.0  # the clock of the last tick: when host cooldowns end
        self._sampled_at = 0.0  # the last "resources" event

    def first_failure(self) -> FailureRecord | None:
        return self.failures[0] if self.failures else None

    def address_of(self, proc_id: str) -> str:
        """The address other hosts reach ``proc_id``'s host at ("" if unknown)."""
        slot = self.procs.get(proc_id)
        agent = self.agents.get(slot.host) if slot is not None else None
        if slot is None or agent is None or agent.state is not AgentState.UP:
            return ""
        return self._master_addr_of(slot.host, agent.host_addr)

    # ------------------------------------ the job's life: start, resume, stop, tick

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
        gpus: dict[str, int] | None = None,
        memory_limits: dict[str, tuple[int, int]] | None = None,
        listen_ports: dict[str, tuple[str, int]] | None = None,
        released_workers: Sequence[int] = (),
        leaving: Mapping[int, tuple[str, int]] | None = None,
        server_target: int | None = None,
    ) -> list[Command]:
        """A supervisor restarted with --resume: the agents in ``adopt`` (those the
        dead supervisor had started) are expected to reconnect; others are launched.
        ``listen_ports``: proc id -> (host, port) its last spawn listened on, kept.
        ``released_workers``: ranks a scale-down removed; the data they may hold
        goes back (one that still runs is fenced when its agent reports it).
        ``leaving``: rank -> (host, attempt) of removed workers that still finish
        their shard (an allreduce resize under way): removed as before the stop.
        ``server_target``: the servers the last ``dtlaunch scale --servers`` asked
        for (the slots above it serve on until drained).

        Processes keep their last attempt; those no agent reports running are
        restarted (the next spawn bumps the attempt) once all agents are back.
        """
        self.started_at = now
        self.restarts = list(restarts)
        self.failures = list(failures)
        if server_target is not None:
            self.server_target = server_target
        for slot in self.procs.values():
            slot.attempt = attempts.get(slot.proc_id, 0)
            moved_to = (hosts or {}).get(slot.proc_id, slot.host)
            if moved_to in self.agents:  # replaced on a spare host before the crash
                self._place_on(slot, moved_to)  # (the memory limit is the history's)
            slot.gpu = (gpus or {}).get(slot.proc_id, -1)
            # An OOM relaunch's larger limit holds for every later attempt.
            slot.memory_limit, slot.oom_relaunches = (memory_limits or {}).get(
                slot.proc_id, (slot.memory_limit, 0)
            )
            slot.bump_before_spawn = slot.proc_id in attempts
            host, port = (listen_ports or {}).get(slot.proc_id, ("", 0))
            if port:
                self.listen_ports[host, slot.proc_id] = port
            if slot.role == "worker":
                slot.restart_if_found = restart_workers
        out: list[Command] = [EmitEvent(kind="resume", data={"attempts": attempts})]
        out += [WorkerGone(rank=rank) for rank in released_workers]
        for rank, held in (leaving or {}).items():
            self.removing[f"worker-{rank}"] = held
            self._leave_by[f"worker-{rank}"] = now + LEAVE_GRACE_S
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

    def stop(self, reason: str, now: float) -> list[Command]:
        if self.phase in (Phase.STOPPING, Phase.DONE):
            return []
        out: list[Command] = [EmitEvent(kind="stop_requested", data={"reason": reason})]
        return out + self._begin_stopping("stopped", reason, now)

    def tick(self, now: float) -> list[Command]:
        out: list[Command] = []
        cooled = [a for a in self.agents.values() if self.now < a.cooldown_until <= now]
        self.now = now
        for agent in cooled:
            out.append(EmitEvent(kind="host_cooldown_over", host=agent.host))
        if cooled:
            out += self._reconcile(now)  # a waiting worker may move there now
        if self.phase is Phase.RUNNING and now - self._sampled_at >= RESOURCE_SAMPLE_S:
            self._sampled_at = now
            out += self._resource_sample()
        for agent in self.agents.values():
            out += self._check_silence(agent, now)
        for proc_id, deadline in list(self._leave_by.items()):
            if now >= deadline:
                why = f"still running {LEAVE_GRACE_S:.0f} s after it was asked to leave"
                out += self.leave_unheard(_rank_of(proc_id), self.removing[proc_id][1], why)
        if self.phase is Phase.STOPPING and now >= self.stop_deadline:
            out += self._finish()
        return out

    def _resource_sample(self) -> list[Command]:
        """proc id -> [RSS bytes, CPU %, memory limit] of every running process
        an agent has measured (none before the first heartbeat)."""
        procs = {
            s.proc_id: [s.rss_bytes, round(s.cpu_percent, 1), s.memory_limit]
            for s in self.procs.values()
            if s.state is ProcState.RUNNING and s.rss_bytes
        }
        return [EmitEvent(kind="resources", data={"procs": procs})] if procs else []

    def _maybe_complete(self, now: float) -> list[Command]:
        if self.tf_tasks == "ps":
            # TF's worker and ps tasks serve until stopped; the chief's end is the job's.
            if self.procs["worker-0"].state is ProcState.SUCCEEDED:
                return self._begin_stopping("succeeded", "the chief (worker 0) finished", now)
            return []
        if self.removing:  # a removed worker still leaving may give shards back
            return []
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
            if agent.state in _REACHABLE_AGENT_STATES:
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
        if any(a.state in _REACHABLE_AGENT_STATES for a in self.agents.values()):
            return []
        return self._finish()

    def _finish(self) -> list[Command]:
        if self.phase is Phase.DONE:
            return []
        self.phase = Phase.DONE
        for slot in self.procs.values():
            if slot.state in _BUSY_PROC_STATES:
                slot.state = ProcState.STOPPED
        return [Finish(status=self.status)]

    # ------------------------------------ agents: hello, heartbeats, silence, exits

    def agent_hello(
        self,
        host: str,
        now: float,
        *,
        free_ports: list[int],
        host_addr: str,
        procs: list[ProcReport],
        pid: int = 0,
        memory_bytes: int = 0,
        limits: str = "",
    ) -> list[Command]:
        """An agent says who it is and what it runs (and, kept by
        ``heard_before_hello``, what ended while it could not reach us)."""
        agent = self.agents.get(host)
        if agent is None or agent.state in (AgentState.GONE,):
            return []
        out: list[Command] = []
        if agent.lost_at and pid != agent.pid:
            out += self._stopped_with_their_agent(agent, procs)
        agent.stale_attempts.clear()
        replaced = agent.pid not in (0, pid)
        agent.pid = pid
        was = agent.state
        agent.state = AgentState.UP
        agent.last_seen = now
        agent.was_up = True
        agent.lost_at = agent.relaunch_at = 0.0
        agent.relaunch_failures = 0
        agent.channel_closed = agent.adopting  # an adopted agent has no SSH channel
        agent.adopting = False
        if free_ports:
            agent.free_ports = list(free_ports)
        agent.host_addr = host_addr or agent.host_addr
        agent.memory_bytes = memory_bytes or agent.memory_bytes
        if was in (AgentState.LAUNCHING, AgentState.LOST):
            data: dict[str, Any] = {"pid": pid, "free_ports": free_ports}
            if limits:
                data |= {"memory_bytes": memory_bytes, "limits": limits}
            out.append(EmitEvent(kind="agent_up", host=host, data=data))
        elif was is AgentState.UNRESPONSIVE:
            out.append(EmitEvent(kind="heartbeat_recovered", host=host, role="agent"))
        out += self._adopt_reported(host, procs, now, replaced=replaced)
        out += self._adopt_ended(host, list(agent.exits_before_hello), now)
        agent.exits_before_hello.clear()
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
        agent = self.agents.get(host)
        if agent is not None and agent.lost_at and agent.state is not AgentState.UP:
            # An agent given up for lost is heard again (a network cut healed)
            # before it says hello: stop its stale attempts now, not after the
            # hello or the relaunch, so their ranks do not run twice meanwhile.
            return self._fence_stale(host, procs)
        out = self.agent_seen(host, now)
        for report in procs:
            slot = self.procs.get(report.proc_id)
            if slot is None or slot.attempt != report.attempt or slot.host != host:
                continue
            slot.rss_bytes, slot.cpu_percent = report.rss_bytes, report.cpu_percent
            slot.cpu_throttled = report.cpu_throttled
            stopped = report.state == "stopped"
            if stopped and not slot.unresponsive:
                slot.unresponsive = True
                out.append(self._proc_event("unresponsive", slot, state=report.state))
            elif not stopped and slot.unresponsive:
                slot.unresponsive = False
                out.append(self._proc_event("responsive", slot, state=report.state))
        return out

    def _check_silence(self, agent: AgentSlot, now: float) -> list[Command]:
        """On each tick: an agent that never connected, or has gone silent."""
        silent = now - agent.last_seen
        if agent.state is AgentState.LAUNCHING and self.phase is not Phase.STOPPING:
            if agent.queued:
                return []  # its turn has not come: its launch has not begun
            if agent.adopting and now - agent.launched_at > self.timing.agent_timeout:
                # It did not come back after a resume: presume it dead, start anew.
                agent.adopting = False
                lost = EmitEvent(
                    kind="agent_lost",
                    host=agent.host,
                    data={"reason": "did not reconnect after the supervisor resumed"},
                )
                return [lost, *self._launch_agent(agent, now)]
            if now - agent.launched_at > self.timing.agent_timeout and agent.was_up:
                return self._relaunch_later(
                    agent,
                    f"the agent did not connect back within {self.timing.agent_timeout:g} s",
                    now,
                )
            if now - agent.launched_at > self.timing.agent_timeout:
                return self._fail_job(
                    f"the agent on {agent.host} did not connect back within "
                    f"{self.timing.agent_timeout:g} s; check that {agent.host} can reach the "
                    "supervisor's address (firewall, --bind) and see "
                    f"logs/agent-{agent.host}.log",
                    now,
                )
        elif agent.state is AgentState.UP:
            if silent <= self.timing.heartbeat_interval * self.timing.dead_after:
                return []
            if agent.channel_closed:
                return self._agent_lost(agent, f"lost connection to {agent.host}", now)
            agent.state = AgentState.UNRESPONSIVE
            return [
                EmitEvent(
                    kind="heartbeat_lost",
                    host=agent.host,
                    role="agent",
                    data={"silent_s": round(silent, 3)},
                )
            ]
        elif (
            agent.state is AgentState.UNRESPONSIVE
            and (agent.channel_closed or silent > self.timing.orphan_timeout)
            and self.phase is not Phase.STOPPING
        ):
            return self._agent_lost(agent, f"agent on {agent.host} silent for {silent:.1f} s", now)
        elif agent.state is AgentState.LOST and agent.relaunch_at and self.phase is Phase.RUNNING:
            waiting = [s.proc_id for s in self.procs.values() if s.host == agent.host]
            waiting = [p for p in waiting if self.procs[p].state is ProcState.PENDING]
            if waiting and now - agent.lost_at > self.timing.orphan_timeout:
                return self._fail_job(
                    f"{agent.host} has been unreachable for {now - agent.lost_at:.0f} s and "
                    f"{', '.join(waiting)} cannot run anywhere else (no free spare host); "
                    "fix the host or its network, or list a spare host in the hostfile "
                    "(`host slots=N spare`), then run the job again with --resume",
                    now,
                )
            if now >= agent.relaunch_at:
                agent.relaunch_at = 0.0
                return self._launch_agent(agent, now)
        return []

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
            # Its exit may come before its Bye (which is then ignored): either
            # way the last agent gone ends the stop, not the stop deadline.
            agent.state = AgentState.GONE
            gone = EmitEvent(kind="agent_exit", host=host, data={"detail": detail})
            return [gone, *self._maybe_finish(now)]
        if not definite:
            agent.channel_closed = True
            return [
                EmitEvent(kind="agent_exit", host=host, data={"detail": detail, "definite": False})
            ]
        if agent.state is AgentState.LAUNCHING:
            # It died before it connected: starting it again the same way would
            # die the same way, at once and for ever (an import error, a full disk).
            return self.agent_launch_failed(
                host, f"the agent exited before it connected ({detail})", now
            )
        return self._agent_lost(agent, f"agent on {host} died ({detail})", now, may_live=False)

    def agent_bye(self, host: str, reason: str, now: float) -> list[Command]:
        agent = self.agents.get(host)
        if agent is None or agent.state in (AgentState.GONE, AgentState.LOST):
            return []
        if self.phase in (Phase.STOPPING, Phase.DONE):
            agent.state = AgentState.GONE
            gone = EmitEvent(kind="agent_exit", host=host, data={"detail": reason})
            return [gone, *self._maybe_finish(now)]
        return self._agent_lost(agent, f"agent on {host} exited: {reason}", now, may_live=False)

    def agent_launch_failed(self, host: str, error: str, now: float) -> list[Command]:
        """The agent could not even be started (ssh, python, workdir): stop the job."""
        agent = self.agents.get(host)
        if agent is None or agent.state is AgentState.GONE:
            return []
        if agent.was_up and self.phase is Phase.RUNNING:
            return self._relaunch_later(agent, error, now)
        agent.state = AgentState.GONE
        if self.phase in (Phase.STOPPING, Phase.DONE):
            return self._maybe_finish(now)
        verdict = ExitVerdict(
            succeeded=False, retryable=False, reason="agent launch failed", error=error
        )
        self._record_failure(
            verdict, now, role="agent", rank=-1, host=host, attempt=agent.launches - 1
        )
        out: list[Command] = [EmitEvent(kind="agent_lost", host=host, data={"reason": error})]
        return out + self._fail_job(f"cannot start the agent on {host}: {error}", now)

    def _relaunch_later(self, agent: AgentSlot, error: str, now: float) -> list[Command]:
        """A host that worked before cannot be reached again (a network cut, a
        reboot): try again after a backoff, up to 30 s apart, while the job runs
        on; its workers move to free spare hosts meanwhile (see _reconcile)."""
        agent.state = AgentState.LOST
        agent.lost_at = agent.lost_at or now
        agent.relaunch_failures += 1
        delay = min(RELAUNCH_BACKOFF_MAX_S, 2.0 ** min(agent.relaunch_failures, 5))
        agent.relaunch_at = now + delay
        return [
            EmitEvent(
                kind="agent_relaunch_failed",
                host=agent.host,
                data={
                    "error": error,
                    "failures": agent.relaunch_failures,
                    "retry_in_s": delay,
                    "unreachable_s": round(now - agent.lost_at, 3),
                },
            ),
            *self._reconcile(now),
        ]

    def agent_launch_queued(self, host: str) -> list[Command]:
        """This host's launch waits for one of the ``--ssh-concurrency`` turns;
        ``--agent-timeout`` does not run meanwhile (see agent_launch_turn)."""
        agent = self.agents.get(host)
        if agent is not None and agent.state is AgentState.LAUNCHING:
            agent.queued = True
        return []

    def agent_launch_turn(self, host: str, now: float) -> list[Command]:
        """The launch of this host's agent begins now: ``--agent-timeout`` counts
        from here, not from when it was queued."""
        agent = self.agents.get(host)
        if agent is not None and agent.state is AgentState.LAUNCHING:
            agent.queued = False
            agent.launched_at = now
            agent.last_seen = now
        return []

    def agent_launch_abandoned(self, host: str, now: float) -> list[Command]:
        """The job began stopping before this agent was started: it never will be."""
        agent = self.agents.get(host)
        if agent is None or agent.state is not AgentState.LAUNCHING:
            return []
        agent.state = AgentState.GONE
        return self._maybe_finish(now)

    def _launch_agent(self, agent: AgentSlot, now: float) -> list[Command]:
        agent.state = AgentState.LAUNCHING
        agent.queued = False
        agent.launched_at = now
        agent.last_seen = now
        agent.channel_closed = False
        agent.launches += 1
        return [
            LaunchAgent(host=agent.host),
            EmitEvent(kind="agent_launch", host=agent.host, data={"launch": agent.launches}),
        ]

    def _adopt_reported(
        self, host: str, procs: list[ProcReport], now: float, *, replaced: bool = False
    ) -> list[Command]:
        """Reconcile what a (re)connecting agent runs with what we believe.
        ``replaced``: a new agent took over from the one we knew (it stopped its
        predecessor's processes), so a spawn sent to that one never happened."""
        out: list[Command] = []
        by_id = {p.proc_id: p for p in procs}
        for slot in self.procs.values():
            if slot.host != host:
                continue
            report = by_id.get(slot.proc_id)
            gone = report is None or report.attempt != slot.attempt
            if slot.state is ProcState.STOPPING and gone:
                # Being stopped (often by the group restart that a sibling's loss
                # started in this same loop) and already gone: no agent will ever
                # send its Exited, so its stop is done here, or the group waits forever.
                out += self._exited(host, self._gone_while_unreachable(slot), now)
                continue
            # A spawn that went to the replaced agent never happened: lost too.
            lost_spawn = slot.state is ProcState.STARTING and replaced and report is None
            if slot.state is ProcState.PENDING and report is not None and slot.bump_before_spawn:
                if report.attempt >= slot.attempt:
                    # Still running from before the supervisor restarted: adopt it.
                    out.append(self._adopt(slot, report.attempt, report.pid))
                    if slot.restart_if_found:
                        # Its state no longer matches ours: stop it, start it afresh.
                        out.append(self._stop_then_restart(slot, slot.restart_if_found))
                    slot.restart_if_found = ""
                continue
            if slot.state is not ProcState.RUNNING and not lost_spawn:
                continue
            if gone:
                # It ended while we could not hear about it; its Exited was lost.
                verdict = ExitVerdict(
                    succeeded=False,
                    retryable=True,
                    reason="lost",
                    error=f"{slot.proc_id} vanished while {host} was unreachable",
                )
                out += self._gone(slot)
                out += self._on_failure(slot, verdict, None, None, [], now)
        running = {(p.proc_id, p.attempt) for p in procs}
        return out + self._removed_lost(host, running, now) + self._fence_stale(host, procs)

    def heard_before_hello(self, host: str, msg: Message) -> None:
        """A message from an agent we do not know yet (it reconnected; we answer
        ``Rehello``). An ``Exited`` among them was queued while it could not reach
        us: its Hello will list only what still runs, this says how the rest ended."""
        agent = self.agents.get(host)
        if agent is not None and isinstance(msg, Exited):
            agent.exits_before_hello.append(msg)

    def _adopt_ended(self, host: str, exits: list[Exited], now: float) -> list[Command]:
        """A resumed supervisor's process that ran on and then ended before its
        agent said hello again (a worker that finished its data while the agent
        was reconnecting): it is no lost process to start again, but one that
        ended as its ``Exited`` says."""
        out: list[Command] = []
        for ended in exits:
            slot = self.procs.get(ended.proc_id)
            if (
                slot is None
                or slot.host != host
                or slot.state is not ProcState.PENDING
                or not slot.bump_before_spawn
                or ended.attempt != slot.attempt
            ):
                continue
            out.append(self._adopt(slot, ended.attempt, ended.pid))
            out += self._exited(host, ended, now)
        return out

    def _adopt(self, slot: ProcSlot, attempt: int, pid: int) -> EmitEvent:
        """A process of a resumed supervisor's that ran on from before: RUNNING
        under the attempt and pid its agent reports, not started again."""
        slot.attempt = attempt
        slot.state = ProcState.RUNNING
        slot.pid = pid
        slot.bump_before_spawn = False
        return self._proc_event("adopted", slot, pid=pid, attempt=attempt, **_gpu_of(slot))

    @staticmethod
    def _gone_while_unreachable(slot: ProcSlot) -> Exited:
        return Exited(
            proc_id=slot.proc_id,
            attempt=slot.attempt,
            pid=slot.pid,
            exit_code=None,
            signal=None,
            runtime_s=0.0,
            stderr_tail=[f"{slot.proc_id} was gone when its agent reconnected"],
            requested=True,
        )

    def _stopped_with_their_agent(self, agent: AgentSlot, procs: list[ProcReport]) -> list[Command]:
        """A lost host says hello again through a new agent, which stopped its
        predecessor and that one's children before it connected: the stale
        attempts it does not report are gone, fenced by the relaunch."""
        reported = {(p.proc_id, p.attempt) for p in procs}
        out: list[Command] = []
        for proc_id, attempt in sorted(agent.stale_attempts.items()):
            slot = self.procs.get(proc_id)
            if (proc_id, attempt) in reported or slot is None or slot.attempt == attempt:
                continue  # still running (fenced by _fence_stale), or it is current
            out.append(
                EmitEvent(
                    kind="fenced",
                    host=agent.host,
                    role=slot.role,
                    rank=slot.rank,
                    data={"attempt": attempt, "pid": 0, "by": "agent relaunch"},
                )
            )
        return out

    def _fence_stale(self, host: str, procs: list[ProcReport]) -> list[Command]:
        """Stop what an agent runs that is no longer the job's: an attempt that was
        given up while the agent was unreachable (its rank restarted since)."""
        out: list[Command] = []
        for report in procs:
            slot = self.procs.get(report.proc_id)
            current = (
                slot is not None
                and slot.host == host
                and slot.attempt == report.attempt
                and slot.state in LIVE_PROC_STATES
            )
            stale = (host, report.attempt)
            if current or stale in (
                self.retiring.get(report.proc_id),
                self.removing.get(report.proc_id),
            ):
                continue
            if self.fenced.get(report.proc_id) == stale:
                continue  # already being stopped
            self.fenced[report.proc_id] = stale
            agent = self.agents.get(host)
            if agent is not None and agent.stale_attempts.get(report.proc_id) == report.attempt:
                del agent.stale_attempts[report.proc_id]
            role, _, rank = report.proc_id.rpartition("-")
            out.append(
                EmitEvent(
                    kind="fenced",
                    host=host,
                    role=role,
                    rank=int(rank) if rank.isdigit() else -1,
                    data={"attempt": report.attempt, "pid": report.pid},
                )
            )
            out.append(self._kill(report.proc_id, host, report.attempt))
        return out

    def _agent_lost(
        self, agent: AgentSlot, reason: str, now: float, *, may_live: bool = True
    ) -> list[Command]:
        """``may_live``: the agent was given up for its silence and may still run
        its processes (a network cut), which are then fenced when it is heard
        again; an agent seen to die took its processes with it."""
        agent.state = AgentState.LOST
        agent.lost_at = agent.lost_at or now
        agent.losses += 1
        cooldown = min(HOST_COOLDOWN_MAX_S, HOST_COOLDOWN_BASE_S * 2.0 ** (agent.losses - 1))
        agent.cooldown_until = now + cooldown
        # Its fenced processes go with it (a new agent stops its predecessor's).
        self.fenced = {p: held for p, held in self.fenced.items() if held[0] != agent.host}
        data = {"reason": reason, "losses": agent.losses, "cooldown_s": cooldown}
        out: list[Command] = [EmitEvent(kind="agent_lost", host=agent.host, data=data)]
        out += self._removed_lost(agent.host, None, now)  # fenced if it still runs
        verdict = ExitVerdict(
            succeeded=False, retryable=True, reason="lost connection", error=reason
        )
        lost = [
            s for s in self.procs.values() if s.host == agent.host and s.state in LIVE_PROC_STATES
        ]
        attempts_at_loss = {slot.proc_id: slot.attempt for slot in lost}
        if may_live:
            agent.stale_attempts.update(attempts_at_loss)
        for slot in lost:
            if slot.attempt != attempts_at_loss[slot.proc_id]:
                # Restarted already with an earlier one's group (and maybe
                # moved to a spare and started there): not lost any more.
                continue
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

    # ---------------------- processes: spawn, exits, restarts and the restart rules

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
        self._record_failure(
            verdict,
            now,
            role=slot.role,
            rank=slot.rank,
            host=slot.host,
            attempt=slot.attempt,
            stderr_tail=[error],
        )
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
        if self.fenced.get(msg.proc_id) == (host, msg.attempt):
            del self.fenced[msg.proc_id]  # the stale attempt is gone: its rank may start
            role, _, rank = msg.proc_id.rpartition("-")
            gone = EmitEvent(
                kind="exit",
                host=host,
                role=role,
                rank=int(rank) if rank.isdigit() else -1,
                data={"exit_code": msg.exit_code, "signal": msg.signal, "fenced": True},
            )
            return [gone, *self._reconcile(now)]
        if self.removing.get(msg.proc_id) == (host, msg.attempt):
            return self._removed_exited(host, msg, now)
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
            if role != "worker":
                # A retired server handed its blocks over before it stopped; a later
                # move of its rank hands over anew.
                self.handed_over.discard(msg.proc_id)
                return retired
            if msg.exit_code == 0 and not msg.requested:
                retired += self._finished_before_hand_over(int(rank), now)
            return [*retired, WorkerGone(rank=int(rank))]
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
        out += self._gone(slot, succeeded=verdict.succeeded and not slot.stalled)
        if slot.finished_by_predecessor:
            slot.finished_by_predecessor = False
            slot.state = ProcState.SUCCEEDED
            return out + self._maybe_complete(now)
        if slot.stalled and self.phase is Phase.RUNNING:
            stalled = ExitVerdict(
                succeeded=False, retryable=True, reason="stalled", error=slot.stalled
            )
            slot.stalled = ""
            return out + self._on_failure(
                slot, stalled, msg.exit_code, msg.signal, msg.stderr_tail, now
            )
        if slot.state is ProcState.STOPPING or msg.requested or self.phase is Phase.STOPPING:
            if slot.restart_after_stop and self.phase in (Phase.RUNNING, Phase.STARTING):
                slot.restart_after_stop = False
                out.append(self._restart(slot, slot.restart_reason, now))
                if slot.next_host:
                    out.append(
                        self._proc_event("moved", slot, old_host=slot.host, new_host=slot.next_host)
                    )
                    self._place_on(slot, slot.next_host)
                    slot.next_host = ""
                return out + self._reconcile(now)
            slot.state = ProcState.SUCCEEDED if verdict.succeeded else ProcState.STOPPED
            return out + self._maybe_finish(now)
        if verdict.succeeded:
            slot.state = ProcState.SUCCEEDED
            return out + self._maybe_complete(now)
        memory = self._out_of_memory(slot, msg, now)
        if memory is None:
            verdict = self._crash_loop(slot, verdict, msg)
        else:
            verdict, grown = memory
            out += grown
        return out + self._on_failure(
            slot, verdict, msg.exit_code, msg.signal, msg.stderr_tail, now
        )

    def _out_of_memory(
        self, slot: ProcSlot, msg: Exited, now: float
    ) -> tuple[ExitVerdict, list[Command]] | None:
        """A process that died at its memory limit (OOM kill in its cgroup, or
        MemoryError under RLIMIT_AS) is relaunched with more memory, or fails the
        job when it already had all it may get (``limits.py``); a built-in server
        whose memory is about even with the others' gives the job more servers
        instead, once. None: not an OOM. Not a crash loop: the next attempt
        differs by its limit or by the servers its blocks spread over."""
        if not slot.memory_limit:
            return None  # an OOM kill without a limit: the host ran out, retry as ever
        if msg.oom_killed:
            how = "killed by the OOM killer"
        elif exception_name(last_exception_line(msg.stderr_tail)) == "MemoryError":
            how = "MemoryError"
        else:
            return None
        more_servers = self._more_servers_after_oom(slot, how, now)
        if more_servers is not None:
            return more_servers
        agent = self.agents.get(slot.host)
        decision = self.limits.after_oom(
            proc_id=slot.proc_id,
            host=slot.host,
            limit=slot.memory_limit,
            relaunches=slot.oom_relaunches,
            measured_host_memory=agent.memory_bytes if agent is not None else 0,
        )
        if not decision.new_limit:
            error = f"{decision.error} ({how})"
            return ExitVerdict(
                succeeded=False, retryable=False, reason="out of memory", error=error
            ), []
        old, slot.memory_limit = slot.memory_limit, decision.new_limit
        slot.oom_relaunches += 1
        event = self._proc_event(
            "memory_limit",
            slot,
            old=old,
            new=slot.memory_limit,
            reason=how,
            relaunch=slot.oom_relaunches,
        )
        error = (
            f"{how} at its limit of {format_size(old)}; the next attempt gets "
            f"{format_size(slot.memory_limit)}"
        )
        verdict = ExitVerdict(succeeded=False, retryable=True, reason="out of memory", error=error)
        return verdict, [event]

    def _more_servers_after_oom(
        self, slot: ProcSlot, how: str, now: float
    ) -> tuple[ExitVerdict, list[Command]] | None:
        """DLRover's rule for a built-in server that ran out of memory at its limit
        with the servers' memory about even (``limits.py``): twice the servers, as
        far as free slots go, and the server restarts with its limit. None: the
        rule does not apply (not a server, already tried for it, memory skewed,
        no free slot, no block map yet, relaunches used up): more memory then."""
        if (
            slot.role != ROLE_SERVER
            or not self.builtin_ps
            or self.ps_map_servers == 0
            or self.phase is not Phase.RUNNING
            or slot.oom_added_servers
            or slot.oom_relaunches >= self.limits.oom_relaunches
        ):
            return None
        others = [s.rss_bytes for s in self._servers() if s is not slot]
        if memory_skewed(slot.memory_limit, others):
            return None
        was = self.server_target
        room = sum(free for _, free in self._room_for_workers(gpu=False))
        count = min(2 * was, was + room, self.ps_map_blocks)
        if count <= was:
            return None
        why = f"server {slot.rank} ran out of memory with the servers' memory about even"
        try:
            commands = self.scale_servers(count, now, reason=why)
        except ConfigError:  # a server of the last scale-in still stops: more memory
            return None
        slot.oom_added_servers = True
        slot.oom_relaunches += 1
        event = self._proc_event(
            "oom_servers",
            slot,
            servers=count,
            was=was,
            limit=slot.memory_limit,
            others_rss=sorted(others),
            reason=how,
            relaunch=slot.oom_relaunches,
        )
        error = (
            f"{how} at its limit of {format_size(slot.memory_limit)}, its memory about "
            f"even with the other servers'; the job runs {count} servers now, over which "
            "the blocks spread (DLRover: more servers, not more memory)"
        )
        verdict = ExitVerdict(succeeded=False, retryable=True, reason="out of memory", error=error)
        return verdict, [event, *commands]

    def _crash_loop(self, slot: ProcSlot, verdict: ExitVerdict, msg: Exited) -> ExitVerdict:
        """The same error at the same line as the previous attempt, before any
        progress, will happen on every attempt: restarting only burns restarts
        (for the whole group in allreduce mode). Such a failure is unretryable."""
        signature = failure_signature(msg.stderr_tail) if verdict.retryable else ""
        progressed = slot.progressed or msg.runtime_s >= CRASH_LOOP_RUNTIME_S
        repeated = bool(signature) and signature == slot.failure_signature and not progressed
        slot.failure_signature = signature
        if not repeated:
            return verdict
        return ExitVerdict(
            succeeded=False,
            retryable=False,
            reason="crash loop",
            error=f"{verdict.error} (the same error at the same line on attempts "
            f"{slot.attempt - 1} and {slot.attempt}, before any progress: {signature})",
        )

    def worker_progressed(self, rank: int) -> None:
        """Worker ``rank`` reported a step: its current attempt made progress."""
        slot = self.procs.get(f"worker-{rank}")
        if slot is not None:
            slot.progressed = True

    def stalled(self, proc_ids: list[str], reason: str, now: float) -> list[Command]:
        """The stall watchdog saw no progress: stop the stuck workers; each exit is
        a retryable failure ("stalled"), counted against ``--max-restarts`` like
        any other, so a job that can never move ends failed instead of hanging.

        With group scope one failure restarts the whole group, so only the first
        stuck worker is stopped as the failure; the rest follow the group.
        """
        if self.phase is not Phase.RUNNING:
            return []
        stuck = [
            slot
            for proc_id in proc_ids
            if (slot := self.procs.get(proc_id)) is not None
            and slot.role == "worker"
            and slot.state is ProcState.RUNNING
        ]
        if self.restart_scope == "group":
            stuck = stuck[:1]
        out: list[Command] = []
        for slot in stuck:
            slot.stalled = reason
            slot.state = ProcState.STOPPING
            out.append(self._kill(slot.proc_id, slot.host, slot.attempt))
        return out

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
        """The restart rules: stop the job on an unretryable failure or when the
        rank has used its restarts, else restart it (or its group)."""
        self._record_failure(
            verdict,
            now,
            role=slot.role,
            rank=slot.rank,
            host=slot.host,
            attempt=slot.attempt,
            exit_code=exit_code,
            signal=signal,
            stderr_tail=stderr_tail,
        )
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
        slot.progressed = False
        slot.rss_bytes, slot.cpu_percent = 0, 0.0  # the next attempt's come with its reports
        slot.cpu_throttled = 0.0
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
                out.append(self._stop_then_restart(slot, group_reason))
            elif slot.state in (ProcState.SUCCEEDED, ProcState.FAILED) or (
                slot.host == dead_host and slot.state in LIVE_PROC_STATES
            ):
                out.append(self._restart(slot, group_reason, now))
        return out + self._reconcile(now)

    def _stop_then_restart(self, slot: ProcSlot, reason: str) -> SendToAgent:
        """Stop the running attempt; its Exited restarts it (attempt + 1)."""
        slot.state = ProcState.STOPPING
        slot.restart_after_stop = True
        slot.restart_reason = reason
        return self._kill(slot.proc_id, slot.host, slot.attempt)

    def _reconcile(self, now: float) -> list[Command]:
        """Spawn every pending process whose agent is ready."""
        if self.phase is not Phase.RUNNING:
            return []
        out: list[Command] = []
        # A group restart (a scale's too, whatever the scope) waits until every old
        # worker is gone.
        stopping = any(
            s.role == "worker" and s.state is ProcState.STOPPING for s in self.procs.values()
        )
        self._scale_restart = self._scale_restart and stopping
        group_barrier = stopping and (self.restart_scope == "group" or self._scale_restart)
        master = self.procs.get("worker-0")
        for slot in self.procs.values():
            if slot.state is not ProcState.PENDING:
                continue
            if slot.role == "worker" and group_barrier:
                continue
            agent = self.agents[slot.host]
            if agent.state is not AgentState.UP:
                moved = self._move_off_lost_host(slot)
                if not moved:
                    continue
                out += moved
                agent = self.agents[slot.host]
            if self.fenced.get(slot.proc_id, ("",))[0] == slot.host:
                continue  # that agent still runs a stale attempt of it (see fenced)
            if slot.join is not None:
                master_addr, master_port = slot.join.master_addr, slot.join.master_port
            else:
                master_addr, master_port = self._master_endpoint(master, slot)
            if slot.role == "worker" and master_port == 0:
                continue
            if self.builtin_ps and not self._place_ps(slot):
                continue  # a port or a server endpoint is not known yet
            if self.tf_tasks and not self._place_tf(slot):
                continue  # some task's address is not known yet
            if slot.bump_before_spawn:
                slot.bump_before_spawn = False
                out.append(self._restart(slot, "lost while the supervisor was down", now))
            slot.state = ProcState.STARTING
            if slot.role == "worker":
                slot.gpu = self._gpu_for(slot)
            spawn = self._build_spawn(slot, master_addr, master_port)
            slot.join = None  # only this attempt joins the survivors
            slot.prewarm = False
            out.append(SendToAgent(host=slot.host, message=spawn))
            out.append(
                self._proc_event(
                    "spawn",
                    slot,
                    attempt=slot.attempt,
                    argv=spawn.argv,
                    **_gpu_of(slot),
                    **_port_of(slot),
                    **_limits_of(slot),
                )
            )
        return out

    def _gpu_for(self, slot: ProcSlot) -> int:
        """The GPU a worker's next attempt runs on, -1 when its host declares none.

        The one its local rank names while that is free (DeepSpeed's convention,
        which unmodified scripts rely on through LOCAL_RANK); a worker moved to
        another host takes the lowest GPU no other worker there holds. Placement
        and the spare-room check keep workers per host within its GPUs, so a
        free one exists; if not, the local rank's GPU is shared rather than none.
        """
        count = self.host_gpus.get(slot.host, 0)
        if count == 0:
            return -1
        held = {o.gpu for o in self._busy_workers_on(slot.host) if o is not slot and o.gpu >= 0}
        home = slot.assignment.local_rank % count
        if slot.host == slot.assignment.host and home not in held:
            return home
        return next((gpu for gpu in range(count) if gpu not in held), home)

    def _busy_workers_on(self, host: str) -> list[ProcSlot]:
        """Workers running, starting or waiting to start on ``host``."""
        return [
            s
            for s in self.procs.values()
            if s.host == host and s.role == "worker" and s.state in _BUSY_PROC_STATES
        ]

    def _move_off_lost_host(self, slot: ProcSlot) -> list[Command]:
        """A pending worker whose host was lost starts on a free spare host instead
        of waiting for it to come back (the hostfile's ``spare``). The lost host
        becomes a spare in turn once it is back and idle. Servers stay: their
        snapshot lives on their host. TF tasks stay too: every task's TF_CONFIG
        names the others' addresses, fixed for the job."""
        lost = self.agents[slot.host]
        if slot.role != "worker" or not lost.lost_at or self.tf_tasks:
            return []
        target = self._spare_with_room()
        if target is None:
            return []
        old = slot.host
        self._place_on(slot, target)
        if old not in self.spare_hosts:
            self.spare_hosts.append(old)
        return [self._proc_event("moved", slot, old_host=old, new_host=target, reason="host lost")]

    def _spare_with_room(self) -> str | None:
        """The first spare host that is up and has a slot free."""
        return next(iter(self.free_spare_hosts()), None)

    def _free_slots(self, host: str, in_use: Counter[str], *, gpu: bool = True) -> int:
        """How many more workers (``gpu``: each needs a GPU where the host has
        some; else servers) ``host`` takes now (0 while it is not up or cools
        down after a loss), with ``in_use`` from ``_slots_in_use()`` (counted once
        for every host asked about)."""
        agent = self.agents[host]
        if agent.state is not AgentState.UP or agent.cooldown_until > self.now:
            return 0
        free = self.host_slots.get(host, 1) - in_use[host]
        gpus = self.host_gpus.get(host, 0)
        if gpus and gpu:  # a GPU of its own
            free = min(free, gpus - len(self._busy_workers_on(host)))
        return max(0, free)

    def _slots_in_use(self) -> Counter[str]:
        """host -> the slots taken there: what runs or waits there, what is on its
        way there (a KILL_RESTART stopping on another host), and a replaced or
        removed process that still runs."""
        used: Counter[str] = Counter()
        for s in self.procs.values():
            if s.state in _BUSY_PROC_STATES:
                used[s.host] += 1
            if s.next_host and s.next_host != s.host:
                used[s.next_host] += 1
        for held, _ in self.retiring.values():
            used[held] += 1
        for held, _ in self.removing.values():
            used[held] += 1
        return used

    def _record_failure(
        self,
        verdict: ExitVerdict,
        now: float,
        *,
        role: str,
        rank: int,
        host: str,
        attempt: int,
        exit_code: int | None = None,
        signal: int | None = None,
        stderr_tail: list[str] | None = None,
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
                traceback=traceback_tail(stderr_tail or []),
            )
        )

    def _gone(self, slot: ProcSlot, *, succeeded: bool = False) -> list[Command]:
        return [WorkerGone(rank=slot.rank, succeeded=succeeded)] if slot.role == "worker" else []

    def _kill(self, proc_id: str, host: str, attempt: int) -> SendToAgent:
        kill = Kill(proc_id=proc_id, attempt=attempt, grace_s=self.timing.kill_grace)
        return SendToAgent(host=host, message=kill)

    def _proc_event(self, kind: str, slot: ProcSlot, **data: Any) -> EmitEvent:
        return EmitEvent(kind=kind, host=slot.host, role=slot.role, rank=slot.rank, data=data)

    # ------------------------------------- KILL_RESTART, hand-overs and spare hosts

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
        kill = self._stop_then_restart(slot, f"KILL_RESTART: {reason}")
        slot.next_host = target_host or ""
        slot.join = join
        return [
            kill,
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
        self._place_on(slot, target_host)
        if role == "worker":
            slot.prewarm = True
        else:
            slot.ps_fresh_attempt = slot.attempt
        return out + self._reconcile(now)

    def _finished_before_hand_over(self, rank: int, now: float) -> list[Command]:
        """The worker a prewarmed replacement was to take over from ended its loop
        by itself (exit 0, not stopped): the group reached the end of the data
        before the hand-over, and a BSP loop ends on every worker at once. The
        replacement has nothing to train and no group to join: stop it, and count
        the rank as finished (else the job would wait for a newcomer that waits
        for a group that is gone)."""
        slot = self.procs.get(f"worker-{rank}")
        if slot is None or slot.state not in (*LIVE_PROC_STATES, ProcState.PENDING):
            return []
        out: list[Command] = [
            self._proc_event(
                "replacement_stopped",
                slot,
                attempt=slot.attempt,
                reason="the worker it was to replace finished the data before the hand-over",
            )
        ]
        slot.prewarm = False
        if slot.state is ProcState.PENDING:  # never started: nothing to stop
            slot.state = ProcState.SUCCEEDED
            return out + self._maybe_complete(now)
        slot.finished_by_predecessor = True
        slot.state = ProcState.STOPPING
        slot.restart_after_stop = False
        return [*out, self._kill(slot.proc_id, slot.host, slot.attempt)]

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
        if slot.state in LIVE_PROC_STATES:  # a pending one was never spawned
            out.append(self._kill(proc_id, slot.host, slot.attempt))
        out.append(self._proc_event("moved", slot, old_host=slot.host, new_host=old_host))
        slot.host, slot.attempt, slot.state = old_host, old_attempt, ProcState.RUNNING
        slot.ps_fresh_attempt = -1
        return out

    def retire(self, proc_id: str) -> list[Command]:
        """Stop the process a prewarmed replacement takes over from."""
        retiring = self.retiring.get(proc_id)
        if retiring is None:
            return []
        host, attempt = retiring
        return [self._kill(proc_id, host, attempt)]

    def _place_on(self, slot: ProcSlot, host: str) -> None:
        """``slot`` runs on ``host`` from its next attempt, with that host's limits:
        a server moved to a bigger spare host gets its cores (a memory limit an
        OOM raised is kept when it is the larger)."""
        slot.host = host
        slot.cpu_limit = self.limits.first_cpus(host)
        first = self.limits.first_memory(host)
        slot.memory_limit = max(first, slot.memory_limit) if slot.oom_relaunches else first

    def free_spare_hosts(self) -> list[str]:
        """Spare hosts that are up with a slot free, in hostfile order: where a
        KILL_RESTART can go (AntDT's "cluster not busy"). A slot is free when the
        hostfile's ``slots=`` exceed what runs or waits there (a replaced process
        that still runs included) and, on a GPU host, a GPU is free too: a
        two-slot spare takes both workers of a slow host, one after the other."""
        in_use = self._slots_in_use()
        return [host for host in self.spare_hosts if self._free_slots(host, in_use) > 0]

    def worker_hosts(self) -> dict[int, str]:
        """rank -> the host each worker runs on (or will run on next), for the
        policies that plan by device (AntDT-DD, bmax= bounds)."""
        return {s.rank: s.next_host or s.host for s in self.procs.values() if s.role == "worker"}

    # ------------------------------------------- scaling the workers (dtlaunch scale)

    def worker_ranks(self) -> list[int]:
        """The ranks of the job's workers now (0..n-1; a scale changes n)."""
        return sorted(s.rank for s in self.procs.values() if s.role == "worker")

    def scale_workers(
        self,
        count: int,
        now: float,
        *,
        reason: str = "",
        regroup: bool = False,
        restart: bool = False,
    ) -> list[Command]:
        """Run ``count`` workers from now on (``scaling.py`` decides which ranks
        start where and which stop). New ranks start like any pending worker;
        removed ones are stopped and not restarted, and their exit gives their
        data shards back (``WorkerGone``). Recorded as one ``scale`` event, which
        a resumed supervisor reads to rebuild the same workers.

        ``regroup``: an allreduce group re-forms with the new size (the caller's
        ``Regroup`` tells the removed ranks to leave, and the new ranks start
        prewarmed, to join the group at its agreed step). ``restart``: an
        allreduce group restarts with the new size instead (scripts that attach
        no model): the removed ranks are stopped, every other worker is stopped
        and started again, and the new ranks start with them.

        Raises:
            ConfigError: the job cannot change its workers now, or not to ``count``
                (nothing is changed).
        """
        self._check_scalable(regroup or restart)
        ranks = self.worker_ranks()
        stopping = [_rank_of(p) for p in self.removing]
        plan = plan_scale(count, ranks=ranks, room=self._room_for_workers(), stopping=stopping)
        if plan.count == len(ranks):
            return []
        out: list[Command] = [
            EmitEvent(
                kind="scale",
                data={
                    "workers": plan.count,
                    "was": len(ranks),
                    "added": {str(rank): host for rank, host in plan.added.items()},
                    "removed": plan.removed,
                    "reason": reason,
                },
            )
        ]
        for rank in plan.removed:
            slot = self.procs.pop(f"worker-{rank}")
            running = slot.state is ProcState.RUNNING
            out += self._remove_worker(slot, reason, now, ask=not (regroup or restart))
            if restart and running:  # no shard to finish in a group that restarts
                out += self.leave_unheard(rank, slot.attempt, "the group restarts without it")
        if restart:
            self._scale_restart = True
            why = f"dtlaunch scale: the group restarts with {plan.count} workers"
            for slot in self.procs.values():
                if slot.role == "worker" and slot.state in (ProcState.STARTING, ProcState.RUNNING):
                    out.append(self._stop_then_restart(slot, why))
        workers = [s.assignment for s in self.procs.values()]
        for host in dict.fromkeys(plan.added.values()):
            if host not in self.agents:  # a hostfile host that ran nothing yet
                self.agents[host] = AgentSlot(host=host)
                out += self._launch_agent(self.agents[host], now)
        for rank, host in plan.added.items():
            slot = self._new_slot(added_assignment(rank, host, workers))
            slot.prewarm = regroup
            workers.append(slot.assignment)
            out.append(self._proc_event("added", slot, attempt=slot.attempt))
        # Every rank left may have finished already (a scale-in as the data ran out).
        return out + self._reconcile(now) + self._maybe_complete(now)

    def _check_scalable(self, regroup: bool) -> None:
        if self.phase is not Phase.RUNNING:
            raise ConfigError(
                f"the job is {self.phase.value}; workers can be scaled only while it runs"
            )
        if self.tf_tasks:
            raise ConfigError(
                "a --framework tf job cannot change its workers: every task's TF_CONFIG "
                "lists the cluster, fixed for the job"
            )
        if not self.builtin_ps and not regroup:
            raise ConfigError(
                "only jobs with dtlaunch's parameter servers (--servers M, the built-in "
                "server) and allreduce jobs (but not --policy rna, whose rounds keep "
                "their own group) can change their workers while they run; this job's "
                "workers are fixed at start. Start a job with the workers you want "
                "(dtlaunch run --workers N)"
            )

    def free_worker_slots(self) -> int:
        """How many more workers a scale-up could start now (``_room_for_workers``)."""
        return sum(free for _, free in self._room_for_workers())

    def free_worker_hosts(self) -> list[str]:
        """The host of each free worker slot, in the order a scale-up fills them."""
        return [host for host, free in self._room_for_workers() for _ in range(max(0, free))]

    def _room_for_workers(self, *, gpu: bool = True) -> list[tuple[str, int]]:
        """(host, free slots) where new workers (``gpu``; else servers) may start:
        spare hosts first, then the job's other hosts, then hostfile hosts that
        run nothing yet (an agent is launched there for them)."""
        spare = set(self.spare_hosts)
        order = [*self.spare_hosts, *(h for h in self.agents if h not in spare)]
        in_use = self._slots_in_use()
        room = [(host, self._free_slots(host, in_use, gpu=gpu)) for host in order]
        idle = [(h, n) for h, n in self.host_slots.items() if h not in self.agents]
        gpus = self.host_gpus if gpu else {}
        return room + [(h, min(n, gpus[h]) if gpus.get(h) else n) for h, n in idle]

    def _remove_worker(
        self, slot: ProcSlot, reason: str, now: float, *, ask: bool = True
    ) -> list[Command]:
        """A running worker is asked to leave after the shard it reads (``ask``;
        else the caller's regroup tells it); one that is starting or stopping has
        nothing to finish and is stopped. Either way one that has not gone after
        ``LEAVE_GRACE_S`` is stopped."""
        self._removed_attempts[slot.proc_id] = max(slot.attempt, slot.spent_attempts)
        out: list[Command] = [self._proc_event("removed", slot, attempt=slot.attempt)]
        if slot.state not in LIVE_PROC_STATES:
            return [*out, WorkerGone(rank=slot.rank)]  # leases it may hold go back
        self.removing[slot.proc_id] = (slot.host, slot.attempt)
        if slot.state is ProcState.RUNNING:
            self._leave_by[slot.proc_id] = now + LEAVE_GRACE_S
            if not ask:
                return out
            why = f"dtlaunch scale removed worker {slot.rank}" + (f" ({reason})" if reason else "")
            return [*out, AskToLeave(rank=slot.rank, attempt=slot.attempt, reason=why)]
        return [*out, self._kill(slot.proc_id, slot.host, slot.attempt)]

    def leave_unheard(self, rank: int, attempt: int, why: str) -> list[Command]:
        """A removed worker that cannot be asked to leave, or did not leave within
        ``LEAVE_GRACE_S``: stopped now (its unfinished shards are read again)."""
        proc_id = f"worker-{rank}"
        if self.removing.get(proc_id, ("", -1))[1] != attempt:
            return []
        host, _ = self.removing[proc_id]
        self._leave_by.pop(proc_id, None)
        event = EmitEvent(kind="leave_stopped", host=host, role="worker", rank=rank,
                          data={"attempt": attempt, "reason": why})  # fmt: skip
        return [event, self._kill(proc_id, host, attempt)]

    def _new_slot(self, assignment: Assignment) -> ProcSlot:
        slot = ProcSlot(
            assignment=assignment,
            host=assignment.host,
            memory_limit=self.limits.first_memory(assignment.host),
            cpu_limit=self.limits.first_cpus(assignment.host),
        )
        before = self._removed_attempts.get(slot.proc_id)
        if before is not None:
            slot.attempt = slot.spent_attempts = before + 1
        self.procs[slot.proc_id] = slot
        return slot

    def _removed_exited(self, host: str, msg: Exited, now: float) -> list[Command]:
        """A worker a scale-down removed has ended: its shards go back. When the
        others had finished meanwhile (the scale came as the data ran out), it
        was the last the job waited for."""
        rank = self._end_removal(msg.proc_id)
        data = {"exit_code": msg.exit_code, "signal": msg.signal, "removed": True}
        gone = EmitEvent(kind="exit", host=host, role="worker", rank=rank, data=data)
        succeeded = msg.exit_code == 0 and not msg.requested
        return [gone, WorkerGone(rank=rank, succeeded=succeeded), *self._maybe_complete(now)]

    def _removed_lost(
        self, host: str, running: set[tuple[str, int]] | None, now: float
    ) -> list[Command]:
        """Removed workers on ``host`` that no longer run there (``running``: what
        its agent reports; None: the host was lost): their exit will never come."""
        out: list[Command] = []
        for proc_id, (held, attempt) in list(self.removing.items()):
            if held == host and (running is None or (proc_id, attempt) not in running):
                out.append(WorkerGone(rank=self._end_removal(proc_id)))
        return out + (self._maybe_complete(now) if out else [])

    def _end_removal(self, proc_id: str) -> int:
        """Forget a removed worker that is gone; returns its rank."""
        del self.removing[proc_id]
        self._leave_by.pop(proc_id, None)
        return _rank_of(proc_id)

    # -------------------------------- scaling the built-in servers (dtlaunch scale)

    def server_ranks(self) -> list[int]:
        """The ranks of the job's server slots now, the leaving ones included."""
        return sorted(s.rank for s in self.procs.values() if s.role == ROLE_SERVER)

    def scale_servers(self, count: int, now: float, *, reason: str = "") -> list[Command]:
        """Run ``count`` built-in parameter servers from now on. A scale-out starts
        the new ranks empty (``DTLAUNCH_PS_AWAIT_IMPORT``: their blocks come by a
        reassignment, ``psfleet``); a scale-in lowers ``server_target``, and the
        servers from it up serve on until their blocks moved off
        (``server_drained``). Recorded as one ``scale_servers`` event, which a
        resumed supervisor reads to rebuild the same servers.

        Raises:
            ConfigError: the job cannot change its servers now, or not to
                ``count`` (nothing is changed).
        """
        if not self.builtin_ps or self.tf_tasks:
            raise ConfigError(
                "only jobs with dtlaunch's parameter servers (--servers M with the built-in "
                "server) can change their servers while they run"
            )
        if self.phase is not Phase.RUNNING:
            raise ConfigError(
                f"the job is {self.phase.value}; servers can be scaled only while it runs"
            )
        ranks = self.server_ranks()
        stopping = [_rank_of(p) for p in self.retiring if p.startswith("server-")]
        plan = plan_scale(
            count,
            ranks=ranks,
            room=self._room_for_workers(gpu=False),
            stopping=stopping,
            role=ROLE_SERVER,
        )
        if count == self.server_target:
            return []
        out: list[Command] = [
            EmitEvent(
                kind="scale_servers",
                data={
                    "servers": count,
                    "was": self.server_target,
                    "added": {str(rank): host for rank, host in plan.added.items()},
                    "reason": reason,
                },
            )
        ]
        self.server_target = count
        for host in dict.fromkeys(plan.added.values()):
            if host not in self.agents:  # a hostfile host that ran nothing yet
                self.agents[host] = AgentSlot(host=host)
                out += self._launch_agent(self.agents[host], now)
        processes = [s.assignment for s in self.procs.values()]
        for rank, host in plan.added.items():
            assignment = added_assignment(rank, host, processes, ROLE_SERVER)
            processes.append(assignment)
            slot = self._new_slot(assignment)
            slot.ps_fresh_attempt = slot.attempt  # no snapshot: the blocks come by import
            out.append(self._proc_event("added", slot, attempt=slot.attempt))
        return out + self._reconcile(now)

    def server_drained(self, rank: int) -> list[Command]:
        """Server ``rank``, at or above ``server_target``, holds no block of the
        job's map any more: it is stopped and is the job's no longer."""
        slot = self.procs.get(f"server-{rank}")
        if slot is None or slot.role != ROLE_SERVER or rank < self.server_target:
            return []
        del self.procs[slot.proc_id]
        self._removed_attempts[slot.proc_id] = max(slot.attempt, slot.spent_attempts)
        out: list[Command] = [self._proc_event("removed", slot, attempt=slot.attempt)]
        if slot.state in LIVE_PROC_STATES:
            self.retiring[slot.proc_id] = (slot.host, slot.attempt)
            self.handed_over.add(slot.proc_id)  # its exit is a retirement, not a failure
            out.append(self._kill(slot.proc_id, slot.host, slot.attempt))
        return out

    def free_spare(self, preferred: str | None) -> str | None:
        """Where a KILL_RESTART should go: ``preferred`` if it is a spare host with
        nothing running, else the first such spare host; None (its own host) when
        no spare host is free or none was asked for."""
        if preferred is None:
            return None
        free = self.free_spare_hosts()
        return preferred if preferred in free else next(iter(free), None)

    # -------------------------------------- endpoints: master port and server ports

    def _master_endpoint(self, master: ProcSlot | None, slot: ProcSlot) -> tuple[str, int]:
        if master is None:
            return "", 0
        agent = self.agents[master.host]
        if agent.state is not AgentState.UP or not agent.free_ports:
            return "", 0
        addr = self._master_addr_of(master.host, agent.host_addr)
        # A fresh port per attempt: the previous store may still be closing.
        port = agent.free_ports[master.attempt % min(MASTER_PORT_SLOTS, len(agent.free_ports))]
        return addr, port

    def server_endpoint(self, rank: int) -> str:
        """Where built-in PS server ``rank`` listens now ("" while unknown)."""
        slot = self.procs.get(f"server-{rank}")
        return self._server_endpoint(slot) if slot is not None else ""

    def _place_ps(self, slot: ProcSlot) -> bool:
        """Built-in PS: a server's port, a worker's server endpoints; False until known."""
        if slot.role == "server":
            slot.listen_port = self._listen_port(slot)
            return slot.listen_port != 0
        endpoints = []
        for server in sorted(self._servers(), key=lambda s: s.rank):
            endpoint = self._server_endpoint(server)
            if not endpoint:
                return False
            endpoints.append(endpoint)
        slot.ps_servers = tuple(endpoints)
        return True

    def _server_endpoint(self, server: ProcSlot) -> str:
        address = self._listen_address(server)
        return f"tcp://{address}" if address else ""

    def _place_tf(self, slot: ProcSlot) -> bool:
        """TF_CONFIG's cluster: every task's host:port; False until all are known."""
        endpoints = []
        for proc in self.procs.values():
            address = self._listen_address(proc)
            if not address:
                return False
            endpoints.append((proc.role, proc.rank, address))
        slot.listen_port = self._listen_port(slot)
        cluster = tf_cluster(endpoints, ps_mode=self.tf_tasks == "ps")
        slot.tf_cluster = tuple((kind, tuple(addresses)) for kind, addresses in cluster.items())
        return True

    def _listens(self, slot: ProcSlot) -> bool:
        """Whether the process binds a port of its agent's for the job."""
        return bool(self.tf_tasks) or (self.builtin_ps and slot.role == "server")

    def _listen_address(self, slot: ProcSlot) -> str:
        """``host:port`` where the process listens ("" while unknown)."""
        port = self._listen_port(slot)
        if port == 0:
            return ""
        agent = self.agents[slot.host]
        return f"{self._master_addr_of(slot.host, agent.host_addr)}:{port}"

    def _servers(self) -> list[ProcSlot]:
        return [s for s in self.procs.values() if s.role == "server"]

    def _listen_port(self, slot: ProcSlot) -> int:
        """A listening process's port on its host: one of the agent's free ports
        after the ones kept for MASTER_PORT, the same for every attempt on that
        host (so its peers' endpoints stay valid across its restarts); 0 if
        unknown. A process that moves to a host takes a port index no process used
        there before (the one it replaces may still be bound to its own)."""
        agent = self.agents[slot.host]
        if agent.state is not AgentState.UP:
            return 0
        pinned = self.listen_ports.get((slot.host, slot.proc_id))
        if pinned:
            return pinned
        index = self.listen_port_index.get((slot.host, slot.proc_id))
        if index is None:
            taken = {i for (host, _), i in self.listen_port_index.items() if host == slot.host}
            index = next(i for i in range(MASTER_PORT_SLOTS, 1 << 16) if i not in taken)
            self.listen_port_index[slot.host, slot.proc_id] = index
        if index >= len(agent.free_ports):
            return 0
        self.listen_ports[slot.host, slot.proc_id] = agent.free_ports[index]
        return agent.free_ports[index]
