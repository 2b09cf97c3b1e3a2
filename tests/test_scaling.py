"""``dtlaunch scale`` in the node table (fake clock, no processes): where new
workers start, which stop, what their exits give back, refusals that change
nothing, and the workers a resumed supervisor rebuilds from the event log."""

from __future__ import annotations

import signal

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.jobstate import AskToLeave, LaunchAgent, WorkerGone
from dtlaunch.supervisor.jobstate.limits import LimitRules
from dtlaunch.supervisor.jobstate.machine import LEAVE_GRACE_S, EmitEvent, JobState, ProcState
from dtlaunch.supervisor.jobstate.scaling import added_assignment, plan_scale, rescaled
from dtlaunch.supervisor.placement import place
from dtlaunch.wire.messages import Kill, ProcReport, Spawn
from tests.test_jobstate import TIMING, exited, sent

PORTS = [5000 + i for i in range(8)]
HOSTS = [
    HostSpec(label="h0", hostname="127.0.0.1", slots=3, servers=1),
    HostSpec(label="h1", hostname="127.0.0.2", slots=2),
    HostSpec(label="s1", hostname="127.0.0.9", slots=2, spare=True),
]


def make_state(
    *, builtin_ps: bool = True, workers: int = 2, limits: LimitRules | None = None
) -> JobState:
    def build_spawn(slot, addr, port):
        return Spawn(proc_id=slot.proc_id, role=slot.role, rank=slot.rank, attempt=slot.attempt,
                     argv=["x"], env={}, cwd="/", memory_limit=slot.memory_limit)  # fmt: skip

    return JobState(
        place(HOSTS, workers=workers, servers=1 if builtin_ps else 0),
        timing=TIMING,
        max_restarts=3,
        restart_scope="process",
        build_spawn=build_spawn,
        master_addr_of=lambda label, reported: label + "-addr",
        builtin_ps=builtin_ps,
        spare_hosts=["s1"],
        host_slots={h.label: h.slots for h in HOSTS},
        limits=limits,
    )


def up(state: JobState) -> None:
    out = state.start(0.0)
    for host in state.agents:
        out += state.agent_hello(host, 0.1, free_ports=PORTS, host_addr="", procs=[])
    running(state, out)


def running(state: JobState, out: list) -> None:
    for spawn in sent(out, Spawn):
        out += state.spawned(state.procs[spawn.proc_id].host, spawn.proc_id, spawn.attempt, 9, 0.2)


def heard_tick(state: JobState, now: float) -> list:
    """A tick at ``now`` with every agent heard just before (none goes silent)."""
    for agent in state.agents.values():
        agent.last_seen = now
    return state.tick(now)


def events(out: list, kind: str) -> list[EmitEvent]:
    return [c for c in out if isinstance(c, EmitEvent) and c.kind == kind]


def test_scaling_up_starts_new_ranks_on_spare_hosts_first_then_free_slots():
    state = make_state()  # h0: server-0 + workers 0, 1; h1 and s1 empty
    up(state)
    out = state.scale_workers(5, 1.0, reason="test")
    assert sorted(s.proc_id for s in sent(out, Spawn)) == ["worker-2", "worker-3"]
    # h1 ran nothing, so it had no agent: one is launched, and worker 4 waits for it.
    assert [c.host for c in out if isinstance(c, LaunchAgent)] == ["h1"]
    assert state.procs["worker-4"].state is ProcState.PENDING
    (scale,) = events(out, "scale")
    hello = state.agent_hello("h1", 1.5, free_ports=PORTS, host_addr="", procs=[])
    assert [s.proc_id for s in sent(hello, Spawn)] == ["worker-4"]
    hosts = {p: state.procs[p].host for p in ("worker-2", "worker-3", "worker-4")}
    assert hosts == {"worker-2": "s1", "worker-3": "s1", "worker-4": "h1"}
    assert state.worker_ranks() == [0, 1, 2, 3, 4]
    (scale,) = events(out, "scale")
    assert scale.data["workers"] == 5 and scale.data["was"] == 2
    assert scale.data["added"] == {"2": "s1", "3": "s1", "4": "h1"}
    a = state.procs["worker-3"].assignment
    assert (a.local_rank, a.group_rank) == (1, 1)  # second on s1, s1 the second worker host


def test_scaling_down_asks_the_highest_ranks_to_leave_and_gives_their_data_back_on_exit():
    state = make_state(workers=2)
    up(state)
    running(state, state.scale_workers(4, 1.0))
    out = state.scale_workers(2, 2.0, reason="smaller")
    asked = [(c.rank, c.attempt) for c in out if isinstance(c, AskToLeave)]
    assert asked == [(3, 0), (2, 0)] and sent(out, Kill) == []  # they finish their shard
    assert state.worker_ranks() == [0, 1]
    assert not [c for c in out if isinstance(c, WorkerGone)]  # not before they are gone
    out = state.exited("s1", exited("worker-3", 0, code=0), 3.0)
    assert [c for c in out if isinstance(c, WorkerGone)] == [WorkerGone(rank=3, succeeded=True)]
    assert sent(out, Spawn) == [] and state.failures == [] and state.restarts == []
    # Its slot is free again; rank 2 still leaves there, so only one more fits on s1.
    assert state._free_slots("s1", state._slots_in_use()) == 1
    assert state.status == ""  # the job goes on


def test_a_removed_worker_that_does_not_leave_in_time_or_cannot_be_asked_is_stopped():
    state = make_state(workers=2)
    up(state)
    running(state, state.scale_workers(4, 1.0))
    state.scale_workers(2, 2.0)
    assert sent(heard_tick(state, 2.0 + LEAVE_GRACE_S - 1), Kill) == []
    out = heard_tick(state, 2.0 + LEAVE_GRACE_S)
    assert sorted((k.proc_id, k.attempt) for k in sent(out, Kill)) == [
        ("worker-2", 0),
        ("worker-3", 0),
    ]
    assert sorted(e.rank for e in events(out, "leave_stopped")) == [2, 3]
    assert sent(heard_tick(state, 3.0 + LEAVE_GRACE_S), Kill) == []  # once
    # No SDK to ask: stopped at once; an attempt that is not the leaving one: nothing.
    other = make_state(workers=2)
    up(other)
    running(other, other.scale_workers(3, 1.0))
    other.scale_workers(2, 2.0)
    assert other.leave_unheard(2, 5, "x") == []
    assert [(k.proc_id, k.attempt) for k in sent(other.leave_unheard(2, 0, "x"), Kill)] == [
        ("worker-2", 0)
    ]


def test_a_worker_still_starting_when_removed_is_stopped_at_once():
    state = make_state(workers=2)
    up(state)
    state.scale_workers(3, 1.0)  # spawn sent, no Spawned yet
    out = state.scale_workers(2, 1.5)
    assert [(k.proc_id, k.attempt) for k in sent(out, Kill)] == [("worker-2", 0)]
    assert not [c for c in out if isinstance(c, AskToLeave)]


def test_a_rank_still_stopping_cannot_start_again_and_a_readded_rank_gets_a_new_attempt():
    state = make_state(workers=3)
    up(state)
    state.scale_workers(2, 1.0)
    with pytest.raises(ConfigError, match="still stopping"):
        state.scale_workers(3, 1.5)
    assert state.worker_ranks() == [0, 1]  # the refusal changed nothing
    state.exited("h1", exited("worker-2", 0, sig=signal.SIGTERM, requested=True), 2.0)
    out = state.scale_workers(3, 2.5)
    assert [(s.proc_id, s.attempt) for s in sent(out, Spawn)] == [("worker-2", 1)]


def test_the_job_succeeds_when_the_workers_left_finish_and_the_removed_are_gone():
    state = make_state(workers=3)
    up(state)
    state.scale_workers(2, 1.0)
    out: list = []
    for rank in (0, 1):
        out += state.exited("h0", exited(f"worker-{rank}", 0, code=0), 2.0)
    # Worker 2 still leaves: it may give shards back (then they need a worker).
    assert state.status == ""
    state.exited(state.removing["worker-2"][0], exited("worker-2", 0, code=0), 2.5)
    assert state.status == "succeeded"


def _scaled_in_as_the_data_runs_out() -> tuple[JobState, dict[int, str], list]:
    """Four workers; 0-2 finished; then a scale to two removes 3 (still on its
    last shard) and 2 (finished). The state, each rank's host, the scale's commands."""
    state = make_state(workers=2)
    up(state)
    running(state, state.scale_workers(4, 1.0))
    hosts = {r: state.procs[f"worker-{r}"].host for r in range(4)}
    for rank in (0, 1, 2):
        state.exited(hosts[rank], exited(f"worker-{rank}", 0, code=0), 5.0)
    assert state.status == ""
    return state, hosts, state.scale_workers(2, 5.1, reason="auto")


def test_a_scale_in_as_the_data_runs_out_ends_the_job_when_the_last_removed_worker_is_gone():
    # Seen in CI under --policy auto. The job then waited for ever: only a
    # finishing worker's exit checked whether all had finished.
    state, hosts, out = _scaled_in_as_the_data_runs_out()
    assert [c for c in out if isinstance(c, WorkerGone)] == [WorkerGone(rank=2)]
    assert state.status == ""  # worker 3 is leaving
    out = state.exited(hosts[3], exited("worker-3", 0, code=0), 5.2)
    assert WorkerGone(rank=3, succeeded=True) in out
    assert state.status == "succeeded"
    # Its host lost instead of its exit: the same end.
    state, hosts, _ = _scaled_in_as_the_data_runs_out()
    state.agent_exited(hosts[3], 5.3, definite=True, detail="killed by SIGKILL")
    assert state.status == "succeeded"


def test_refusals_name_the_problem_and_change_nothing():
    state = make_state()
    up(state)
    room = r"no room for 5 more worker.*s1: 2, h1: 2.*at most 6 workers"
    with pytest.raises(ConfigError, match=room):
        state.scale_workers(7, 1.0)  # 4 free: s1 x2, h1 x2 (h0 is full)
    with pytest.raises(ConfigError, match=">= 1"):
        state.scale_workers(0, 1.0)
    assert state.worker_ranks() == [0, 1]
    assert state.scale_workers(2, 1.0) == []  # already so: nothing to do
    allreduce = make_state(builtin_ps=False)
    up(allreduce)
    with pytest.raises(ConfigError, match="fixed at start"):
        allreduce.scale_workers(3, 1.0)
    starting = make_state()
    starting.start(0.0)
    with pytest.raises(ConfigError, match="only while it runs"):
        starting.scale_workers(3, 0.5)


def test_a_removed_worker_whose_host_is_lost_gives_its_data_back_and_is_fenced_later():
    state = make_state(workers=2)
    up(state)
    running(state, state.scale_workers(3, 1.0))  # worker-2 on s1
    state.scale_workers(2, 2.0)
    out = state._agent_lost(state.agents["s1"], "silent", 3.0)
    assert WorkerGone(rank=2) in out and state.removing == {}
    # The host comes back still running it: it is stopped, not adopted.
    report = ProcReport(
        proc_id="worker-2", role="worker", rank=2, attempt=0, pid=9, state="running"
    )
    out = state.agent_hello("s1", 40.0, free_ports=PORTS, host_addr="", procs=[report])
    assert [(k.proc_id, k.attempt) for k in sent(out, Kill)] == [("worker-2", 0)]


def test_a_reconnecting_agent_that_no_longer_runs_a_removed_worker_ends_its_removal():
    state = make_state(workers=2)
    up(state)
    running(state, state.scale_workers(3, 1.0))
    state.scale_workers(2, 2.0)
    out = state._adopt_reported("s1", [], 3.0)
    assert WorkerGone(rank=2) in out and state.removing == {}


def test_plan_refuses_ranks_that_are_not_contiguous_and_counts_free_slots():
    with pytest.raises(ConfigError, match=r"0\.\.n-1"):
        plan_scale(2, ranks=[0, 2], room=[])
    plan = plan_scale(4, ranks=[0, 1], room=[("a", 0), ("b", 1), ("c", 5)])
    assert plan.added == {2: "b", 3: "c"} and plan.removed == []
    assert plan_scale(1, ranks=[0, 1, 2], room=[]).removed == [2, 1]


def test_a_resumed_supervisor_rebuilds_the_scaled_workers_from_the_event_log():
    base = place(HOSTS, workers=2, servers=1)
    scales = [(4, {2: "s1", 3: "h1"}), (3, {}), (4, {3: "s1"})]
    assignments, released = rescaled(base, scales)
    workers = {a.rank: a.host for a in assignments if a.role == "worker"}
    assert workers == {0: "h0", 1: "h0", 2: "s1", 3: "s1"}
    assert released == []
    assignments, released = rescaled(base, [(4, {2: "s1", 3: "h1"}), (1, {})])
    assert [a.rank for a in assignments if a.role == "worker"] == [0]
    assert released == [1, 2, 3]
    assert [a.role for a in assignments] == ["worker", "server"]


def test_an_added_assignment_counts_the_hosts_other_workers():
    base = place(HOSTS, workers=2, servers=1)
    a = added_assignment(2, "h0", base)
    assert (a.local_rank, a.local_world_size, a.group_rank) == (2, 3, 0)
    b = added_assignment(2, "h1", base)
    assert (b.local_rank, b.group_rank) == (0, 1)


def test_resume_gives_back_the_data_of_removed_ranks():
    state = make_state(workers=2)
    out = state.resume(
        0.0, attempts={}, restarts=[], failures=[], adopt=set(), released_workers=[2, 3]
    )
    assert [c for c in out if isinstance(c, WorkerGone)] == [WorkerGone(rank=2), WorkerGone(rank=3)]
    assert all(s.state is ProcState.PENDING for s in state.procs.values())


def test_an_unattached_allreduce_group_restarts_with_the_new_size():
    # Scripts that attach no model (torchrun's): the scale restarts the group.
    state = make_state(builtin_ps=False, workers=2)
    up(state)
    out = state.scale_workers(3, 1.0, reason="grow", restart=True)
    assert sorted(k.proc_id for k in sent(out, Kill)) == ["worker-0", "worker-1"]
    assert sent(out, Spawn) == [] and state.procs["worker-2"].state is ProcState.PENDING
    # Nobody starts until every old worker is gone; then all three together.
    first = state.exited("h0", exited("worker-0", 0, sig=15, requested=True), 2.0)
    assert sent(first, Spawn) == []
    last = state.exited("h0", exited("worker-1", 0, sig=15, requested=True), 2.1)
    assert sorted((s.proc_id, s.attempt) for s in sent(last, Spawn)) == [
        ("worker-0", 1), ("worker-1", 1), ("worker-2", 0),
    ]  # fmt: skip
    assert state.failures == []
    running(state, last)
    # Down again: the removed rank is stopped at once, the others restart.
    down = state.scale_workers(2, 3.0, reason="shrink", restart=True)
    assert sorted(k.proc_id for k in sent(down, Kill)) == ["worker-0", "worker-1", "worker-2"]
    assert [e.rank for e in events(down, "leave_stopped")] == [2]
    assert state.worker_ranks() == [0, 1]
    gone = state.exited("s1", exited("worker-2", 0, sig=15, requested=True), 3.1)
    assert [c for c in gone if isinstance(c, WorkerGone)] == [WorkerGone(rank=2)]
    for proc in ("worker-0", "worker-1"):
        again = state.exited("h0", exited(proc, 1, sig=15, requested=True), 3.2)
    assert sorted((s.proc_id, s.attempt) for s in sent(again, Spawn)) == [
        ("worker-0", 2), ("worker-1", 2),
    ]  # fmt: skip
