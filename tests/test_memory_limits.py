"""Per-process limits on the supervisor's side (issue 16): the first limits from
the options and the hostfile, and an out-of-memory death relaunched with twice
the memory up to its bounds; driven with a fake clock, no processes."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from dtlaunch.config import JobSpec
from dtlaunch.errors import ConfigError
from dtlaunch.events import Event, JsonlEventLog
from dtlaunch.hostfile import HostSpec
from dtlaunch.quantities import format_size, parse_size
from dtlaunch.supervisor.history import load_history
from dtlaunch.supervisor.jobstate import LimitRules
from dtlaunch.supervisor.jobstate.machine import JobState, Phase
from dtlaunch.supervisor.status.fold import StatusFold
from dtlaunch.supervisor.status.tracker import StatusTracker
from dtlaunch.ui.plots import plot_data
from dtlaunch.wire.messages import ProcReport, Spawn
from tests.test_jobstate import events, exited, make_state, sent

G = 1 << 30
M = 1 << 20


def test_sizes_read_binary_units_and_refuse_what_is_not_a_size():
    assert parse_size("64G") == 64 * G
    assert parse_size("512m") == 512 * M
    assert parse_size("1.5GiB") == 3 * G // 2
    assert parse_size("4096") == 4096
    for bad in ("", "G", "12X", "1.5", "-3G", "1e9"):
        with pytest.raises(ValueError, match="expected a size such as"):
            parse_size(bad)
    assert format_size(3 * G) == "3.0 GiB"
    assert format_size(512) == "512 B"


def test_first_limits_come_from_the_options_else_the_host_over_its_slots():
    rules = LimitRules(
        host_memory={"big": 64 * G}, host_cpus={"big": 16.0}, host_slots={"big": 4, "bare": 2}
    )
    assert (rules.first_memory("big"), rules.first_cpus("big")) == (16 * G, 4.0)
    assert (rules.first_memory("bare"), rules.first_cpus("bare")) == (0, 0.0)
    given = LimitRules(memory_limit=2 * G, cpu_limit=0.5, host_memory={"big": 64 * G})
    assert (given.first_memory("big"), given.first_cpus("big")) == (2 * G, 0.5)


def test_an_oom_doubles_the_limit_up_to_the_host_and_then_fails_with_the_numbers():
    rules = LimitRules(oom_relaunches=5, host_memory={"h": 5 * G})
    ask = dict(proc_id="worker-0", host="h", relaunches=0, measured_host_memory=0)
    assert rules.after_oom(limit=G, **ask).new_limit == 2 * G
    assert rules.after_oom(limit=3 * G, **ask).new_limit == 5 * G  # capped, not 6 G
    at_top = rules.after_oom(limit=5 * G, **ask)
    assert at_top.new_limit == 0
    assert "5.0 GiB" in at_top.error and "mem=" in at_top.error
    # Undeclared memory: the agent's measurement bounds it; --memory-max bounds both.
    undeclared = LimitRules(oom_relaunches=5, memory_max=3 * G)
    ask = dict(proc_id="worker-0", host="x", relaunches=0, measured_host_memory=8 * G)
    assert undeclared.after_oom(limit=2 * G, **ask).new_limit == 3 * G
    assert "--memory-max" in undeclared.after_oom(limit=3 * G, **ask).error
    used_up = LimitRules(oom_relaunches=2).after_oom(
        proc_id="server-1", host="x", limit=G, relaunches=2, measured_host_memory=0
    )
    assert used_up.new_limit == 0 and "--oom-relaunches 2" in used_up.error


HOSTS = [HostSpec(label=f"h{i}", hostname=f"127.0.0.{i + 1}", slots=1) for i in range(2)]


def limited_state(rules: LimitRules, *, scope="group", max_restarts=5, workers=2) -> JobState:
    return make_state(
        workers=workers, scope=scope, max_restarts=max_restarts, hosts=HOSTS, limits=rules
    )


def up(state: JobState, memory_bytes: int = 0):
    out = state.start(0.0)
    for host in state.agents:
        out += state.agent_hello(
            host, 0.1, free_ports=[5000], host_addr="", procs=[], memory_bytes=memory_bytes
        )
    for spawn in sent(out, Spawn):
        out += state.spawned(state.procs[spawn.proc_id].host, spawn.proc_id, spawn.attempt, 7, 0.2)
    return out


def oom_killed(proc_id: str, attempt: int):
    return replace(exited(proc_id, attempt, sig=signal.SIGKILL), oom_killed=True)


def respawned(state: JobState, out, now: float):
    """Answer the group restart's kills, then return the new Spawns."""
    for slot in list(state.procs.values()):
        if slot.restart_after_stop:
            out += state.exited(slot.host, exited(slot.proc_id, slot.attempt, requested=True), now)
    return sent(out, Spawn)


def test_an_oom_killed_worker_restarts_with_twice_the_memory_and_the_event_says_so():
    state = limited_state(LimitRules(memory_limit=256 * M, cpu_limit=0.5))
    first = sent(up(state), Spawn)
    assert {(s.memory_limit, s.cpu_limit) for s in first} == {(256 * M, 0.5)}
    out = state.exited("h1", oom_killed("worker-1", 0), 5.0)
    [change] = events(out, "memory_limit")
    assert (change.data["old"], change.data["new"], change.data["relaunch"]) == (
        256 * M,
        512 * M,
        1,
    )
    [failure] = events(out, "failure")
    assert failure.data["reason"] == "out of memory" and failure.data["retryable"]
    spawns = {s.proc_id: s for s in respawned(state, out, 6.0)}
    # Allreduce: the group restarts; only the one that ran out gets more memory.
    assert spawns["worker-1"].memory_limit == 512 * M
    assert spawns["worker-0"].memory_limit == 256 * M
    assert state.phase is Phase.RUNNING


def test_a_memory_error_under_an_address_space_limit_counts_as_running_out():
    state = limited_state(LimitRules(memory_limit=256 * M), scope="process")
    up(state)
    tail = ["Traceback (most recent call last):", '  File "train.py", line 3', "MemoryError"]
    out = state.exited("h0", exited("worker-0", 0, code=1, tail=tail), 5.0)
    assert [e.data["reason"] for e in events(out, "memory_limit")] == ["MemoryError"]
    assert [s.memory_limit for s in sent(out, Spawn)] == [512 * M]
    # The same MemoryError at the same line is no crash loop: the limit differs.
    out = state.exited("h0", exited("worker-0", 1, code=1, tail=tail, runtime=1.0), 6.0)
    assert [s.memory_limit for s in sent(out, Spawn)] == [1024 * M]


def test_running_out_at_the_hosts_memory_fails_the_job_with_the_numbers():
    state = limited_state(LimitRules(memory_limit=3 * G), scope="process")
    up(state, memory_bytes=4 * G)  # the agents measured 4 GiB hosts
    out = state.exited("h0", oom_killed("worker-0", 0), 5.0)
    assert [s.memory_limit for s in sent(out, Spawn)] == [4 * G]
    out = state.exited("h0", oom_killed("worker-0", 1), 9.0)
    [failure] = events(out, "failure")
    assert not failure.data["retryable"]
    assert "ran out of memory at 4.0 GiB, already the memory of h0" in failure.data["error"]
    assert state.phase is Phase.STOPPING and sent(out, Spawn) == []


def test_an_oom_kill_without_a_limit_is_an_ordinary_retryable_failure():
    state = limited_state(LimitRules(), scope="process")
    up(state)
    out = state.exited("h0", oom_killed("worker-0", 0), 5.0)
    assert events(out, "memory_limit") == []
    assert [e.data["reason"] for e in events(out, "failure")] == ["oom-kill"]
    assert [s.memory_limit for s in sent(out, Spawn)] == [0]


def test_a_resumed_supervisor_keeps_the_raised_limit(tmp_path):
    log = JsonlEventLog(tmp_path / "events.jsonl")
    for kind, data in [
        ("spawn", {"attempt": 0, "memory_limit": 256 * M}),
        ("memory_limit", {"old": 256 * M, "new": 512 * M, "relaunch": 1}),
    ]:
        log.emit(Event(kind=kind, mono=1.0, wall=1.0, role="worker", rank=1, host="h1", data=data))
    log.close()
    history = load_history(tmp_path / "events.jsonl")
    assert history.memory_limits == {"worker-1": (512 * M, 1)}
    state = limited_state(LimitRules(memory_limit=256 * M, oom_relaunches=1), scope="process")
    state.resume(
        0.0,
        attempts=history.attempts,
        restarts=[],
        failures=[],
        adopt=set(),
        memory_limits=history.memory_limits,
    )
    assert state.procs["worker-1"].memory_limit == 512 * M
    assert state.procs["worker-0"].memory_limit == 256 * M
    assert state.procs["worker-1"].oom_relaunches == 1  # its one relaunch is spent


def test_the_options_refuse_limits_that_cannot_work(tmp_path):
    def spec(**kw):
        return JobSpec(run_id="r", run_dir=tmp_path, script="t.py", **kw).validate()

    with pytest.raises(ConfigError, match="too small to start Python"):
        spec(memory_limit=M)
    with pytest.raises(ConfigError, match="--memory-max"):
        spec(memory_limit=2 * G, memory_max=G)
    with pytest.raises(ConfigError, match="--cpu-limit"):
        spec(cpu_limit=-1.0)
    with pytest.raises(ConfigError, match="below the kernel's least CPU quota"):
        spec(cpu_limit=0.005)
    assert spec(cpu_limit=0.01).cpu_limit == 0.01
    crowded = HostSpec(label="n", hostname="n", slots=4, memory_bytes=128 * M)
    with pytest.raises(ConfigError, match="less than 64M per process on n"):
        spec(hosts=(crowded,))


def test_status_shows_each_process_use_beside_its_limits():
    state = limited_state(LimitRules(memory_limit=256 * M, cpu_limit=1.5))
    up(state)
    report = ProcReport(
        proc_id="worker-1", role="worker", rank=1, attempt=0, pid=7, state="running",
        rss_bytes=200 * M, cpu_percent=140.0,
    )  # fmt: skip
    state.heartbeat("h1", 1.0, [report])
    tracker = StatusTracker(run_id="r", policy="none", mode="allreduce", clock=lambda: 0.0)
    snap = tracker.snapshot(state=state, dds=None, controller=None, now=2.0)
    nodes = {(n.role, n.rank): n for n in snap.nodes}
    worker1, worker0 = nodes["worker", 1], nodes["worker", 0]
    assert (worker1.memory_bytes, worker1.memory_limit) == (200 * M, 256 * M)
    assert (worker1.cpu_percent, worker1.cpu_limit) == (140.0, 1.5)
    assert (worker0.memory_bytes, worker0.memory_limit) == (0, 256 * M)  # no report yet


def test_each_running_process_use_is_sampled_into_the_event_log_for_replay():
    state = limited_state(LimitRules(memory_limit=256 * M))
    up(state)
    report = ProcReport(
        proc_id="worker-1", role="worker", rank=1, attempt=0, pid=7, state="running",
        rss_bytes=200 * M, cpu_percent=140.0,
    )  # fmt: skip
    for now in (1.0, 5.0):
        state.agent_seen("h0", now)
        state.heartbeat("h1", now, [report])
    [sample] = events(state.tick(15.0), "resources")
    assert sample.data == {"procs": {"worker-1": [200 * M, 140.0, 256 * M]}}  # none yet from 0
    state.agent_seen("h0", 20.0)
    state.agent_seen("h1", 20.0)
    assert events(state.tick(20.0), "resources") == []  # every 15 s, not every tick
    # A restarted process's figures are its new attempt's, not the old one's.
    out = state.exited("h1", oom_killed("worker-1", 0), 21.0)
    assert state.procs["worker-1"].rss_bytes == 0 and events(out, "memory_limit")

    plotted = plot_data([
        Event(kind="resources", mono=15.0, wall=100.0, data=sample.data),
        Event(kind="resources", mono=30.0, wall=115.0,
              data={"procs": {"worker-1": [300 * M, 90.0, 512 * M]}}),
    ])  # fmt: skip
    assert plotted.memory is not None and plotted.memory_limit is not None
    assert plotted.cpu is not None
    memory = plotted.memory["worker-1"]
    assert (memory.xs, memory.ys) == ([0.0, 15.0], [200.0, 300.0])
    assert plotted.memory_limit["worker-1"].ys == [256.0, 512.0]
    assert plotted.cpu["worker-1"].ys == [1.4, 0.9]


def test_status_from_the_event_log_shows_the_latest_resource_sample():
    fold = StatusFold(run_id="r", policy="none", mode="allreduce")
    for at, rss in ((15.0, 100 * M), (30.0, 180 * M)):
        data = {"procs": {"worker-0": [rss, 95.0, 256 * M], "bogus": [1, 2, 3]}}
        fold.emit(Event(kind="resources", mono=at, wall=at, data=data))
    [node] = fold.snapshot(now=31.0, source="events", stragglers={}).nodes
    assert (node.role, node.rank, node.memory_bytes, node.memory_limit) == (
        "worker", 0, 180 * M, 256 * M,
    )  # fmt: skip
    assert node.cpu_percent == 95.0


def test_a_process_moved_to_another_host_gets_that_hosts_share_of_its_cores():
    """auto moves a hot server to a spare host so that it gets more CPU: its
    limit must be the spare's share, not the one it had where it came from."""
    hosts = [*HOSTS, HostSpec(label="spare", hostname="127.0.0.9", slots=1, spare=True)]
    rules = LimitRules(
        host_cpus={"h0": 1.0, "h1": 1.0, "spare": 2.0},
        host_memory={"h0": 2 * G, "h1": 2 * G, "spare": 8 * G},
        host_slots={"h0": 4, "h1": 1, "spare": 1},
    )
    state = make_state(workers=2, hosts=hosts, spare_hosts=["spare"], limits=rules)
    up(state)
    slot = state.procs["worker-0"]
    assert (slot.cpu_limit, slot.memory_limit) == (0.25, G // 2)
    [spawn] = sent(state.replace_prewarmed(0, "spare", "slow", 1.0), Spawn)
    assert spawn.proc_id == "worker-0"
    assert (spawn.cpu_limit, spawn.memory_limit) == (2.0, 8 * G)
