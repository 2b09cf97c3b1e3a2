"""A parameter server's live move in JobState (fake clock, no processes): ports
that stay put, a move given up before the hand-over, and the old server dying
before it handed its blocks over."""

from __future__ import annotations

import signal

from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.jobstate.machine import JobState, ProcState
from dtlaunch.supervisor.placement import place
from dtlaunch.wire.messages import Kill, Spawn
from tests.test_jobstate import TIMING, exited, sent

PORTS = [5000 + i for i in range(8)]


def make_state() -> JobState:
    hosts = [
        HostSpec(label="h0", hostname="127.0.0.1", slots=4, servers=2),
        HostSpec(label="s1", hostname="127.0.0.9", slots=1, spare=True),
    ]

    def build_spawn(slot, addr, port):
        return Spawn(proc_id=slot.proc_id, role=slot.role, rank=slot.rank,
                     attempt=slot.attempt, argv=["x"], env={}, cwd="/")  # fmt: skip

    return JobState(
        place(hosts, workers=2, servers=2),
        timing=TIMING,
        max_restarts=3,
        restart_scope="process",
        build_spawn=build_spawn,
        master_addr_of=lambda label, reported: label + "-addr",
        builtin_ps=True,
        spare_hosts=["s1"],
    )


def up(state: JobState) -> None:
    out = state.start(0.0)
    for host in state.agents:
        out += state.agent_hello(host, 0.1, free_ports=PORTS, host_addr="", procs=[])
    for spawn in sent(out, Spawn):
        out += state.spawned(state.procs[spawn.proc_id].host, spawn.proc_id, spawn.attempt, 9, 0.2)


def test_a_moving_server_does_not_shift_the_port_of_the_one_left_behind():
    state = make_state()
    up(state)
    before = [state.server_endpoint(r) for r in (0, 1)]
    assert before == ["tcp://h0-addr:5002", "tcp://h0-addr:5003"]
    out = state.replace_server(0, "s1", "slow", 1.0)
    assert [(s.proc_id, s.attempt) for s in sent(out, Spawn)] == [("server-0", 1)]
    assert state.server_endpoint(0) == "tcp://s1-addr:5002"
    assert state.server_endpoint(1) == before[1]  # the old code shifted it to 5002
    assert state.free_spare_hosts() == []  # server 0 runs there now


def test_a_move_given_up_before_the_hand_over_leaves_the_old_server_in_charge():
    state = make_state()
    up(state)
    state.replace_server(0, "s1", "x", 1.0)
    state.spawned("s1", "server-0", 1, 10, 1.5)
    out = state.abort_server_move(0, 2.0)
    assert [(k.proc_id, k.attempt) for k in sent(out, Kill)] == [("server-0", 1)]
    slot = state.procs["server-0"]
    assert (slot.host, slot.attempt, slot.state) == ("h0", 0, ProcState.RUNNING)
    assert state.server_endpoint(0) == "tcp://h0-addr:5002"
    # The killed fresh server's exit is no concern of the slot any more...
    assert state.exited("s1", exited("server-0", 1, sig=signal.SIGTERM, requested=True), 2.5) == []
    # ...and a later move never reuses its attempt number.
    out = state.replace_server(0, "s1", "x", 3.0)
    assert [(s.proc_id, s.attempt) for s in sent(out, Spawn)] == [("server-0", 2)]


def test_the_old_server_dying_before_the_hand_over_is_restarted_where_it_was():
    state = make_state()
    up(state)
    state.replace_server(0, "s1", "slow", 1.0)
    out = state.exited("h0", exited("server-0", 0, sig=signal.SIGKILL), 2.0)
    assert [(k.proc_id, k.attempt) for k in sent(out, Kill)] == [("server-0", 1)]  # the fresh one
    respawn = [(s.proc_id, s.attempt) for s in sent(out, Spawn)]
    assert respawn == [("server-0", 2)] and state.procs["server-0"].host == "h0"
    assert state.failures[-1].reason == "killed by SIGKILL"


def test_after_the_hand_over_the_old_servers_exit_is_a_retirement():
    state = make_state()
    up(state)
    state.replace_server(0, "s1", "slow", 1.0)
    state.server_handed_over(0)
    out = state.retire("server-0")
    assert [(k.proc_id, k.attempt) for k in sent(out, Kill)] == [("server-0", 0)]
    out = state.exited("h0", exited("server-0", 0, sig=signal.SIGTERM, requested=True), 3.0)
    assert sent(out, Spawn) == [] and state.procs["server-0"].host == "s1"
    assert state.failures == []
