"""JobState driven step by step with a fake clock: no sockets, no processes."""

from __future__ import annotations

import signal

import pytest

from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.jobstate.machine import (
    AgentState,
    EmitEvent,
    Finish,
    JobState,
    LaunchAgent,
    Phase,
    ProcState,
    SendToAgent,
    Timing,
)
from dtlaunch.supervisor.jobstate.workers import (
    WorkerPeers,
    parse_worker_identity,
    worker_identity,
)
from dtlaunch.supervisor.placement import place
from dtlaunch.wire.messages import Exited, Kill, ProcReport, Shutdown, Spawn

TIMING = Timing(
    heartbeat_interval=1.0, dead_after=3, orphan_timeout=60.0, kill_grace=2.0, agent_timeout=30.0
)
HOSTS = [HostSpec(label=f"h{i}", hostname=f"127.0.0.{i + 1}", slots=1) for i in range(3)]


def make_state(
    workers=3, servers=0, scope="group", max_restarts=2, hosts=HOSTS, spare_hosts=(), limits=None
):
    def build_spawn(slot, addr, port):
        return Spawn(
            proc_id=slot.proc_id,
            role=slot.role,
            rank=slot.rank,
            attempt=slot.attempt,
            argv=["python", "train.py"],
            env={"MASTER_ADDR": addr, "MASTER_PORT": str(port)},
            cwd="/",
            memory_limit=slot.memory_limit,
            cpu_limit=slot.cpu_limit,
        )

    return JobState(
        place(hosts, workers=workers, servers=servers),
        timing=TIMING,
        max_restarts=max_restarts,
        restart_scope=scope,
        build_spawn=build_spawn,
        master_addr_of=lambda label, reported: label + "-addr",
        spare_hosts=spare_hosts,
        host_slots={h.label: h.slots for h in hosts},
        host_gpus={h.label: h.gpus for h in hosts if h.gpus},
        limits=limits,
    )


def sent(commands, kind):
    return [
        c.message for c in commands if isinstance(c, SendToAgent) and isinstance(c.message, kind)
    ]


def events(commands, kind=None):
    return [c for c in commands if isinstance(c, EmitEvent) and (kind is None or c.kind == kind)]


def bring_up(state, now=0.0):
    out = state.start(now)
    for host in state.agents:
        out += state.agent_hello(host, now + 0.1, free_ports=[5000, 5001], host_addr="", procs=[])
    for spawn in sent(out, Spawn):
        out += state.spawned(
            state.procs[spawn.proc_id].host, spawn.proc_id, spawn.attempt, 100, 0.2
        )
    return out


def exited(proc_id, attempt, code=None, sig=None, runtime=10.0, tail=(), requested=False):
    return Exited(
        proc_id=proc_id,
        attempt=attempt,
        pid=100,
        exit_code=code,
        signal=sig,
        runtime_s=runtime,
        stderr_tail=list(tail),
        requested=requested,
    )


def test_start_launches_one_agent_per_used_host_and_spawns_when_all_are_up():
    state = make_state(workers=2)
    out = state.start(0.0)
    assert [c.host for c in out if isinstance(c, LaunchAgent)] == ["h0", "h1"]
    out = state.agent_hello("h1", 0.5, free_ports=[7000], host_addr="", procs=[])
    assert sent(out, Spawn) == []  # h0 (the master's host) is not up yet
    out = state.agent_hello("h0", 0.6, free_ports=[6000, 6001], host_addr="", procs=[])
    spawns = sent(out, Spawn)
    assert sorted(s.proc_id for s in spawns) == ["worker-0", "worker-1"]
    assert {s.env["MASTER_ADDR"] for s in spawns} == {"h0-addr"}
    assert {s.env["MASTER_PORT"] for s in spawns} == {"6000"}
    assert state.phase is Phase.RUNNING


def test_all_workers_succeeding_stops_agents_and_finishes_succeeded():
    state = make_state()
    bring_up(state)
    for rank in range(3):
        out = state.exited(f"h{rank}", exited(f"worker-{rank}", 0, code=0), 5.0)
    assert state.phase is Phase.STOPPING
    assert len(sent(out, Shutdown)) == 3
    for host in ("h0", "h1"):
        assert not [c for c in state.agent_bye(host, "shutdown", 6.0) if isinstance(c, Finish)]
    out = state.agent_bye("h2", "shutdown", 6.0)
    assert [c.status for c in out if isinstance(c, Finish)] == ["succeeded"]
    assert state.failures == []


def test_process_scope_restarts_only_the_failed_rank_with_a_bumped_attempt():
    state = make_state(scope="process")
    bring_up(state)
    out = state.exited("h1", exited("worker-1", 0, sig=signal.SIGKILL), 3.0)
    spawns = sent(out, Spawn)
    assert [(s.proc_id, s.attempt) for s in spawns] == [("worker-1", 1)]
    assert sent(out, Kill) == []
    assert [r.rank for r in state.restarts] == [1]
    assert state.failures[0].reason == "killed by SIGKILL"
    assert state.failures[0].retryable


def test_group_scope_stops_the_others_then_restarts_everyone_together():
    state = make_state(scope="group")
    bring_up(state)
    out = state.exited("h1", exited("worker-1", 0, code=1, tail=["RuntimeError: boom"]), 3.0)
    kills = sent(out, Kill)
    assert sorted(k.proc_id for k in kills) == ["worker-0", "worker-2"]
    assert sent(out, Spawn) == []  # nothing restarts until the old group is gone
    out = state.exited("h0", exited("worker-0", 0, sig=signal.SIGTERM, requested=True), 3.5)
    assert sent(out, Spawn) == []
    out = state.exited("h2", exited("worker-2", 0, sig=signal.SIGTERM, requested=True), 3.6)
    spawns = sent(out, Spawn)
    assert sorted((s.proc_id, s.attempt) for s in spawns) == [
        ("worker-0", 1),
        ("worker-1", 1),
        ("worker-2", 1),
    ]
    # A fresh rendezvous port for the new attempt.
    assert {s.env["MASTER_PORT"] for s in spawns} == {"5001"}
    assert len(state.failures) == 1  # the requested stops are not failures


def test_unretryable_error_stops_the_job_without_restart():
    state = make_state()
    bring_up(state)
    tail = [
        "Traceback (most recent call last):",
        '  File "t.py", line 1',
        "ModuleNotFoundError: No module named 'nope'",
    ]
    out = state.exited("h2", exited("worker-2", 0, code=1, runtime=1.0, tail=tail), 1.5)
    assert sent(out, Spawn) == []
    assert len(sent(out, Shutdown)) == 3
    assert state.status == "failed"
    assert not state.failures[0].retryable
    assert state.failures[0].error.startswith("ModuleNotFoundError")


def test_restarts_are_bounded_by_max_restarts():
    state = make_state(scope="process", max_restarts=1)
    bring_up(state)
    out = state.exited("h0", exited("worker-0", 0, sig=signal.SIGKILL), 1.0)
    assert sent(out, Spawn)
    state.spawned("h0", "worker-0", 1, 200, 1.1)
    state.exited("h0", exited("worker-0", 1, sig=signal.SIGKILL), 2.0)
    assert state.status == "failed"
    assert "--max-restarts" in state.stop_reason


def test_stale_exit_of_an_old_attempt_is_ignored():
    state = make_state(scope="process")
    bring_up(state)
    state.exited("h0", exited("worker-0", 0, sig=signal.SIGKILL), 1.0)
    assert state.exited("h0", exited("worker-0", 0, sig=signal.SIGKILL), 1.1) == []


def test_silent_agent_is_unresponsive_not_dead_while_its_channel_is_open():
    state = make_state()
    bring_up(state)
    for t in (1.0, 2.0, 3.0):
        for host in state.agents:
            state.agent_seen(host, t)
    state.agent_seen("h0", 6.5)
    state.agent_seen("h2", 6.5)
    out = state.tick(6.6)  # h1 silent 3.6 s > 3 x 1 s
    assert [e.host for e in events(out, "heartbeat_lost")] == ["h1"]
    assert state.agents["h1"].state is AgentState.UNRESPONSIVE
    assert state.phase is Phase.RUNNING
    assert state.restarts == []
    out = state.heartbeat("h1", 7.0, [])
    assert [e.host for e in events(out, "heartbeat_recovered")] == ["h1"]


def test_agent_death_loses_its_processes_relaunches_it_and_restarts():
    state = make_state(scope="group")
    bring_up(state)
    out = state.agent_exited("h2", 2.0, definite=True, detail="killed by SIGKILL")
    assert [c.host for c in out if isinstance(c, LaunchAgent)] == ["h2"]
    assert [e.host for e in events(out, "agent_lost")] == ["h2"]
    assert state.failures[0].reason == "lost connection"
    assert sorted(k.proc_id for k in sent(out, Kill)) == ["worker-0", "worker-1"]
    state.exited("h0", exited("worker-0", 0, sig=15, requested=True), 2.2)
    out = state.exited("h1", exited("worker-1", 0, sig=15, requested=True), 2.3)
    # The survivors start at once; they wait in the rendezvous until worker-2 joins.
    assert sorted(s.proc_id for s in sent(out, Spawn)) == ["worker-0", "worker-1"]
    out = state.agent_hello("h2", 3.0, free_ports=[9000], host_addr="", procs=[])
    assert [(s.proc_id, s.attempt) for s in sent(out, Spawn)] == [("worker-2", 1)]


def test_closed_channel_plus_silence_means_lost():
    state = make_state()
    bring_up(state)
    state.agent_exited("h1", 1.0, definite=False, detail="channel closed")
    assert state.agents["h1"].state is AgentState.UP
    for host in ("h0", "h2"):
        state.agent_seen(host, 3.5)
    out = state.tick(3.5)
    assert [e.host for e in events(out, "agent_lost")] == ["h1"]


def test_sigstopped_process_is_reported_unresponsive_then_responsive():
    state = make_state()
    bring_up(state)
    report = ProcReport(
        proc_id="worker-1", role="worker", rank=1, attempt=0, pid=100, state="stopped"
    )
    out = state.heartbeat("h1", 1.0, [report])
    assert [(e.kind, e.rank) for e in events(out)] == [("unresponsive", 1)]
    assert state.procs["worker-1"].state is ProcState.RUNNING
    running = ProcReport(
        proc_id="worker-1", role="worker", rank=1, attempt=0, pid=100, state="running"
    )
    out = state.heartbeat("h1", 2.0, [running])
    assert [(e.kind, e.rank) for e in events(out)] == [("responsive", 1)]


def test_stop_sends_shutdown_and_finishes_at_the_deadline_if_agents_hang():
    state = make_state()
    bring_up(state)
    out = state.stop("SIGINT", 5.0)
    assert len(sent(out, Shutdown)) == 3
    assert not any(isinstance(c, Finish) for c in state.tick(6.0))
    out = state.tick(5.0 + TIMING.kill_grace + 10.0)
    assert [c.status for c in out if isinstance(c, Finish)] == ["stopped"]


def test_agent_that_never_connects_fails_the_job():
    state = make_state()
    state.start(0.0)
    out = state.tick(31.0)
    assert state.status == "failed"
    assert "did not connect back" in state.stop_reason
    assert sent(out, Shutdown)


def test_spawn_failure_is_unretryable():
    state = make_state()
    bring_up(state)
    state.spawn_failed("h0", "worker-0", 0, "cwd /nope does not exist", 1.0)
    assert state.status == "failed"
    assert state.failures[0].error == "cwd /nope does not exist"


@pytest.mark.parametrize("servers", [1])
def test_servers_are_stopped_when_workers_finish(servers):
    hosts = [HostSpec(label="h0", hostname="a", slots=4, servers=1)]
    state = make_state(workers=2, servers=servers, scope="process", hosts=hosts)
    out = bring_up(state)
    assert sorted(s.proc_id for s in sent(out, Spawn)) == ["server-0", "worker-0", "worker-1"]
    state.exited("h0", exited("worker-0", 0, code=0), 2.0)
    out = state.exited("h0", exited("worker-1", 0, code=0), 2.0)
    assert sent(out, Shutdown)
    out = state.exited("h0", exited("server-0", 0, sig=15, requested=True), 2.5)
    out += state.agent_bye("h0", "shutdown", 2.6)
    assert [c.status for c in out if isinstance(c, Finish)] == ["succeeded"]


def test_a_failing_launch_waits_for_agents_still_launching_and_shuts_them_down():
    state = make_state()
    state.start(0.0)
    state.agent_hello("h0", 0.1, free_ports=[5000], host_addr="", procs=[])
    out = state.agent_launch_failed("h2", "host key not known", 0.2)
    assert state.status == "failed"
    assert not any(isinstance(c, Finish) for c in out)  # h1 is still launching
    out = state.agent_hello("h1", 0.5, free_ports=[5000], host_addr="", procs=[])
    assert [m.reason for m in sent(out, Shutdown)] == [state.stop_reason]
    assert sent(out, Spawn) == []
    state.agent_bye("h0", "shutdown", 0.6)
    out = state.agent_bye("h1", "shutdown", 0.7)
    assert [c.status for c in out if isinstance(c, Finish)] == ["failed"]


def test_an_agent_not_yet_started_when_the_job_stops_is_abandoned():
    state = make_state()
    state.start(0.0)
    state.stop("SIGINT", 0.1)
    state.agent_launch_abandoned("h0", 0.2)
    state.agent_launch_abandoned("h1", 0.2)
    out = state.agent_launch_abandoned("h2", 0.2)
    assert [c.status for c in out if isinstance(c, Finish)] == ["stopped"]


KEYERROR_AT_START = [
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 12, in <module>',
    '    token = os.environ["API_TOKEN"]',
    "            ~~~~~~~~~~^^^^^^^^^^^^^",
    "KeyError: 'API_TOKEN'",
]


def test_the_same_crash_before_any_progress_is_a_crash_loop_not_retried():
    """Issue 12, defect 8: a deterministic start-up crash was retried
    --max-restarts times for the whole group."""
    state = make_state(scope="group", max_restarts=5)
    bring_up(state)
    out = state.exited("h1", exited("worker-1", 0, code=1, runtime=2.0, tail=KEYERROR_AT_START), 2)
    assert state.failures[-1].retryable and state.phase is Phase.RUNNING
    for proc_id in ("worker-0", "worker-2"):  # the group follows
        state.exited(state.procs[proc_id].host, exited(proc_id, 0, requested=True), 2.1)
    for spawn in sent(out, Spawn) + [s for s in sent(state.tick(2.2), Spawn)]:
        state.spawned(state.procs[spawn.proc_id].host, spawn.proc_id, spawn.attempt, 200, 2.3)
    for slot in state.procs.values():
        if slot.state is ProcState.PENDING:
            state.spawned(slot.host, slot.proc_id, slot.attempt, 200, 2.3)
    attempt = state.procs["worker-1"].attempt
    state.exited("h1", exited("worker-1", attempt, code=1, runtime=2.0, tail=KEYERROR_AT_START), 4)
    last = state.failures[-1]
    assert (last.reason, last.retryable) == ("crash loop", False)
    assert "KeyError at /job/train.py:12" in last.error
    assert state.status == "failed" and len(state.failures) == 2


def test_the_same_crash_after_progress_is_retried():
    state = make_state(scope="process", max_restarts=5)
    bring_up(state)
    state.exited("h0", exited("worker-0", 0, code=1, runtime=2.0, tail=KEYERROR_AT_START), 2)
    state.spawned("h0", "worker-0", 1, 200, 2.1)
    state.worker_progressed(0)  # it trained a step this time: not a loop
    state.exited("h0", exited("worker-0", 1, code=1, runtime=2.0, tail=KEYERROR_AT_START), 4)
    assert state.failures[-1].retryable and state.phase is Phase.RUNNING
    # Another crash, at another line, is no loop either.
    state.spawned("h0", "worker-0", 2, 300, 4.1)
    other = [*KEYERROR_AT_START[:1], '  File "/job/train.py", line 40, in step', "KeyError: 'x'"]
    state.exited("h0", exited("worker-0", 2, code=1, runtime=2.0, tail=other), 6)
    assert state.failures[-1].retryable and state.phase is Phase.RUNNING


def test_an_agent_back_after_being_lost_has_its_stale_attempts_fenced_before_the_rank_restarts():
    """Issue 12: an agent declared lost (its channel closed, then silence) that comes
    back still running the old attempt of a rank that has restarted since must stop
    it before the new attempt starts there, so no rank ever runs twice."""
    state = make_state(scope="process")
    bring_up(state)
    state.agent_exited("h1", 1.0, definite=False, detail="channel closed")
    for host in ("h0", "h2"):
        state.agent_seen(host, 3.5)
    out = state.tick(3.5)
    assert [e.host for e in events(out, "agent_lost")] == ["h1"]
    assert state.procs["worker-1"].attempt == 1  # its rank restarts, waiting for h1

    old = ProcReport(proc_id="worker-1", role="worker", rank=1, attempt=0, pid=100, state="running")
    out = state.agent_hello("h1", 5.0, free_ports=[9000], host_addr="", procs=[old])
    assert [(e.rank, e.data["attempt"]) for e in events(out, "fenced")] == [(1, 0)]
    assert [(k.proc_id, k.attempt) for k in sent(out, Kill)] == [("worker-1", 0)]
    assert sent(out, Spawn) == []  # not while the old attempt runs on that agent
    out = state.heartbeat("h1", 5.5, [old])  # still reported: no second kill, no spawn
    assert sent(out, Kill) == [] and sent(out, Spawn) == []

    out = state.exited("h1", exited("worker-1", 0, sig=15, requested=True), 6.0)
    assert [e.data.get("fenced") for e in events(out, "exit")] == [True]
    assert [(s.proc_id, s.attempt) for s in sent(out, Spawn)] == [("worker-1", 1)]
    assert state.failures and all(f.reason != "stalled" for f in state.failures)
    assert len(state.failures) == 1  # the loss; the fenced exit is not another failure


def test_an_agent_reconnecting_with_the_current_attempts_is_not_fenced():
    state = make_state(scope="process")
    bring_up(state)
    now = [
        ProcReport(proc_id="worker-1", role="worker", rank=1, attempt=0, pid=100, state="running")
    ]
    out = state.agent_hello("h1", 2.0, free_ports=[9000], host_addr="", procs=now)
    assert events(out, "fenced") == [] and sent(out, Kill) == []


SPARE_HOSTS = [*HOSTS[:2], HostSpec(label="h2", hostname="127.0.0.3", slots=1, spare=True)]


def lose(state, host, now):
    """``host``'s channel closes; silence past dead_after then declares it lost."""
    state.agent_exited(host, now, definite=False, detail="channel closed")
    for other in state.agents:
        if other != host:
            state.agent_seen(other, now + 3.5)
    return state.tick(now + 3.5)


def test_a_lost_hosts_worker_moves_to_a_free_spare_host_and_its_stale_attempt_is_fenced():
    """Issue 12, network cuts: a host cut off long enough to be declared lost has
    its worker restarted on the spare host at once; relaunching the agent there
    fails while the cut lasts, which is retried with a backoff, not fatal; when
    the cut heals, the first heartbeat of the old agent gets its stale attempt
    stopped (fenced) and the host becomes a spare in turn."""
    state = make_state(workers=2, scope="process", hosts=SPARE_HOSTS, spare_hosts=["h2"])
    bring_up(state)
    assert state.procs["worker-1"].host == "h1"
    out = lose(state, "h1", 1.0)
    assert [(e.data["old_host"], e.data["new_host"]) for e in events(out, "moved")] == [
        ("h1", "h2")
    ]
    spawns = [c for c in out if isinstance(c, SendToAgent) and isinstance(c.message, Spawn)]
    assert [(c.host, c.message.proc_id, c.message.attempt) for c in spawns] == [
        ("h2", "worker-1", 1)
    ]
    assert [c.host for c in out if isinstance(c, LaunchAgent)] == ["h1"]

    out = state.agent_launch_failed("h1", "ssh: connect timed out", 15.0)
    assert state.phase is Phase.RUNNING and state.failures[-1].reason != "agent launch failed"
    [retry] = events(out, "agent_relaunch_failed")
    assert retry.data["retry_in_s"] == 2.0 and retry.data["failures"] == 1
    assert [c for c in state.tick(16.0) if isinstance(c, LaunchAgent)] == []
    assert [c.host for c in state.tick(17.1) if isinstance(c, LaunchAgent)] == ["h1"]
    out = state.agent_launch_failed("h1", "ssh: connect timed out", 27.0)
    assert events(out, "agent_relaunch_failed")[0].data["retry_in_s"] == 4.0

    old = ProcReport(proc_id="worker-1", role="worker", rank=1, attempt=0, pid=100, state="running")
    out = state.heartbeat("h1", 28.0, [old])  # the cut healed: the old agent is heard
    assert [(e.rank, e.data["attempt"]) for e in events(out, "fenced")] == [(1, 0)]
    assert [(c.host, c.message.attempt) for c in out if isinstance(c, SendToAgent)] == [("h1", 0)]
    assert state.heartbeat("h1", 28.5, [old]) == []  # being stopped: no second kill
    out = state.agent_hello("h1", 28.6, free_ports=[9000], host_addr="", procs=[old])
    assert sent(out, Spawn) == [] and sent(out, Kill) == []
    out = state.exited("h1", exited("worker-1", 0, sig=9, requested=True), 29.0)
    assert [e.data.get("fenced") for e in events(out, "exit")] == [True]
    assert state.free_spare_hosts() == []  # idle and back, but cooling down (30 s)
    state.agent_seen("h1", 35.0)
    state.agent_seen("h2", 35.0)
    assert events(state.tick(35.0), "host_cooldown_over")[0].host == "h1"
    assert state.free_spare_hosts() == ["h1"]  # the next spare
    assert state.procs["worker-1"].host == "h2" and state.phase is Phase.RUNNING


def test_a_host_lost_again_and_again_cools_down_longer_before_it_takes_work():
    """Issue 16 (Horovod's blacklist problem): a host that was lost takes no moved
    process for 30 s x 2^(losses-1); a worker that has nowhere else to go waits,
    and moves there once the cooldown is over."""
    state = make_state(workers=2, scope="process", hosts=SPARE_HOSTS, spare_hosts=["h2"])
    bring_up(state)
    out = lose(state, "h1", 1.0)  # lost at 4.5: until 34.5
    assert [(e.data["losses"], e.data["cooldown_s"]) for e in events(out, "agent_lost")] == [
        (1, 30.0)
    ]
    assert state.procs["worker-1"].host == "h2"
    state.agent_hello("h1", 10.0, free_ports=[9000], host_addr="", procs=[], pid=77)
    state.agent_seen("h1", 15.5)
    out = lose(state, "h2", 12.0)  # worker-1's new host goes too, at 15.5
    assert events(out, "moved") == [] and state.procs["worker-1"].state is ProcState.PENDING
    assert state.free_spare_hosts() == []  # h1 is back and idle, but cooling down
    for now in (20.0, 25.0, 30.0, 34.4):
        for host in ("h0", "h1"):
            state.agent_seen(host, now)
        assert events(state.tick(now), "moved") == []
    state.agent_seen("h0", 34.6)
    state.agent_seen("h1", 34.6)
    out = state.tick(34.6)
    assert [e.host for e in events(out, "host_cooldown_over")] == ["h1"]
    assert [(e.data["old_host"], e.data["new_host"]) for e in events(out, "moved")] == [
        ("h2", "h1")
    ]
    assert [(s.proc_id, c.host) for c in out if isinstance(c, SendToAgent)
            for s in [c.message] if isinstance(s, Spawn)] == [("worker-1", "h1")]  # fmt: skip
    out = lose(state, "h1", 40.0)  # its second loss: twice as long
    assert [(e.data["losses"], e.data["cooldown_s"]) for e in events(out, "agent_lost")] == [
        (2, 60.0)
    ]


def test_a_lost_host_whose_process_cannot_move_is_waited_for_at_most_the_orphan_timeout():
    state = make_state(workers=2, scope="process", hosts=HOSTS[:2])
    bring_up(state)
    out = lose(state, "h1", 1.0)
    assert events(out, "moved") == [] and state.procs["worker-1"].state is ProcState.PENDING
    now = 15.0
    while now < 4.5 + TIMING.orphan_timeout:
        out = state.agent_launch_failed("h1", "ssh: no route to host", now)
        assert state.phase is Phase.RUNNING, out
        now = events(out, "agent_relaunch_failed")[0].data["retry_in_s"] + now
        state.agent_seen("h0", now)
        out = state.tick(now)
    decision = events(out, "decision")
    assert state.phase is Phase.STOPPING and decision, out
    reason = decision[0].data["reason"]
    assert "h1 has been unreachable" in reason and "worker-1" in reason and "spare" in reason


def test_a_host_that_never_came_up_still_fails_the_job_at_once():
    state = make_state(workers=2, scope="process", hosts=HOSTS[:2])
    state.start(0.0)
    state.agent_hello("h0", 0.1, free_ports=[5000, 5001], host_addr="", procs=[])
    out = state.agent_launch_failed("h1", "Permission denied (publickey)", 0.5)
    assert state.phase is Phase.STOPPING
    assert "cannot start the agent on h1" in events(out, "decision")[0].data["reason"]


def test_an_agent_that_dies_before_it_connects_is_a_launch_failure_not_relaunched_at_once():
    # Never up: the job fails with the agent's own words (it had relaunched it
    # at once, for ever: a broken install looped at ~10 launches a second).
    state = make_state(workers=2, scope="process", hosts=HOSTS[:2])
    state.start(0.0)
    state.agent_hello("h0", 0.1, free_ports=[5000, 5001], host_addr="", procs=[])
    why = "exit code 1; its last output: ModuleNotFoundError: No module named 'x'"
    out = state.agent_exited("h1", 0.3, definite=True, detail=why)
    assert [c for c in out if isinstance(c, LaunchAgent)] == []
    assert state.phase is Phase.STOPPING
    reason = events(out, "decision")[0].data["reason"]
    assert reason == f"cannot start the agent on h1: the agent exited before it connected ({why})"
    # Up before, then lost: its new agent dying before it connects is retried
    # with the backoff of a host that cannot be reached, while the job runs on.
    state = make_state(scope="process")
    bring_up(state)
    out = state.agent_exited("h1", 1.0, definite=True, detail="killed by SIGKILL")
    assert [c.host for c in out if isinstance(c, LaunchAgent)] == ["h1"]
    out = state.agent_exited("h1", 1.2, definite=True, detail="exit code 1")
    assert [c for c in out if isinstance(c, LaunchAgent)] == [] and state.phase is Phase.RUNNING
    [retry] = events(out, "agent_relaunch_failed")
    assert retry.data["retry_in_s"] == 2.0
    assert retry.data["error"] == "the agent exited before it connected (exit code 1)"
    assert [c.host for c in state.tick(3.3) if isinstance(c, LaunchAgent)] == ["h1"]


def test_the_last_agent_exiting_before_its_bye_ends_the_stop_at_once():
    # Seen in `make demo`: the local agent's exit was handled before its Bye,
    # and the job ended at the stop deadline, 15 s later.
    state = make_state(workers=1, hosts=HOSTS[:1])
    bring_up(state)
    state.exited("h0", exited("worker-0", 0, code=0), 5.0)
    assert state.phase is Phase.STOPPING
    out = state.agent_exited("h0", 5.1, definite=True, detail="exit code 0")
    assert [e.kind for e in events(out)] == ["agent_exit"]
    assert state.phase is Phase.DONE and any(isinstance(c, Finish) for c in out)
    assert state.agent_bye("h0", "shutdown", 5.2) == []


def test_a_lost_host_relaunched_while_its_stale_attempt_ran_records_it_as_fenced():
    """The cut host answers SSH again before its old agent is heard: the new agent
    stops its predecessor and that one's children first (proctable), so the stale
    attempt is gone when it says hello; that is recorded as fenced, not killed again."""
    state = make_state(workers=2, scope="process", hosts=SPARE_HOSTS, spare_hosts=["h2"])
    bring_up(state)
    lose(state, "h1", 1.0)
    out = state.agent_hello("h1", 20.0, free_ports=[9000], host_addr="", procs=[], pid=4242)
    assert [(e.rank, e.data["attempt"], e.data["by"]) for e in events(out, "fenced")] == [
        (1, 0, "agent relaunch")
    ]
    assert sent(out, Kill) == [] and sent(out, Spawn) == []
    again = state.agent_hello("h1", 21.0, free_ports=[9000], host_addr="", procs=[], pid=4242)
    assert events(again, "fenced") == []


def test_a_spare_host_takes_as_many_workers_of_a_lost_host_as_it_has_slots():
    hosts = [
        HostSpec(label="h0", hostname="127.0.0.1", slots=2),
        HostSpec(label="h1", hostname="127.0.0.2", slots=3, spare=True),
    ]
    state = make_state(workers=2, scope="group", hosts=hosts, spare_hosts=["h1"])
    bring_up(state)
    out = lose(state, "h0", 1.0)
    assert sorted(e.rank for e in events(out, "moved")) == [0, 1]
    spawns = [c for c in out if isinstance(c, SendToAgent) and isinstance(c.message, Spawn)]
    # One group restart, both on the spare: the second lost worker, restarted
    # and started there with the first, is not failed a second time.
    assert sorted((c.host, c.message.rank, c.message.attempt) for c in spawns) == [
        ("h1", 0, 1),
        ("h1", 1, 1),
    ]
    assert len(events(out, "failure")) == 1 and state.phase is Phase.RUNNING


def test_workers_hold_one_gpu_each_and_a_moved_worker_takes_a_free_one_on_the_spare():
    """gpus=: at start a worker's GPU is its local rank (DeepSpeed's convention);
    moved to a spare it takes the lowest GPU no other worker there holds, and a
    spare whose GPUs are all held takes no more workers even with slots free."""
    hosts = [
        HostSpec(label="h0", hostname="127.0.0.1", slots=2, gpus=2),
        HostSpec(label="h1", hostname="127.0.0.2", slots=2, gpus=2),
        HostSpec(label="h2", hostname="127.0.0.3", slots=4, gpus=2, spare=True),
    ]
    state = make_state(workers=4, scope="process", hosts=hosts, spare_hosts=["h2"])
    out = bring_up(state)
    assert {e.rank: (e.host, e.data["gpu"]) for e in events(out, "spawn")} == {
        0: ("h0", 0),
        1: ("h0", 1),
        2: ("h1", 0),
        3: ("h1", 1),
    }
    out = lose(state, "h1", 1.0)
    assert sorted((e.rank, e.host, e.data["gpu"]) for e in events(out, "spawn")) == [
        (2, "h2", 0),
        (3, "h2", 1),
    ]
    out = lose(state, "h0", 10.0)
    assert events(out, "moved") == []  # h2 has 2 slots free but no free GPU
    assert {state.procs[f"worker-{r}"].host for r in (0, 1)} == {"h0"}


@pytest.mark.parametrize(
    ("peer", "who"),
    [
        (b"worker:1@0", (1, 0)),
        (b"worker:12@3", (12, 3)),
        (b"worker:1", None),
        (b"worker:1@", None),
        (b"worker:01@0", None),
        (b"worker:1@-1", None),
        (b"worker:1@1@1", None),
        (b"worker:1234567890@0", None),
        (b"join:1@0", None),
    ],
)
def test_worker_identities_name_a_rank_and_an_attempt_in_one_canonical_form(peer, who):
    assert parse_worker_identity(peer) == who
    if who is not None:
        assert worker_identity(*who) == peer


def test_only_the_current_attempt_or_a_retiring_one_counts():
    state = make_state(workers=2, scope="process")
    bring_up(state)
    peers = WorkerPeers(state)
    assert peers.worker_of(b"worker:1@0") == (1, 0) and peers.attempt_counts(1, 0)
    assert peers.worker_of(b"worker:5@0") is None  # no such worker in this job
    state.procs["worker-1"].attempt = 2  # restarted twice since
    assert not peers.attempt_counts(1, 0) and peers.attempt_counts(1, 2)
    assert peers.peer_of(1) == b"worker:1@2"  # no Hello yet: the current attempt
    state.retiring["worker-1"] = ("h1", 1)  # a prewarmed replacement waits to join
    assert peers.attempt_counts(1, 1) and not peers.attempt_counts(1, 0)
    peers.hello(1, b"worker:1@1")
    assert peers.peer_of(1) == b"worker:1@1"


def test_a_worker_identity_seen_before_stops_counting_once_its_rank_leaves_the_job():
    # worker_of remembers how identities parse (every message asks); whether the
    # rank still belongs to the job is asked afresh each time.
    state = make_state(workers=2, scope="process")
    bring_up(state)
    peers = WorkerPeers(state)
    assert peers.worker_of(b"worker:1@0") == (1, 0)
    assert peers.worker_of(b"worker:1@0") == (1, 0)
    del state.procs["worker-1"]
    assert peers.worker_of(b"worker:1@0") is None
    assert peers.worker_of(b"worker:1@x") is None and peers.worker_of(b"worker:1@x") is None


def test_a_new_agent_reporting_nothing_restarts_the_whole_group_instead_of_waiting_forever():
    """Found by the chaos harness (allreduce, supervisor killed 5 times): a new
    agent replaced the one that ran both workers and reported neither. Worker 0's
    loss restarted the group, which sent worker 1 a Kill and waited for its Exited;
    the agent ignored the Kill ("not running") and the job sat for 120 s. A stopping
    process the agent does not report is gone: its stop is done."""
    hosts = [HostSpec(label="h0", hostname="127.0.0.1", slots=2)]
    state = make_state(workers=2, scope="group", hosts=hosts)
    state.start(0.0)
    out = state.agent_hello("h0", 0.1, free_ports=[5000, 5001], host_addr="", procs=[], pid=111)
    for spawn in sent(out, Spawn):
        state.spawned("h0", spawn.proc_id, spawn.attempt, 100, 0.2)
    out = state.agent_hello("h0", 2.0, free_ports=[5000, 5001], host_addr="", procs=[], pid=222)
    assert sorted((s.proc_id, s.attempt) for s in sent(out, Spawn)) == [
        ("worker-0", 1),
        ("worker-1", 1),
    ]
    assert state.phase is Phase.RUNNING


def test_a_spawn_sent_to_an_agent_that_was_replaced_is_retried():
    hosts = [HostSpec(label="h0", hostname="127.0.0.1", slots=2)]
    state = make_state(workers=2, scope="process", hosts=hosts)
    state.start(0.0)
    out = state.agent_hello("h0", 0.1, free_ports=[5000, 5001], host_addr="", procs=[], pid=111)
    assert len(sent(out, Spawn)) == 2  # no Spawned yet: both STARTING
    out = state.agent_hello("h0", 2.0, free_ports=[5000, 5001], host_addr="", procs=[], pid=222)
    assert sorted((s.proc_id, s.attempt) for s in sent(out, Spawn)) == [
        ("worker-0", 1),
        ("worker-1", 1),
    ]


def test_an_agent_seen_to_die_took_its_processes_along_and_nothing_is_recorded_as_fenced():
    state = make_state(workers=2, scope="process", hosts=SPARE_HOSTS, spare_hosts=["h2"])
    bring_up(state)
    state.agent_exited("h1", 1.0, definite=True, detail="killed by SIGKILL")
    out = state.agent_hello("h1", 3.0, free_ports=[9000], host_addr="", procs=[], pid=4242)
    assert events(out, "fenced") == []


def test_a_replacement_whose_predecessor_finished_the_data_is_stopped_and_counts_as_done():
    """Found under load (make test): nd moved a straggler to the spare host, but the
    group reached the end of the data while the replacement still imported torch.
    The old worker exited 0 with the others; the replacement waited for a group
    that was gone, the regroup timed out, and the job lost minutes to restarts
    and the stall bound. Now the replacement is stopped and the job succeeds."""
    hosts = [*HOSTS, HostSpec(label="s0", hostname="127.0.0.9", slots=1, spare=True)]
    state = make_state(workers=3, scope="process", hosts=hosts, spare_hosts=("s0",))
    bring_up(state)
    state.agent_hello("s0", 0.3, free_ports=[5000, 5001], host_addr="", procs=[])
    out = state.replace_prewarmed(1, "s0", "persistent straggler", 1.0)
    [spawn] = sent(out, Spawn)
    assert (spawn.proc_id, spawn.attempt, state.procs["worker-1"].host) == ("worker-1", 1, "s0")
    state.spawned("s0", "worker-1", 1, 300, 1.1)
    for rank in (0, 2):
        state.exited(f"h{rank}", exited(f"worker-{rank}", 0, code=0), 2.0)
    out = state.exited("h1", exited("worker-1", 0, code=0), 2.0)  # the old attempt, by itself
    [stopped] = events(out, "replacement_stopped")
    assert "finished the data before the hand-over" in stopped.data["reason"]
    [kill] = sent(out, Kill)
    assert (kill.proc_id, kill.attempt) == ("worker-1", 1)  # the replacement, on s0
    assert state.phase is Phase.RUNNING
    out = state.exited("s0", exited("worker-1", 1, sig=signal.SIGTERM, requested=True), 2.5)
    assert state.phase is Phase.STOPPING and state.status == "succeeded"
    assert state.failures == []


def test_a_retired_worker_stopped_for_the_hand_over_does_not_stop_its_replacement():
    hosts = [*HOSTS, HostSpec(label="s0", hostname="127.0.0.9", slots=1, spare=True)]
    state = make_state(workers=3, scope="process", hosts=hosts, spare_hosts=("s0",))
    bring_up(state)
    state.agent_hello("s0", 0.3, free_ports=[5000, 5001], host_addr="", procs=[])
    state.replace_prewarmed(1, "s0", "persistent straggler", 1.0)
    state.spawned("s0", "worker-1", 1, 300, 1.1)
    state.retire("worker-1")
    out = state.exited("h1", exited("worker-1", 0, code=0, requested=True), 2.0)
    assert events(out, "replacement_stopped") == [] and sent(out, Kill) == []
    assert state.procs["worker-1"].state is ProcState.RUNNING


def test_a_two_slot_spare_stays_free_for_a_kill_restart_until_both_slots_are_taken():
    """A slow host's two workers move to one two-slot spare one after the other:
    the spare is offered while a slot is free, counting a process moving in."""
    hosts = [
        HostSpec(label="h0", hostname="127.0.0.1", slots=2),
        HostSpec(label="h1", hostname="127.0.0.2", slots=2, spare=True),
        HostSpec(label="h2", hostname="127.0.0.3", slots=1, spare=True),
    ]
    state = make_state(workers=2, scope="process", hosts=hosts, spare_hosts=["h1", "h2"])
    bring_up(state)
    assert state.free_spare_hosts() == ["h1", "h2"]
    state.kill_restart("worker", 0, "slow host h0", 5.0, target_host="h1")
    assert state.procs["worker-0"].host == "h0"  # still stopping, on its way to h1
    assert state.free_spare_hosts() == ["h1", "h2"]  # h1 has a second slot
    state.kill_restart("worker", 1, "slow host h0", 5.5, target_host="h1")
    assert state.free_spare_hosts() == ["h2"]  # both of h1's slots are spoken for


def test_a_process_that_ended_before_its_agent_said_hello_again_is_not_restarted():
    """A resumed supervisor: the workers ran on, and two of them finished their
    data while their agents were still reconnecting. Each agent queued the Exited
    and sent it before its Hello (we answered Rehello); the Hello lists only what
    still runs. The finished workers ended as their Exited says; they are not
    lost processes to start again (a kill loop test saw them restarted)."""
    state = make_state(workers=3, scope="process")
    state.resume(
        0.0, attempts={f"worker-{r}": 0 for r in range(3)}, restarts=[], failures=[], adopt=set()
    )
    running = ProcReport(
        proc_id="worker-1", role="worker", rank=1, attempt=0, pid=101, state="running"
    )
    out = []
    for host in state.agents:
        for rank in (0, 2):
            if state.procs[f"worker-{rank}"].host == host:
                state.heard_before_hello(host, exited(f"worker-{rank}", 0, code=0))
        state.heard_before_hello(host, Shutdown(reason="not an exit: ignored", grace_s=1.0))
        procs = [running] if state.procs["worker-1"].host == host else []
        out += state.agent_hello(host, 1.0, free_ports=[5000], host_addr="", procs=procs)
    assert sent(out, Spawn) == []
    assert events(out, "restart") == []
    assert sorted(e.rank for e in events(out, "adopted")) == [0, 1, 2]
    assert state.procs["worker-0"].state is ProcState.SUCCEEDED
    assert state.procs["worker-2"].state is ProcState.SUCCEEDED
    assert state.procs["worker-1"].state is ProcState.RUNNING

    # Without the early Exited, a process the Hello does not list was lost while
    # the supervisor was down: it starts again under the next attempt.
    state = make_state(workers=3, scope="process")
    state.resume(
        0.0, attempts={f"worker-{r}": 0 for r in range(3)}, restarts=[], failures=[], adopt=set()
    )
    out = []
    for host in state.agents:
        out += state.agent_hello(host, 1.0, free_ports=[5000], host_addr="", procs=[])
    assert sorted(s.rank for s in sent(out, Spawn)) == [0, 1, 2]
    assert {e.data["reason"] for e in events(out, "restart")} == {
        "lost while the supervisor was down"
    }
