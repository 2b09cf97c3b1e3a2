"""``dtlaunch scale --servers`` in the node table and in the fleet's next step
(fake clock, no processes): where added servers start and how, what a scale-in
keeps running until the blocks moved off, refusals that change nothing, the
servers a resumed supervisor rebuilds from the event log, and the step the
fleet takes from the map's and the target's counts."""

from __future__ import annotations

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.events import EventRecorder, MemorySink
from dtlaunch.supervisor.history import load_history
from dtlaunch.supervisor.jobstate.limits import LimitRules
from dtlaunch.supervisor.jobstate.machine import JobState, ProcState
from dtlaunch.supervisor.jobstate.scaling import rescaled_servers
from dtlaunch.supervisor.placement import place
from dtlaunch.supervisor.psfleet.scaling import Drain, Rescale, Wait, next_server_step
from dtlaunch.wire.messages import Exited, Kill, Spawn
from tests.test_jobstate import exited, sent
from tests.test_scaling import HOSTS, events, make_state, running, up


def test_added_servers_start_empty_on_spare_hosts_first_and_workers_learn_them():
    state = make_state(workers=2)  # h0: server-0 + workers 0, 1; h1 and s1 free
    up(state)
    out = state.scale_servers(3, 1.0, reason="more bandwidth")
    assert [s.proc_id for s in sent(out, Spawn)] == ["server-1", "server-2"]
    assert {state.procs[p].host for p in ("server-1", "server-2")} == {"s1"}
    # No snapshot to restore: their blocks come by import.
    assert all(state.procs[p].ps_fresh_attempt == 0 for p in ("server-1", "server-2"))
    (scale,) = events(out, "scale_servers")
    assert scale.data == {"servers": 3, "was": 1, "added": {"1": "s1", "2": "s1"},
                          "reason": "more bandwidth"}  # fmt: skip
    assert state.server_target == 3 and state.server_ranks() == [0, 1, 2]
    running(state, out)
    assert state.server_endpoint(2).startswith("tcp://s1-addr:")
    # A worker (re)started from now on is told every server.
    restarted = state.exited("h0", exited("worker-1", 0, code=1), 2.0)
    running(state, restarted)
    assert len(state.procs["worker-1"].ps_servers) == 3


def test_a_scale_in_keeps_the_servers_running_until_their_blocks_moved_off():
    state = make_state(workers=2)
    up(state)
    running(state, state.scale_servers(3, 1.0))
    out = state.scale_servers(1, 2.0)
    assert sent(out, Kill) == [] and state.server_target == 1
    assert state.server_ranks() == [0, 1, 2]  # they still hold blocks
    assert state.server_drained(0) == []  # below the target: never
    drained = state.server_drained(2)
    assert [k.proc_id for k in sent(drained, Kill)] == ["server-2"]
    assert [e.rank for e in events(drained, "removed")] == [2]
    assert state.server_ranks() == [0, 1]
    # Its exit, even by a signal, is a retirement: no restart, no failure.
    gone = state.exited("s1", exited("server-2", 0, sig=15, requested=True), 3.0)
    assert sent(gone, Spawn) == [] and state.failures == []
    assert [e.data.get("retired") for e in events(gone, "exit")] == [True]
    # Scaling out again while server 1 still stops is refused until it is gone.
    drained = state.server_drained(1)
    with pytest.raises(ConfigError, match=r"server\(s\) 1 are still stopping"):
        state.scale_servers(2, 4.0)
    state.exited("s1", exited("server-1", 0, code=0, requested=True), 4.0)
    again = state.scale_servers(2, 5.0)
    assert [s.attempt for s in sent(again, Spawn)] == [1]  # after the old one's attempts


def test_scaling_back_up_before_the_drain_keeps_the_server_that_holds_blocks():
    state = make_state(workers=2)
    up(state)
    running(state, state.scale_servers(3, 1.0))
    state.scale_servers(2, 2.0)
    out = state.scale_servers(3, 3.0)
    assert sent(out, Spawn) == [] and state.server_target == 3
    assert state.server_drained(2) == []


def test_refusals_name_the_problem_and_change_nothing():
    state = make_state(workers=2)
    up(state)
    with pytest.raises(ConfigError, match=r"--servers must be a whole number >= 1"):
        state.scale_servers(0, 1.0)
    with pytest.raises(ConfigError, match=r"no room for 5 more server\(s\).*at most 5 servers"):
        state.scale_servers(6, 1.0)
    assert state.server_target == 1 and state.server_ranks() == [0]
    allreduce = make_state(builtin_ps=False)
    up(allreduce)
    with pytest.raises(ConfigError, match="only jobs with dtlaunch's parameter servers"):
        allreduce.scale_servers(2, 1.0)


def test_a_resumed_supervisor_rebuilds_the_servers_from_the_event_log(tmp_path):
    state = make_state(workers=2)
    up(state)
    sink = MemorySink()
    recorder = EventRecorder([sink])
    steps = [*state.scale_servers(3, 1.0), *state.scale_servers(2, 2.0)]
    steps += state.server_drained(2)
    for command in events(steps, "scale_servers") + events(steps, "removed"):
        recorder.emit(command.kind, role=command.role, rank=command.rank, **command.data)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(e.to_json() + "\n" for e in sink.events))
    history = load_history(path)
    assert history.server_target == 2
    assert history.server_changes == [(1, "s1"), (2, "s1"), (2, "")]
    rebuilt = rescaled_servers(place(HOSTS, workers=2, servers=1), history.server_changes)
    servers = [a for a in rebuilt if a.role == "server"]
    assert [(a.rank, a.host) for a in servers] == [(0, "h0"), (1, "s1")]


@pytest.mark.parametrize(
    ("map_servers", "target", "ready", "step"),
    [
        (2, 2, {0: True, 1: True}, None),
        (2, 3, {0: True, 1: True, 2: False}, Wait("server(s) 2 not running yet")),
        (2, 3, {0: True, 1: True, 2: True}, Rescale(servers=3, was=2)),
        (3, 1, {0: True, 1: True, 2: True}, Rescale(servers=1, was=3)),
        (3, 1, {0: True, 1: False, 2: True}, Wait("server(s) 1 not running yet")),
        (1, 1, {0: True, 1: True, 2: False}, Drain((1, 2))),
        (1, 1, {0: False}, None),
    ],
)
def test_the_fleet_closes_the_gap_one_step_at_a_time(map_servers, target, ready, step):
    assert next_server_step(map_servers=map_servers, target=target, ready=ready) == step


def test_a_resumed_state_takes_the_target_of_the_log():
    state = make_state(workers=2)
    state.resume(0.0, attempts={}, restarts=[], failures=[], adopt=set(), server_target=3)
    assert state.server_target == 3
    assert all(s.state is ProcState.PENDING for s in state.procs.values())


def _with_limits(memory: int) -> JobState:
    return make_state(workers=2, limits=LimitRules(memory_limit=memory))


def test_a_server_out_of_memory_with_even_memory_gives_the_job_more_servers_once():
    state = _with_limits(1 << 30)
    up(state)
    state.ps_map_servers, state.ps_map_blocks = 1, 8  # the workers registered the blocks
    state.procs["server-0"].rss_bytes = 1 << 30
    out = _oom_killed(state, "server-0", 1.0)
    # Alone, its memory is even with itself: DLRover doubles the servers, and it
    # restarts with the limit it had.
    (rule,) = events(out, "oom_servers")
    assert (rule.data["servers"], rule.data["was"], rule.data["limit"]) == (2, 1, 1 << 30)
    assert state.server_target == 2 and not events(out, "memory_limit")
    spawns = {s.proc_id: s for s in sent(out, Spawn)}
    assert spawns["server-0"].memory_limit == 1 << 30 and "server-1" in spawns
    assert state.failures[-1].retryable and "runs 2 servers now" in state.failures[-1].error
    running(state, out)
    # Out again before the blocks spread: more memory this time.
    again = _oom_killed(state, "server-0", 2.0)
    (grown,) = events(again, "memory_limit")
    assert (grown.data["old"], grown.data["new"]) == (1 << 30, 2 << 30)
    assert state.server_target == 2 and not events(again, "oom_servers")


def test_a_server_that_uses_clearly_more_than_the_others_gets_more_memory():
    state = _with_limits(1 << 30)
    up(state)
    running(state, state.scale_servers(2, 1.0))
    state.ps_map_servers, state.ps_map_blocks = 2, 8
    state.procs["server-1"].rss_bytes = 200 << 20  # its blocks are small
    out = _oom_killed(state, "server-0", 2.0)
    assert not events(out, "oom_servers") and state.server_target == 2
    (grown,) = events(out, "memory_limit")
    assert grown.data["new"] == 2 << 30


def test_a_model_in_as_many_blocks_as_servers_gets_more_memory_not_servers():
    state = _with_limits(1 << 30)
    up(state)
    state.ps_map_servers, state.ps_map_blocks = 1, 1  # one block: a second server holds nothing
    out = _oom_killed(state, "server-0", 1.0)
    assert not events(out, "oom_servers") and events(out, "memory_limit")


def test_before_the_workers_registered_their_blocks_a_server_gets_more_memory():
    state = _with_limits(1 << 30)
    up(state)
    out = _oom_killed(state, "server-0", 1.0)  # ps_map_servers is still 0
    assert not events(out, "oom_servers") and events(out, "memory_limit")


def _oom_killed(state: JobState, proc_id: str, now: float) -> list:
    slot = state.procs[proc_id]
    killed = Exited(
        proc_id=proc_id, attempt=slot.attempt, pid=100, exit_code=None, signal=9,
        runtime_s=30.0, oom_killed=True,
    )  # fmt: skip
    return state.exited(slot.host, killed, now)
