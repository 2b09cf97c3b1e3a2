"""The status snapshot: event fold, live tracker, Monitor stragglers, wire form."""

from __future__ import annotations

import os

import msgpack
import pytest

from dtlaunch.errors import RunDirError, WireError
from dtlaunch.events import Event, EventRecorder
from dtlaunch.supervisor.control.controller import Controller
from dtlaunch.supervisor.control.monitor import Monitor
from dtlaunch.supervisor.control.policies import parse_policy
from dtlaunch.supervisor.jobstate.machine import EmitEvent
from dtlaunch.supervisor.status.fold import StatusFold, lambda_of
from dtlaunch.supervisor.status.nodetrack import SPARK_POINTS, BptPoint
from dtlaunch.supervisor.status.tracker import StatusTracker, monitor_stragglers
from dtlaunch.ui.status_model import find_newest_run, open_run
from dtlaunch.wire.codec import decode, encode
from dtlaunch.wire.messages import (
    NodeStatus,
    StatusReply,
    StatusRequest,
    StatusSnapshot,
    StepReport,
    StepReports,
)
from tests.test_jobstate import bring_up, make_state


def ev(kind, mono, role="", rank=-1, host="", **data):
    return Event(
        kind=kind, mono=mono, wall=1000.0 + mono, host=host, role=role, rank=rank, data=data
    )


def reports(rank, at, *, step_s, batch=10, n=5, injected=0.0):
    return ev(
        "reports",
        at,
        role="worker",
        rank=rank,
        step=list(range(n)),
        batch_size=[batch] * n,
        compute_s=[step_s] * n,
        comm_s=[0.0] * n,
        samples=[batch] * n,
        injected_s=[injected] * n,
        t=[at - (n - 1 - i) * step_s for i in range(n)],
    )


def job_events():
    """Three workers, worker 2 three times slower, an ADJUST_BS, a KILL_RESTART, the end."""
    out = [ev("job_start", 0.0, run_id="r1", mode="ps", workers=3, servers=1)]
    for rank in range(3):
        out.append(ev("spawn", 0.1, role="worker", rank=rank, host=f"h{rank}", attempt=0))
        out.append(ev("running", 0.2, role="worker", rank=rank, host=f"h{rank}", attempt=0))
    done = 0
    for second in range(1, 21):
        for rank in range(3):
            slow = rank == 2
            out.append(
                reports(rank, float(second), step_s=0.3 if slow else 0.1, injected=0.2 * slow)
            )
        done += 2
        out.append(
            ev("shards_done", float(second), role="worker", rank=second % 2, count=2,
               done=done, total=100)
        )  # fmt: skip
    out.append(
        ev("decision", 10.0, policy="nd", action="ADJUST_BS", reason="transient straggler worker 2",
           sizes={"0": 13, "1": 13, "2": 4}, apply_at_step=30,
           inputs={"current_sizes": {"0": 10, "1": 10, "2": 10}})
    )  # fmt: skip
    out.append(
        ev("decision", 15.0, role="worker", rank=2, policy="nd", action="KILL_RESTART",
           reason="persistent straggler: worker 2 is 2.5x", target_host=None)
    )  # fmt: skip
    out.append(ev("kill_restart", 15.0, role="worker", rank=2, host="h2", reason="x", attempt=0))
    out.append(ev("restart", 15.5, role="worker", rank=2, host="h2", reason="x", attempt=1))
    out.append(ev("running", 16.0, role="worker", rank=2, host="h2", attempt=1))
    return out


def test_fold_of_a_job_gives_nodes_progress_stragglers_and_actions():
    fold = StatusFold(policy="nd:lambda=1.5")
    fold.emit_all(job_events())
    stragglers = fold.ratio_stragglers(1.5, running_only=True)
    assert set(stragglers) == {("worker", 2)}
    assert "x the fastest BPT" in stragglers["worker", 2]
    snap = fold.snapshot(now=20.0, source="live", stragglers=stragglers)
    assert (snap.run_id, snap.mode, snap.phase) == ("r1", "ps", "running")
    assert (snap.shards_done, snap.shards_total) == (40, 100)
    # 2 shards a second, 60 left: about 30 s at the recent rate.
    assert snap.eta_s == pytest.approx(30.0, rel=0.1)
    workers = {n.rank: n for n in snap.nodes if n.role == "worker"}
    assert [n.role for n in snap.nodes] == ["worker"] * 3 + ["server"]  # workers first
    assert workers[0].bpt_s == pytest.approx(0.1)
    assert workers[2].bpt_s == pytest.approx(0.3)
    assert workers[0].throughput == pytest.approx(100.0)  # 10 samples per 0.1 s
    assert len(workers[0].recent_bpt_s) == 20
    assert (workers[2].restarts, workers[2].proc_state, workers[2].host) == (1, "running", "h2")
    assert "injected 0.2 s/step" in workers[2].straggler
    assert "KILL_RESTART at 15 s" in workers[2].straggler
    assert workers[0].straggler == ""
    assert workers[0].shards_done + workers[1].shards_done == 40
    # The job trains 3 x 50 samples a second, whatever each worker could do alone
    # (100 + 100 + 33 samples/s of step time): the header counts wall time.
    assert snap.throughput == pytest.approx(150.0)
    actions = [(a.action, a.target) for a in snap.actions]
    assert actions == [("ADJUST_BS", "w0=13 w1=13 w2=4"), ("KILL_RESTART", "worker 2")]
    assert snap.actions[1].reason.startswith("persistent straggler")


def test_fold_ratios_use_only_the_current_process_and_end_state_comes_from_job_end():
    fold = StatusFold()
    fold.emit_all(job_events())
    # Restarted once more, worker 2 is judged on its new process's steps only.
    fold.emit(ev("restart", 20.5, role="worker", rank=2, host="h2", reason="x", attempt=2))
    fold.emit(ev("running", 21.0, role="worker", rank=2, host="h2", attempt=2))
    assert fold.ratio_stragglers(1.5, running_only=True) == {}  # no steps of its own yet
    fold.emit(ev("reports", 21.5, role="worker", rank=2, step=[0], batch_size=[10],
                 compute_s=[0.1], comm_s=[0.0], samples=[10], t=[16.5]))  # fmt: skip
    assert fold.ratio_stragglers(1.5, running_only=True) == {}
    fold.emit(ev("exit", 20.0, role="worker", rank=0, host="h0", exit_code=0, requested=False))
    fold.emit(ev("exit", 20.0, role="worker", rank=1, host="h1", exit_code=1, requested=False))
    fold.emit(ev("decision", 20.5, status="failed", reason="worker 1 failed"))
    fold.emit(ev("job_end", 21.0, status="failed", reason="worker 1 failed"))
    snap = fold.snapshot(now=21.0, source="events", stragglers={})
    states = {n.rank: n.proc_state for n in snap.nodes if n.role == "worker"}
    assert states == {0: "succeeded", 1: "failed", 2: "running"}
    assert (snap.phase, snap.status, snap.eta_s) == ("done", "failed", None)
    assert snap.actions[-1].action == "END"
    assert snap.actions[-1].target == "failed"


def test_fold_skips_malformed_reports_and_bounds_its_memory():
    fold = StatusFold()
    fold.emit(ev("reports", 1.0, role="worker", rank=0, compute_s="x"))
    fold.emit(ev("reports", 1.0, role="worker", rank=0, compute_s=[0.1], batch_size=[]))
    assert fold.nodes[("worker", 0)].points == type(fold.nodes[("worker", 0)].points)()
    for i in range(500):
        fold.emit(reports(0, float(i), step_s=0.1))
        fold.emit(ev("decision", float(i), action="NONE", reason="nothing"))
    assert len(fold.nodes[("worker", 0)].points) == SPARK_POINTS
    assert len(fold.actions) <= 20


def test_many_nodes_still_fit_one_wire_frame():
    fold = StatusFold(run_id="big")
    point = BptPoint(
        t=1.0, bpt=0.1, compute_per_sample=0.01, comm=0.0, samples=10, busy_s=0.1, injected_s=0.0
    )
    for rank in range(5000):
        fold.node("worker", rank).points.extend([point] * SPARK_POINTS)
    snap = fold.snapshot(now=50.0, source="live", stragglers={})
    reply = StatusReply(request_id=1, snapshot=snap)
    assert decode(encode(reply)) == reply
    assert 4 <= len(snap.nodes[0].recent_bpt_s) < SPARK_POINTS


def test_lambda_of_reads_the_policy_parameter():
    assert lambda_of("nd:lambda=2.0,l_trans=5") == 2.0
    assert lambda_of("nd") == 1.5
    assert lambda_of("none") == 1.5
    assert lambda_of("nd:lambda=oops") == 1.5


def test_monitor_stragglers_transient_then_persistent():
    monitor = Monitor(l_trans=2.0, l_per=6.0)
    for i in range(70):
        now = i * 0.1
        for rank in range(3):
            step_s = 0.3 if rank == 1 else 0.1
            monitor.report_worker(
                rank, now=now, step=i, batch_size=10, compute_s=step_s, comm_s=0.0, samples=10
            )
        if i == 25:
            early = monitor_stragglers(monitor.snapshot(now), 1.5)
    assert set(early) == {("worker", 1)}
    assert early["worker", 1].startswith("transient straggler: 3.0x")
    late = monitor_stragglers(monitor.snapshot(6.9), 1.5)
    assert late["worker", 1].startswith("persistent straggler: 3.0x the fastest BPT over 6 s")
    assert monitor_stragglers(monitor.snapshot(6.9), 3.5) == {}


def test_live_tracker_combines_node_table_controller_and_events():
    state = make_state(workers=3)
    policy = "nd:l_trans=2,l_per=6"
    tracker = StatusTracker(run_id="r1", policy=policy, mode="ps", clock=lambda: 0.0)
    recorder = EventRecorder([tracker], monotonic=lambda: 0.0, wall=lambda: 0.0)
    recorder.emit("job_start", run_id="r1", mode="ps", workers=3, servers=0)
    for command in bring_up(state):
        if isinstance(command, EmitEvent):
            recorder.emit(command.kind, host=command.host, role=command.role,
                          rank=command.rank, **command.data)  # fmt: skip
    controller = Controller(parse_policy("nd:l_trans=2,l_per=6"), interval=1.0, spare_hosts=[])
    for i in range(30):
        for rank in range(3):
            compute = 0.4 if rank == 0 else 0.1
            step = StepReport(step=i, batch_size=10, samples=10, compute_s=compute)
            controller.observe(rank, StepReports.of([step]), 1.0 + i * 0.1)
    state.procs["worker-1"].unresponsive = True
    assert tracker.snapshot(state=state, dds=None, controller=controller, now=4.0).plan == ""
    # The policy's latest reading, an action or why it holds, is the status's plan.
    [restart] = controller.decide(4.0, remaining_steps=100)
    snap = tracker.snapshot(state=state, dds=None, controller=controller, now=4.0)
    assert snap.plan == controller.plan == restart.reason != ""
    assert (snap.source, snap.phase, snap.shards_total) == ("live", "running", 0)
    assert snap.elapsed_s == 4.0
    nodes = {n.rank: n for n in snap.nodes}
    assert {n.host for n in snap.nodes} == {"h0", "h1", "h2"}
    assert nodes[1].proc_state == "unresponsive"
    assert nodes[0].straggler.startswith("transient straggler")
    assert nodes[1].straggler == nodes[2].straggler == ""
    reply = tracker.reply(
        StatusRequest(request_id=7, run_id="r1"), state=state, dds=None, controller=controller,
        now=4.0,
    )  # fmt: skip
    assert reply is not None and reply.request_id == 7
    assert decode(encode(reply)) == reply
    other = StatusRequest(request_id=8, run_id="another-run")
    assert tracker.reply(other, state=state, dds=None, controller=None, now=4.0) is None


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"shards_done": -1}, "out of range"),
        ({"phase": "exploding"}, "is not one of"),
        ({"source": "rumour"}, "is not one of"),
        ({"eta_s": -5.0}, "out of range"),
        ({"surprise": 1}, "unknown field"),
        ({"nodes": [{"role": "agent", "rank": 0, "host": "h", "proc_state": "x"}]}, "is not one"),
    ],
)
def test_codec_validates_status_replies_strictly(change, complaint):
    good = StatusReply(
        request_id=1,
        snapshot=StatusSnapshot(
            run_id="r", policy="nd", mode="ps", phase="running", source="live",
            nodes=[NodeStatus(role="worker", rank=0, host="h", proc_state="running")],
        ),
    )  # fmt: skip
    plain = msgpack.unpackb(encode(good))
    plain["snapshot"].update(change)
    with pytest.raises(WireError, match=complaint):
        decode(msgpack.packb(plain))


def test_run_dir_errors_name_the_fix(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        open_run(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="not a directory"):
        open_run(tmp_path / "file")
    with pytest.raises(RunDirError, match="not a dtlaunch run directory"):
        open_run(tmp_path)
    with pytest.raises(RunDirError, match="pass RUN_DIR"):
        find_newest_run(tmp_path / "runs")
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(RunDirError, match="holds no run directory"):
        find_newest_run(runs)
    for name, mtime in (("b-old", 100), ("a-new", 200)):
        (runs / name).mkdir()
        (runs / name / "job.json").write_text("{}")
        os.utime(runs / name / "job.json", (mtime, mtime))
    assert find_newest_run(runs) == runs / "a-new"


def test_a_servers_update_times_are_its_bpt_in_the_status():
    fold = StatusFold(policy="nd")
    fold.emit_all(job_events())
    fold.emit(ev("server_reports", 18.0, role="server", rank=0, version=[5, 6],
                 update_s=[0.3, 0.5], injected_s=[0.25, 0.25], t=[17.5, 18.0]))  # fmt: skip
    fold.emit(ev("server_reports", 18.0, role="server", rank=0, update_s="garbage"))
    snap = fold.snapshot(now=19.0, source="live", stragglers={})
    [server] = [n for n in snap.nodes if n.role == "server"]
    assert server.bpt_s == pytest.approx(0.4) and server.recent_bpt_s == [0.4]
    assert server.throughput == 0.0  # a server trains no samples


def test_a_straggler_moved_to_a_spare_host_names_both_hosts():
    events = job_events()
    for e in events:
        if e.data.get("action") == "KILL_RESTART":
            e.data["target_host"] = "spare1"
    events += [ev("running", 16.5, role="worker", rank=2, host="spare1", attempt=1)]
    fold = StatusFold(policy="nd:lambda=1.5")
    fold.emit_all(events)
    snap = fold.snapshot(now=17.0, source="live", stragglers={("worker", 2): "persistent"})
    [moved] = [n for n in snap.nodes if n.role == "worker" and n.rank == 2]
    assert moved.host == "spare1"
    assert moved.straggler.endswith("KILL_RESTART at 15 s from h2 onto spare1")


def test_a_drained_server_leaves_the_table_and_a_replaced_process_does_not_mark_its_rank():
    events = [ev("job_start", 0.0, run_id="r1", mode="ps", workers=2, servers=2)]
    for role, rank in (("worker", 0), ("worker", 1), ("server", 0), ("server", 1)):
        events.append(ev("running", 0.2, role=role, rank=rank, host=f"h{rank}", attempt=0))
    # Worker 1 is replaced by a prewarmed process on a spare host: the old one's
    # exit comes after the new one runs.
    events += [
        ev("spawn", 5.0, role="worker", rank=1, host="spare", attempt=1),
        ev("running", 5.1, role="worker", rank=1, host="spare", attempt=1),
        ev("exit", 6.0, role="worker", rank=1, host="h1", exit_code=None, signal=15, retired=True),
        # A scale-in drains server 1: removed, then its process exits.
        ev("removed", 7.0, role="server", rank=1, host="h1", attempt=0),
        ev("exit", 7.5, role="server", rank=1, host="h1", exit_code=0, signal=None, retired=True),
    ]
    fold = StatusFold(policy="none")
    fold.emit_all(events)
    snap = fold.snapshot(now=8.0, source="events", stragglers={})
    rows = {(n.role, n.rank): (n.proc_state, n.host) for n in snap.nodes}
    assert rows == {
        ("worker", 0): ("running", "h0"),
        ("worker", 1): ("running", "spare"),
        ("server", 0): ("running", "h0"),
    }
