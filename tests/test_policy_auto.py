"""``--policy auto`` (DLRover §4.2) with a fake clock: sample, optimize by eq.
10-11, grow while idle servers help, stop when growth stops paying, move a hot
server; every decision with its inputs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dtlaunch.config import JobSpec
from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.control.actions import (
    KillRestart,
    NoAction,
    ScaleServers,
    ScaleWorkers,
    action_name,
)
from dtlaunch.supervisor.control.loop import job_resources
from dtlaunch.supervisor.control.monitor import JobResources, Monitor, ProcessUse
from dtlaunch.supervisor.control.policies import AutoPolicy, parse_policy
from dtlaunch.supervisor.jobstate.limits import LimitRules
from tests.test_jobstate import bring_up, exited, make_state
from tests.test_policies import run

PARAMS = {"sample_s": "10", "interval_s": "20", "l_trans": "5", "l_per": "10"}


def resources(workers, *, worker_cores=0.5, server_cores=0.4, server_limit=2.0,
              host_cores=None, free=8):  # fmt: skip
    """``workers`` running workers using ``worker_cores`` each; one server using
    ``server_cores`` of its ``server_limit``; 8 cores declared in all."""
    use = lambda cores, limit: ProcessUse(host="h", cpu_cores=cores, cpu_limit=limit,  # noqa: E731
                                          rss_bytes=1 << 20, memory_limit=0)  # fmt: skip
    return JobResources(
        workers={r: use(worker_cores, 1.0) for r in range(workers)},
        servers={0: use(server_cores, server_limit)},
        host_cores=host_cores or {"h": 8.0},
        free_worker_slots=free,
    )


class Feed:
    """A Monitor fed one step a second by ``workers`` workers up to each decision."""

    def __init__(self, workers=1):
        self.mon = Monitor(l_trans=5, l_per=10)
        self.workers = workers
        self.bpt = 0.1  # every worker's step time
        self.t = 0.0
        self.step = 0

    def until(self, now):
        if now >= self.t:
            bpts = {r: self.bpt for r in range(self.workers)}
            self.step = run(self.mon, bpts, start=self.t, end=now, step0=self.step)
            self.t = float(int(now)) + 1.0
        return self.mon


def decide(pol, feed, now, res, **snap_fields):
    mon = feed.until(now)
    snap = dataclasses.replace(mon.snapshot(now), resources=res, **snap_fields)
    actions = pol.decide(snap)
    assert len(actions) == 1
    return actions[0]


def test_sample_then_optimize_by_eq_10_with_the_servers_bound():
    pol = AutoPolicy(PARAMS)
    mon = Feed(1)
    # One worker: w = 0.5 cores, the servers 0.4 (s = 0.4); 8 cores declared.
    first = decide(pol, mon, 5.0, resources(1))
    assert isinstance(first, NoAction) and "sampling" in first.reason
    assert isinstance(decide(pol, mon, 10.0, resources(1)), NoAction)
    plan = decide(pol, mon, 15.1, resources(1))
    assert isinstance(plan, ScaleWorkers)
    # eq. 10: 8 / 0.9 = 8.9 -> 8, but the server's 2 cores feed 2 / 0.4 = 5 workers.
    assert plan.count == 5
    assert plan.inputs["model_workers"] == pytest.approx(8.889, abs=1e-3)
    assert plan.inputs["bound"] == "servers"
    assert plan.inputs["w_hat"] == 0.5 and plan.inputs["s_hat"] == 0.4
    # one worker's 320 samples/s (32 records / 0.1 s), times the 5 workers fed
    assert plan.inputs["predicted_rate"] == pytest.approx(1600, rel=0.01)
    assert pol.phase == "adjust"


def test_no_decision_before_every_worker_is_measured():
    pol = AutoPolicy(PARAMS)
    mon = Feed(1)
    assert isinstance(decide(pol, mon, 5.0, None), NoAction)
    missing = resources(2)  # worker 1 has no steps in the window
    assert "waiting" in decide(pol, mon, 5.0, missing).reason
    never = ProcessUse(host="h", cpu_cores=-1, cpu_limit=1.0, rss_bytes=0, memory_limit=0)
    unmeasured = dataclasses.replace(resources(1), workers={0: never})
    assert "waiting" in decide(pol, mon, 5.0, unmeasured).reason
    assert pol.phase == "sample"


def adjusted(pol, mon, workers):
    """A policy past its optimize step, running ``workers`` workers."""
    mon.workers = workers
    # s = 0.5 a worker: the server's 2 cores feed exactly these workers.
    decide(pol, mon, 5.0, resources(workers, server_cores=0.5 * workers))
    plan = decide(pol, mon, 16.0, resources(workers, server_cores=0.5 * workers))
    assert isinstance(plan, NoAction) and "is the plan" in plan.reason
    assert pol.phase == "adjust"


def test_idle_servers_take_more_workers_until_the_throughput_stops_rising():
    pol = AutoPolicy({**PARAMS, "max_workers": "12"})
    mon = Feed()
    adjusted(pol, mon, 4)
    # The servers use 0.4 of 2 cores with 4 workers (s = 0.1): 20 fed, +2 (sqrt 4).
    grow = decide(pol, mon, 20.0, resources(4, server_cores=0.4))
    assert isinstance(grow, ScaleWorkers) and grow.count == 6
    assert grow.inputs["added"] == 2
    # The 6 run no faster than the 4 did (each slower)...
    mon.workers, mon.bpt = 6, 0.15
    # ...too soon after the last change: settle; then growth stops, for good.
    assert "settling" in decide(pol, mon, 30.0, resources(6, server_cores=0.6)).reason
    hold = decide(pol, mon, 50.0, resources(6, server_cores=0.6))
    assert isinstance(hold, NoAction) and "did not raise the throughput" in hold.reason
    assert isinstance(decide(pol, mon, 80.0, resources(6, server_cores=0.6)), NoAction)


def test_growth_goes_on_while_it_pays():
    pol = AutoPolicy(PARAMS)
    mon = Feed()
    adjusted(pol, mon, 4)
    assert decide(pol, mon, 20.0, resources(4, server_cores=0.4)).count == 6
    mon.workers = 6  # each as fast as before: 1.5x the throughput
    again = decide(pol, mon, 50.0, resources(6, server_cores=0.6))
    assert isinstance(again, ScaleWorkers) and again.count == 8


def test_workers_that_finished_their_data_hold_the_job_as_it_is():
    """The race the clean-clone CI found: 4 workers, 2 finished as the data ran
    out; the 2 still running looked like the whole job, and an idle-PS "2 -> 3"
    removed rank 3. Scaling at the end adds nothing: hold, and count every rank."""
    pol = AutoPolicy(PARAMS)
    mon = Feed()
    adjusted(pol, mon, 4)
    mon.workers = 2  # ranks 0 and 1 still report steps
    ending = dataclasses.replace(
        resources(2, server_cores=0.2), job_workers=4, finished_workers=(2, 3)
    )
    hold = decide(pol, mon, 30.0, ending)
    assert isinstance(hold, NoAction) and "finished their data" in hold.reason
    assert "holding 4 workers" in hold.reason
    assert hold.inputs["workers"] == 4 and hold.inputs["running_workers"] == 2


def test_a_scale_counts_the_job_s_ranks_not_only_the_running_ones():
    pol = AutoPolicy(PARAMS)
    mon = Feed()
    adjusted(pol, mon, 4)
    # Rank 3 is restarting: three run, four are the job; the servers idle.
    restarting = dataclasses.replace(resources(3, server_cores=0.3), job_workers=4)
    mon.workers = 3
    grow = decide(pol, mon, 20.0, restarting)
    assert isinstance(grow, ScaleWorkers) and grow.count == 6  # 4 + sqrt(4)


def test_the_job_s_resources_count_every_worker_rank_and_the_finished_ones():
    state = make_state(workers=2, servers=1)
    bring_up(state)
    slot = state.procs["worker-1"]
    state.exited(slot.host, exited("worker-1", slot.attempt, code=0), 5.0)
    res = job_resources(state)
    assert sorted(res.workers) == [0]  # running
    assert (res.job_workers, res.worker_count, res.finished_workers) == (2, 2, (1,))


def test_busy_servers_hold_and_no_room_holds():
    pol = AutoPolicy(PARAMS)
    mon = Feed()
    adjusted(pol, mon, 4)
    busy = decide(pol, mon, 40.0, resources(4, server_cores=1.9, server_limit=2.0))
    assert isinstance(busy, NoAction) and "busy" in busy.reason
    full = decide(pol, mon, 40.0, resources(4, server_cores=0.4, free=0))
    assert isinstance(full, NoAction) and "no room" in full.reason


def test_a_hot_server_moves_to_a_spare_host():
    pol = AutoPolicy(PARAMS)
    mon = Feed()
    adjusted(pol, mon, 4)
    mon.mon.set_spare_capacity(1, hosts=["spare1"])
    hot = decide(pol, mon, 40.0, resources(4, server_cores=1.9, server_limit=2.0))
    assert isinstance(hot, KillRestart)
    assert (hot.role, hot.rank, hot.target_host) == ("server", 0, "spare1")
    assert hot.inputs["hot_cores"] == 1.9 and action_name(hot) == "KILL_RESTART"


def test_a_server_its_quota_throttles_is_hot_though_its_mean_use_is_below_it():
    """A BSP server works in bursts: the quota slows each update while its mean
    use stays well under it; the share of throttled CPU periods tells."""
    pol = AutoPolicy({**PARAMS, "max_workers": "4"})  # no growth in between
    mon = Feed(4)
    mon.mon.set_spare_capacity(1, hosts=["spare1"])
    bursty = resources(4, server_cores=1.2, server_limit=2.0)
    cool = dataclasses.replace(bursty.servers[0], cpu_throttled=0.1)
    for now in (5.0, 16.0):  # sample, then 4 workers is the plan (max_workers)
        decide(pol, mon, now, dataclasses.replace(bursty, servers={0: cool}))
    assert pol.phase == "adjust"
    for now in (40.0, 41.0, 42.0):
        calm = decide(pol, mon, now, dataclasses.replace(bursty, servers={0: cool}))
        assert not isinstance(calm, KillRestart)
    # One heartbeat's share is coarse: the median over the short window (5 s) counts.
    held = dataclasses.replace(bursty.servers[0], cpu_throttled=0.4)
    for now in (43.0, 44.0):
        calm = decide(pol, mon, now, dataclasses.replace(bursty, servers={0: held}))
        assert not isinstance(calm, KillRestart)
    moved = decide(pol, mon, 45.0, dataclasses.replace(bursty, servers={0: held}))
    assert isinstance(moved, KillRestart) and moved.role == "server"
    # 40-45 s: three readings of 10 %, three of 40 %
    assert moved.inputs["hot_throttled"] == 0.25 and "throttled in 25%" in moved.reason


def test_one_busy_server_of_a_skewed_model_holds_the_workers_though_the_rest_idle():
    pol = AutoPolicy(PARAMS)
    mon = Feed()
    adjusted(pol, mon, 4)
    one = resources(4, server_cores=1.85, server_limit=2.0)
    idle = dataclasses.replace(one.servers[0], cpu_cores=0.1)
    skewed = dataclasses.replace(one, servers={0: one.servers[0], 1: idle})
    # 1.95 of the 4 cores given: idle together, but every step waits on server 0.
    hold = decide(pol, mon, 40.0, skewed)
    assert isinstance(hold, NoAction) and "server 0 is busy" in hold.reason


def test_a_server_hot_when_the_sample_ends_moves_before_the_workers_are_planned():
    """The spare host goes to the hot server, not to a worker the plan would add
    there; the sample is taken again once the server runs on its new host."""
    pol = AutoPolicy(PARAMS)
    mon = Feed(1)
    mon.mon.set_spare_capacity(1, hosts=["spare1"])
    hot_now = resources(1, server_cores=1.95, server_limit=2.0)
    decide(pol, mon, 5.0, hot_now)
    decide(pol, mon, 10.0, hot_now)
    moved = decide(pol, mon, 15.1, hot_now)
    assert isinstance(moved, KillRestart) and moved.role == "server"
    assert pol.phase == "sample"
    settling = decide(pol, mon, 16.0, resources(1), restart_pending=True)
    assert isinstance(settling, NoAction) and "settle" in settling.reason
    for now in (20.0, 25.0):
        assert isinstance(decide(pol, mon, now, resources(1)), NoAction)
    plan = decide(pol, mon, 30.1, resources(1))
    assert isinstance(plan, ScaleWorkers) and plan.count == 5  # sampled anew
    assert pol.phase == "adjust"


def test_parameters_are_checked():
    assert isinstance(parse_policy("auto:max_workers=8,sample_s=5"), AutoPolicy)
    with pytest.raises(ConfigError, match="max_workers"):
        parse_policy("auto:max_workers=-1")
    with pytest.raises(ConfigError, match="nope"):
        parse_policy("auto:nope=1")


@pytest.mark.parametrize(
    "spec",
    [
        {"workers": 1, "servers": 0, "mode": "allreduce"},
        {"workers": 1, "servers": 1, "mode": "ps", "ps_server": "script"},
    ],
)
def test_auto_is_refused_without_the_built_in_servers(spec):
    job = JobSpec(run_id="r", run_dir=Path("/nonexistent"), script="t.py", policy="auto", **spec)
    with pytest.raises(ConfigError, match="auto sizes the workers of dtlaunch's built-in"):
        job.validate()
    ok = JobSpec(run_id="r", run_dir=Path("/nonexistent"), script="t.py", policy="auto",
                 workers=1, servers=1, mode="ps")  # fmt: skip
    assert ok.validate() is ok


def test_servers_that_bound_the_plan_are_scaled_with_the_workers_when_they_can_be():
    pol = AutoPolicy(PARAMS)
    feed = Feed(1)
    res = dataclasses.replace(resources(1), servers_scalable=True)
    for now in (5.0, 10.0):
        assert isinstance(decide(pol, feed, now, res), NoAction)
    snap = dataclasses.replace(feed.until(15.1).snapshot(15.1), resources=res)
    servers, workers = pol.decide(snap)
    # eq. 10: 8 / 0.9 -> 8 workers; their 3.2 cores of updates on servers of 2
    # cores at 0.9 need 2 servers; 9 + 1 slots hold them. The one server alone
    # fed 5.
    assert isinstance(servers, ScaleServers) and servers.count == 2
    assert isinstance(workers, ScaleWorkers) and workers.count == 8
    assert workers.inputs["plan_servers"] == 2 and workers.inputs["bound"] == "model"
    assert workers.inputs["predicted_rate"] == pytest.approx(8 * 320, rel=0.01)
    assert "1 -> 2 servers" in workers.reason and "fed 5" in workers.reason
    # With scale_servers=0, or servers that cannot scale, the servers bound it.
    fixed = AutoPolicy({**PARAMS, "scale_servers": "0"})
    feed = Feed(1)
    for now in (5.0, 10.0):
        decide(fixed, feed, now, res)
    assert decide(fixed, feed, 15.1, res).count == 5


def test_on_hosts_of_different_sizes_the_plan_counts_each_slot_s_cores():
    """One CPU-bound worker on a 1-core slot; the next free slots are a 4-core
    host's two, then 1-core ones. Eq. 10 would start 5 workers (the server feeds
    2 / 0.4 = 5 sampled workers), which on these slots would be 1 + 4 + 4 + 1 + 1
    = 11 sampled workers' updates: 2.2x what the server carries. The slot plan
    starts one: the 4-core slot's worker brings the work to the 5 fed."""
    pol = AutoPolicy(PARAMS)
    mon = Feed(1)
    mixed = dataclasses.replace(
        resources(1, worker_cores=1.0), free_worker_shares=(4.0, 4.0, 1.0, 1.0), free_worker_slots=4
    )
    for now in (5.0, 10.0):
        assert isinstance(decide(pol, mon, now, mixed), NoAction)
    plan = decide(pol, mon, 15.1, mixed)
    assert isinstance(plan, ScaleWorkers), plan
    assert plan.count == 2
    assert plan.inputs["plan"] == "slots" and plan.inputs["shares"] == [1.0, 4.0]
    assert plan.inputs["work"] == 5.0 and plan.inputs["bound"] == "servers"
    assert plan.inputs["predicted_rate"] == pytest.approx(5 * 320, rel=0.01)
    assert "hosts of different sizes" in plan.reason
    # The same job on equal slots plans by eq. 10, as before.
    pol, mon = AutoPolicy(PARAMS), Feed(1)
    equal = dataclasses.replace(resources(1, worker_cores=1.0), free_worker_shares=(1.0,) * 4)
    for now in (5.0, 10.0):
        decide(pol, mon, now, equal)
    plan = decide(pol, mon, 15.1, equal)
    assert isinstance(plan, ScaleWorkers) and plan.count == 5 and "plan" not in plan.inputs


def test_the_job_s_resources_give_each_free_slot_s_share_in_the_order_a_scale_fills_them():
    hosts = [
        HostSpec(label="small", hostname="127.0.0.2", slots=2, cpus=2.0),
        HostSpec(label="plain", hostname="127.0.0.3", slots=2),  # no cpus=: a core a slot
        HostSpec(label="big", hostname="127.0.0.4", slots=2, cpus=8.0, spare=True),
    ]
    limits = LimitRules(
        host_cpus={"small": 2.0, "big": 8.0}, host_slots={h.label: h.slots for h in hosts}
    )
    state = make_state(workers=1, hosts=hosts, spare_hosts=("big",), limits=limits)
    bring_up(state)
    res = job_resources(state)
    # Spare hosts first (4 cores a slot), then the job's hosts in hostfile order.
    assert state.free_worker_hosts() == ["big", "big", "small", "plain", "plain"]
    assert res.free_worker_shares == (4.0, 4.0, 1.0, 1.0, 1.0)
    assert res.free_worker_slots == 5
    assert [use.cpu_limit for use in res.workers.values()] == [1.0]
