"""Policies: parsing, none, lb-bsp (solver output, hysteresis), nd (AntDT-ND)."""

from __future__ import annotations

import textwrap

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.solvers.batch import solve_batch_sizes
from dtlaunch.supervisor.control.actions import (
    AdjustBatchSize,
    KillRestart,
    NoAction,
    action_fields,
    action_name,
)
from dtlaunch.supervisor.control.monitor import Monitor, WorkerDevice
from dtlaunch.supervisor.control.policies import (
    LbBspPolicy,
    NdPolicy,
    NonePolicy,
    monitor_for,
    parse_policy,
)


def run(mon, bpts, *, start, end, batches=None, step0=0, comm=0.0):
    """Every worker reports one step a second from start to end; bpts: rank -> compute s."""
    step = step0
    t = start
    while t <= end + 1e-9:
        for rank, bpt in bpts.items():
            b = batches[rank] if batches else 32
            mon.report_worker(
                rank, now=t, step=step, batch_size=b, compute_s=bpt, comm_s=comm, samples=b
            )
        t += 1.0
        step += 1
    return step


def names(actions):
    return [action_name(a) for a in actions]


# ------------------------------------------------------------------ parsing


def test_parse_builtins_with_defaults_and_params():
    p = parse_policy("none")
    assert isinstance(p, NonePolicy) and p.name == "none"
    assert (p.l_trans, p.l_per, p.lam) == (60.0, 300.0, 1.5)
    nd = parse_policy("nd:lambda=1.3,l_trans=30,l_per=120,restart_cost=5")
    assert isinstance(nd, NdPolicy)
    assert (nd.l_trans, nd.l_per, nd.lam, nd.restart_cost) == (30.0, 120.0, 1.3, 5.0)
    assert nd.cooldown == 120.0  # defaults to l_per
    lb = parse_policy(" lb-bsp:margin=0.1,min_batch=4 ")
    assert isinstance(lb, LbBspPolicy)
    assert (lb.balancer.margin, lb.balancer.min_batch) == (0.1, 4)
    mon = monitor_for(nd)
    assert (mon.l_trans, mon.l_per) == (30.0, 120.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fastest", "unknown policy 'fastest'; use one of none, lb-bsp, nd"),
        ("nd:lamda=2", "unknown parameter lamda; valid parameters: l_trans, l_per, lambda"),
        ("nd:lambda=abc", "lambda must be a number > 1, got 'abc'"),
        ("nd:lambda=0.9", "lambda must be a number > 1"),
        ("nd:l_trans=100,l_per=50", "l_per (50 s) must be >= l_trans (100 s)"),
        ("nd:l_trans=-1", "l_trans must be a number > 0"),
        ("nd:lambda", "'lambda' is not key=value"),
        ("nd:lambda=2,lambda=3", "lambda given twice"),
        ("nd:min_reports=0", "min_reports must be an integer >= 1"),
        ("nd:fill=2", "fill must be in [0, 1]"),
        ("lb-bsp:min_batch=1.5", "min_batch must be an integer >= 1"),
        ("none:margin=0.1", "unknown parameter margin"),
        ("no_such_mod_xyz:Cls", "cannot import module no_such_mod_xyz"),
    ],
)
def test_parse_errors_name_the_problem(text, message):
    with pytest.raises(ConfigError) as err:
        parse_policy(text)
    assert message in str(err.value)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_policies_for_test.py").write_text(
        textwrap.dedent(
            """
            from dtlaunch.supervisor.control.actions import NoAction

            class Plain:
                def __init__(self, threshold=1, label="x", verbose=False):
                    self.threshold, self.label, self.verbose = threshold, label, verbose

                def decide(self, snap):
                    return [NoAction(reason=f"{self.label}:{self.threshold}")]

            class Windowed:
                name = "windowed"
                l_trans = 10.0
                l_per = 20.0
                lam = 2.0

                def decide(self, snap):
                    return "not a list"

            class NoDecide:
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_policies_for_test"


def test_module_class_is_loaded_with_converted_kwargs(user_module):
    p = parse_policy(f"{user_module}:Plain:threshold=2.5,label=abc,verbose=true")
    assert p.name == f"{user_module}:Plain"
    assert (p.l_trans, p.l_per, p.lam) == (60.0, 300.0, 1.5)  # defaults filled in
    assert p.inner.threshold == 2.5 and p.inner.label == "abc" and p.inner.verbose is True
    out = p.decide(Monitor(l_trans=1, l_per=2).snapshot(0))
    assert out == [NoAction(reason="abc:2.5")]
    bare = parse_policy(f"{user_module}:Plain")
    assert bare.inner.threshold == 1


def test_module_class_errors(user_module):
    w = parse_policy(f"{user_module}:Windowed")
    assert (w.name, w.l_trans, w.l_per, w.lam) == ("windowed", 10.0, 20.0, 2.0)
    with pytest.raises(TypeError, match="must return a list of dtlaunch actions"):
        w.decide(Monitor(l_trans=1, l_per=2).snapshot(0))
    with pytest.raises(ConfigError, match="has no class Missing"):
        parse_policy(f"{user_module}:Missing")
    with pytest.raises(ConfigError, match="no decide"):
        parse_policy(f"{user_module}:NoDecide")
    with pytest.raises(ConfigError, match=r"Plain\(bogus\) failed: TypeError"):
        parse_policy(f"{user_module}:Plain:bogus=1")


# --------------------------------------------------------------------- none


def test_none_never_acts():
    mon = Monitor(l_trans=60, l_per=300)
    run(mon, {0: 1.0, 1: 5.0}, start=0, end=100)
    [a] = NonePolicy().decide(mon.snapshot(100))
    assert isinstance(a, NoAction) and a.inputs["bpt_short"][1] == pytest.approx(5.0)


# ------------------------------------------------------------------- lb-bsp


def test_lb_bsp_emits_solver_output_then_holds_off():
    pol = LbBspPolicy()
    mon = monitor_for(pol)
    step = run(mon, {0: 1.0, 1: 1.0, 2: 2.0}, start=0, end=59)
    [a] = pol.decide(mon.snapshot(59))
    assert isinstance(a, AdjustBatchSize)
    assert list(a.sizes.values()) == solve_batch_sizes([32.0, 32.0, 16.0], 96, 1)
    assert a.sizes == {0: 39, 1: 38, 2: 19}  # makespan 39/32 s beats 38,38,20 (20/16 s)
    assert a.apply_at_step == (step - 1) + 10
    assert a.inputs["solver_sizes"] == a.sizes and a.inputs["global_batch"] == 96
    # Before the apply step: nothing new, even though the estimates are unchanged.
    run(mon, {0: 1.0, 1: 1.0, 2: 2.0}, start=60, end=64, step0=step)
    [b] = pol.decide(mon.snapshot(64))
    assert isinstance(b, NoAction) and "applies at step" in b.reason
    # After it applied, per-step time is balanced: no flapping.
    sizes = a.sizes
    run(mon, {0: 39 / 32, 1: 38 / 32, 2: 19 / 16}, start=65, end=200, batches=sizes, step0=step + 5)
    [c] = pol.decide(mon.snapshot(200))
    assert isinstance(c, NoAction) and "within 5%" in c.reason


def test_no_plan_before_every_placed_worker_reported_once():
    """A first decision that came before worker 1's first report (in flight, or a
    slower start) would balance the batch over workers 0 and 2 alone; it waits.
    A worker that reported before and is restarting keeps its share instead."""
    from dtlaunch.supervisor.control.controller import Controller

    controller = Controller(LbBspPolicy(), interval=1.0, spare_hosts=[])
    placed = {0: "a", 1: "a", 2: "b"}
    run(controller.monitor, {0: 1.0, 2: 2.0}, start=0, end=5)
    [] = controller.decide(5.0, remaining_steps=None, worker_hosts=placed)
    assert controller.counts == {} and controller.batch_plan == {}
    reason = LbBspPolicy().decide(controller.monitor.snapshot(5.0, devices={
        r: WorkerDevice(host=h) for r, h in placed.items()}))[0].reason  # fmt: skip
    assert reason == "waiting for the first step report of worker 1"
    run(controller.monitor, {0: 1.0, 1: 1.0, 2: 2.0}, start=6, end=8, step0=6)
    [plan] = controller.decide(8.0, remaining_steps=None, worker_hosts=placed)
    assert isinstance(plan, AdjustBatchSize) and set(plan.sizes) == {0, 1, 2}
    # Worker 1 restarts: its windows start over, but it is not waited for again.
    controller.worker_gone(1)
    snap = controller.monitor.snapshot(9.0, devices={r: WorkerDevice(host=h)
                                                     for r, h in placed.items()})  # fmt: skip
    assert snap.awaiting_first_report == ()


def test_lb_bsp_margin_ignores_small_imbalance():
    pol = LbBspPolicy()
    mon = monitor_for(pol)
    run(mon, {0: 1.0, 1: 1.04}, start=0, end=59)  # 4 % slower: below the 5 % margin
    [a] = pol.decide(mon.snapshot(59))
    assert isinstance(a, NoAction)
    # With no margin (and no tolerance: each of two workers 4 % apart is within 3 %
    # of their median) it is acted on.
    strict = LbBspPolicy({"margin": "0", "tolerance": "0"})
    [b] = strict.decide(mon.snapshot(59))
    assert isinstance(b, AdjustBatchSize)
    assert sum(b.sizes.values()) == 64
    assert b.inputs["throughput_used"] == pytest.approx(b.inputs["throughput"])


def test_a_fixed_per_step_delay_is_balanced_in_one_plan_once_its_line_is_known():
    """Worker 3 loses 0.12 s every step whatever its batch (8 workers, 1/120 s
    per sample, global batch 256). From B/T alone a plan shrinks it too little;
    once a window holds two of its batch sizes the plan reaches the optimum of
    the real step times at once."""
    pol = LbBspPolicy({"margin": "0", "min_batch": "8", "l_trans": "10", "l_per": "10"})

    def step_s(rank: int, b: int) -> float:
        return (0.12 if rank == 3 else 0.0) + b / 120

    def window(plans: list[dict[int, int]]) -> Monitor:
        mon = monitor_for(pol)
        for t, sizes in enumerate(plans):
            for rank, b in sizes.items():
                mon.report_worker(rank, now=t, step=t, batch_size=b, compute_s=step_s(rank, b),
                                  comm_s=0.0, samples=b)  # fmt: skip
        return mon

    def real_makespan(sizes: dict[int, int]) -> float:
        return max(step_s(r, b) for r, b in sizes.items())

    # Only B = 32 seen: eq. 3 from B/T (proportional) is all that can be done.
    equal = dict.fromkeys(range(8), 32)
    [first] = LbBspPolicy({"margin": "0", "min_batch": "8"}).decide(window([equal] * 6).snapshot(5))
    assert isinstance(first, AdjustBatchSize) and first.inputs["step_model"] == {}
    # Its plan applied: B = 32 and the planned size in the window, a line is fitted.
    mon = window([equal] * 3 + [first.sizes] * 3)
    [second] = pol.decide(mon.snapshot(5))
    assert isinstance(second, AdjustBatchSize)
    assert second.inputs["step_model"][3] == pytest.approx([0.12, 1 / 120])
    assert sum(second.sizes.values()) == 256
    # The best integer split of the real step times (brute force over worker 3's size).
    best = min(
        real_makespan({r: (b3 if r == 3 else 0) for r in range(8)} | {
            r: s for r, s in zip([0, 1, 2, 4, 5, 6, 7],
                                 solve_batch_sizes([120.0] * 7, 256 - b3, 8), strict=True)
        })
        for b3 in range(8, 40)
    )  # fmt: skip
    assert real_makespan(second.sizes) == pytest.approx(best)
    assert real_makespan(first.sizes) > best + 0.01  # the proportional plan fell short


def test_a_replacement_left_at_a_small_batch_is_given_records_and_not_killed():
    """The newcomer inherits a straggler's batch of 2 and loses 0.12 s a step on its
    host (transient): from its peers' per-sample time the plan gives it about the
    optimum of the real step times at once, and nd does not call it persistent."""
    pol = NdPolicy({"l_trans": "3", "l_per": "3", "min_batch": "2", "restart_cost": "1"})
    mon = monitor_for(pol)
    sizes = {**dict.fromkeys(range(7), 36), 7: 2}
    sizes[0] += 256 - sum(sizes.values())

    def step_s(rank: int, b: int) -> float:
        return (0.12 if rank == 7 else 0.0) + b / 120

    run(mon, {r: step_s(r, b) for r, b in sizes.items()}, start=0, end=4, batches=sizes)
    mon.set_spare_capacity(1, ["spare1"])
    actions = pol.decide(mon.snapshot(4, remaining_steps=10_000, restart_cost_s=1.0))
    assert not [a for a in actions if isinstance(a, KillRestart)], names(actions)
    [plan] = [a for a in actions if isinstance(a, AdjustBatchSize)]
    assert plan.inputs["step_model_from"] == {7: "peers"}
    assert sum(plan.sizes.values()) == 256
    best = min(
        max(step_s(7, b7), max(step_s(0, b) for b in solve_batch_sizes([120.0] * 7, 256 - b7, 2)))
        for b7 in range(2, 40)
    )
    assert max(step_s(r, b) for r, b in plan.sizes.items()) == pytest.approx(best, rel=0.01)
    assert plan.sizes[7] > 15


def test_throughputs_within_the_tolerance_count_as_equal():
    """Step-time noise (within 3 % of the median throughput) moves no record,
    even with no margin; a worker 10 % slower still gets less."""
    mon = monitor_for(LbBspPolicy())
    run(mon, {0: 1.0, 1: 1.02, 2: 0.985, 3: 1.1}, start=0, end=59)
    [a] = LbBspPolicy({"margin": "0"}).decide(mon.snapshot(59))
    assert isinstance(a, AdjustBatchSize)
    equal = [a.sizes[r] for r in (0, 1, 2)]
    assert max(equal) - min(equal) <= 1 and min(equal) > a.sizes[3]  # 1: integer remainder
    used = a.inputs["throughput_used"]
    assert used[0] == used[1] == used[2] != a.inputs["throughput"][1]
    mon = monitor_for(LbBspPolicy())
    run(mon, {0: 1.0, 1: 1.02, 2: 0.985}, start=0, end=59)
    [n] = LbBspPolicy({"margin": "0"}).decide(mon.snapshot(59))
    assert isinstance(n, NoAction)
    [b] = LbBspPolicy({"margin": "0", "tolerance": "0"}).decide(mon.snapshot(59))
    assert isinstance(b, AdjustBatchSize)  # without the tolerance it chases the noise


# ----------------------------------------------------------------------- nd

FOUR = {0: 1.0, 1: 1.0, 2: 1.0}


def test_nd_transient_straggler_adjusts_batch_sizes():
    pol = NdPolicy()
    mon = monitor_for(pol)
    step = run(mon, {**FOUR, 3: 1.0}, start=0, end=240)
    run(mon, {**FOUR, 3: 3.0}, start=241, end=300, step0=step)  # slow only in the last minute
    snap = mon.snapshot(300, remaining_steps=10_000, restart_cost_s=1.0)
    assert snap.worker_long[3].mean_bpt_eq < 1.5 * snap.mean_bpt_eq_long  # not persistent
    [a] = pol.decide(snap)
    assert isinstance(a, AdjustBatchSize)
    expected = solve_batch_sizes([snap.worker_short[r].throughput for r in range(4)], 128, 1)
    assert list(a.sizes.values()) == expected
    assert a.sizes[3] < 32 < a.sizes[0]
    assert a.inputs["transient"] == [3]


def test_nd_balances_a_worker_below_lambda_but_not_one_within_the_margin():
    pol = NdPolicy()
    mon = monitor_for(pol)
    run(mon, {**FOUR, 3: 1.04}, start=0, end=300)  # 4 % slower: inside the 5 % margin
    [a] = pol.decide(mon.snapshot(300, remaining_steps=10_000))
    assert isinstance(a, NoAction)
    slower = NdPolicy()
    mon = monitor_for(slower)
    run(mon, {**FOUR, 3: 1.3}, start=0, end=300)  # 1.3x the others: below lambda 1.5
    [b] = slower.decide(mon.snapshot(300, remaining_steps=10_000))
    assert isinstance(b, AdjustBatchSize) and b.sizes[3] < 32
    assert b.inputs["transient"] == []  # not named a straggler, balanced all the same
    assert "throughput changed" in b.reason


def persistent_setup(pol, *, slow=None, end=300, spares=("spare1",)):
    mon = monitor_for(pol)
    run(mon, {**FOUR, 3: 4.0, **(slow or {})}, start=0, end=end)
    mon.set_spare_capacity(len(spares), list(spares))
    return mon


def test_nd_persistent_worthwhile_kills_onto_spare_host():
    pol = NdPolicy()
    mon = persistent_setup(pol)
    mon.set_spare_capacity(1, ["spare1"])
    snap = mon.snapshot(300, remaining_steps=1000, restart_cost_s=30.0)
    actions = pol.decide(snap)
    assert names(actions) == ["KILL_RESTART"]  # no ADJUST_BS while a worker restarts
    [k] = actions
    assert (k.role, k.rank, k.target_host) == ("worker", 3, "spare1")
    # A healthy replacement runs like the fastest quarter (one of four): 1 s a step.
    assert k.inputs["gain_s"] == pytest.approx((4.0 - 1.0) * 1000)
    assert k.inputs["restart_cost_s"] == 30.0
    # The paper's yardstick, the mean of all four, counts the straggler in.
    paper = NdPolicy({"reference": "mean"})
    [m] = paper.decide(persistent_setup(paper).snapshot(300, remaining_steps=1000,
                                                         restart_cost_s=30.0))  # fmt: skip
    mean = (1 + 1 + 1 + 4) / 4
    assert isinstance(m, KillRestart) and m.inputs["gain_s"] == pytest.approx((4.0 - mean) * 1000)
    assert action_fields(k)["action"] == "KILL_RESTART"


def test_nd_persistent_without_a_free_spare_host_is_balanced_not_killed():
    pol = NdPolicy()
    mon = persistent_setup(pol, spares=())
    [a] = pol.decide(mon.snapshot(300, remaining_steps=1000, restart_cost_s=30.0))
    assert isinstance(a, AdjustBatchSize)  # the cluster is busy: balance instead
    assert "no free spare host (the cluster is busy)" in " ".join(a.inputs["notes"])
    in_place = NdPolicy({"in_place": "1"})
    mon = persistent_setup(in_place, spares=())
    [k] = in_place.decide(mon.snapshot(300, remaining_steps=1000, restart_cost_s=30.0))
    assert isinstance(k, KillRestart) and k.target_host is None
    assert "same host" in k.reason


def test_nd_persistent_not_worthwhile_only_balances():
    pol = NdPolicy()
    mon = persistent_setup(pol)
    # gain = (4 - 1.75) * 10 = 22.5 s < 30 s restart cost
    actions = pol.decide(mon.snapshot(300, remaining_steps=10, restart_cost_s=30.0))
    assert names(actions) == ["ADJUST_BS"]
    assert "does not exceed restart cost" not in actions[0].reason  # notes go to NONE only
    pol2 = NdPolicy({"margin": "100"})  # balancing never pays: the note is visible
    mon2 = persistent_setup(pol2)
    [n] = pol2.decide(mon2.snapshot(300, remaining_steps=10, restart_cost_s=30.0))
    assert isinstance(n, NoAction) and "does not exceed restart cost 30.0 s" in n.reason


def test_nd_does_not_kill_without_remaining_steps_or_full_window():
    pol = NdPolicy({"margin": "100"})
    mon = persistent_setup(pol)
    [n] = pol.decide(mon.snapshot(300, restart_cost_s=1.0))
    assert isinstance(n, NoAction) and "remaining steps unknown" in n.reason
    young = persistent_setup(pol, end=100)  # only 100 s of history of 300 s
    [n] = pol.decide(young.snapshot(100, remaining_steps=10**6, restart_cost_s=1.0))
    assert isinstance(n, NoAction) and "long window is not full" in n.reason


def test_nd_judges_a_batched_reporter_once_its_reports_reach_back_far_enough():
    """Server updates every 0.17 s arrive in batches every 0.5 s; a decision can
    fall just before a batch lands, so the newest known report is ~0.5 s old. With
    l_per = 2 s (fill 0.8) the window still reaches back 1.6 s: it is full."""
    pol = NdPolicy({"l_trans": "1", "l_per": "2", "min_reports": "3", "restart_cost": "0.1"})
    mon = monitor_for(pol)
    run(mon, {0: 0.2, 1: 0.2}, start=0, end=12)
    updates = [round(0.17 * i, 3) for i in range(1, 70)]  # when each update ended
    for batch_end in [0.5 * k for k in range(1, 24)]:  # when each batch lands
        for t in (u for u in updates if batch_end - 0.5 < u <= batch_end):
            mon.report_server(0, now=t, step=int(t / 0.17), update_s=0.001)
            mon.report_server(1, now=t, step=int(t / 0.17), update_s=0.15)
    mon.set_spare_capacity(1, ["spare9"])
    # 11.99 s: the last batch landed at 11.5 s holding updates up to 11.39 s.
    snap = mon.snapshot(11.99, remaining_steps=100, restart_cost_s=None)
    assert snap.server_long[1].span_s < 1.6  # newest minus oldest: short of 0.8 x 2 s
    kills = [a for a in pol.decide(snap) if isinstance(a, KillRestart)]
    assert [(k.role, k.rank) for k in kills] == [("server", 1)]
    # A server that started reporting 1 s ago is not judged yet.
    young = monitor_for(pol)
    run(young, {0: 0.2, 1: 0.2}, start=0, end=12)
    for t in (u for u in updates if 11.0 <= u <= 11.9):
        young.report_server(0, now=t, step=int(t / 0.17), update_s=0.001)
        young.report_server(1, now=t, step=int(t / 0.17), update_s=0.15)
    young.set_spare_capacity(1, ["spare9"])
    out = pol.decide(young.snapshot(11.99, remaining_steps=100))
    assert not any(isinstance(a, KillRestart) for a in out)
    notes = " ".join(a.reason + " ".join(a.inputs.get("notes", [])) for a in out)
    assert "server 1 is" in notes and "long window is not full" in notes


def test_nd_one_kill_per_decision_then_cooldown_and_pending():
    pol = NdPolicy({"cooldown": "120"})
    mon = monitor_for(pol)
    fast = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    run(mon, {**fast, 4: 3.0, 5: 4.0}, start=0, end=300)  # workers 4 and 5 persistently slow
    mon.set_spare_capacity(2, ["spare1", "spare2"])
    snap = mon.snapshot(300, remaining_steps=1000, restart_cost_s=1.0)
    kills = [a for a in pol.decide(snap) if isinstance(a, KillRestart)]
    assert [(k.rank, k.role) for k in kills] == [(5, "worker")]  # the largest gain
    assert set(kills[0].inputs["candidates"]) == {"worker:4", "worker:5"}
    mon.worker_gone(5)
    run(mon, {**fast, 4: 3.0}, start=301, end=400, step0=301)
    snap = mon.snapshot(400, remaining_steps=1000, restart_cost_s=1.0)
    [a] = pol.decide(snap)
    assert isinstance(a, AdjustBatchSize)  # worker 4 is still slow: balance meanwhile
    assert "KILL_RESTART cooldown until t=420 s" in " ".join(a.inputs["notes"])
    snap = mon.snapshot(421, remaining_steps=1000, restart_cost_s=1.0, restart_pending=True)
    out = pol.decide(snap)
    assert not any(isinstance(a, KillRestart) for a in out)
    assert "a restart is still settling" in out[0].reason + " ".join(out[0].inputs["notes"])
    snap = mon.snapshot(421, remaining_steps=1000, restart_cost_s=1.0)
    assert [(a.role, a.rank) for a in pol.decide(snap) if isinstance(a, KillRestart)] == [
        ("worker", 4)
    ]


def test_nd_server_persistent_straggler_is_killed():
    pol = NdPolicy()
    mon = monitor_for(pol)
    run(mon, {0: 1.0, 1: 1.0}, start=0, end=300)
    for t in range(301):
        for rank, upd in {0: 0.1, 1: 0.1, 2: 1.0}.items():
            mon.report_server(rank, now=t, step=t, update_s=upd)
    mon.set_spare_capacity(1, ["spare9"])
    [k] = pol.decide(mon.snapshot(300, remaining_steps=1000, restart_cost_s=30.0))
    assert isinstance(k, KillRestart)
    assert (k.role, k.rank, k.target_host) == ("server", 2, "spare9")
    assert k.inputs["gain_s"] == pytest.approx((1.0 - 0.4) * 1000)


def test_nd_moves_a_server_whose_exchanges_are_slow_though_its_updates_are_quick():
    """A server on a slow link (or too busy to serve pulls) applies its updates in
    a few milliseconds; the workers wait ~0.9 s a step on their exchange with it.
    Its update time alone is noise beside the step; with the exchange it is the
    straggler (benchmarks/psld.py scenario a: nd never moved it)."""
    pol = NdPolicy({"l_trans": "2", "l_per": "10", "margin": "100", "restart_cost": "1"})
    mon = monitor_for(pol)
    exchange = {0: 0.05, 1: 0.05, 2: 0.05, 3: 0.9}
    for t in range(61):
        for rank in range(4):
            mon.report_worker(
                rank, now=t, step=t, batch_size=8, compute_s=0.02, comm_s=0.9, samples=8,
                servers=tuple(exchange.items()),
            )  # fmt: skip
        for rank, upd in {0: 0.003, 1: 0.003, 2: 0.003, 3: 0.03}.items():
            mon.report_server(rank, now=t, step=t, update_s=upd)
    mon.set_spare_capacity(1, ["spare9"])
    snap = mon.snapshot(60, remaining_steps=100, restart_cost_s=None)
    [k] = [a for a in pol.decide(snap) if isinstance(a, KillRestart)]
    assert (k.role, k.rank, k.target_host) == ("server", 3, "spare9")
    mean = (3 * 0.053 + 0.93) / 4
    assert k.inputs["t_slow_s"] == pytest.approx(0.93)
    assert k.inputs["gain_s"] == pytest.approx((0.93 - mean) * 100)
    assert "server 3 is 3.42x the mean over 10 s" in k.reason
    assert k.inputs["server_comm_long"] == pytest.approx(exchange)
    # The same exchanges with every server: nobody is singled out.
    even = monitor_for(pol)
    for t in range(61):
        for rank in range(4):
            even.report_worker(
                rank, now=t, step=t, batch_size=8, compute_s=0.02, comm_s=0.4, samples=8,
                servers=tuple((s, 0.1) for s in range(4)),
            )  # fmt: skip
        for rank, upd in {0: 0.003, 1: 0.003, 2: 0.003, 3: 0.03}.items():
            even.report_server(rank, now=t, step=t, update_s=upd)
    even.set_spare_capacity(1, ["spare9"])
    out = pol.decide(even.snapshot(60, remaining_steps=100, restart_cost_s=None))
    assert not any(isinstance(a, KillRestart) for a in out)


def test_nd_follows_a_recovered_straggler_back():
    pol = NdPolicy()
    mon = monitor_for(pol)
    sizes = {0: 40, 1: 40, 2: 40, 3: 8}  # an earlier ADJUST_BS shrank worker 3
    per_sample = 1 / 32  # everyone is equally fast again
    run(mon, {r: b * per_sample for r, b in sizes.items()}, start=0, end=60, batches=sizes)
    [a] = pol.decide(mon.snapshot(60, remaining_steps=1000))
    assert isinstance(a, AdjustBatchSize)
    assert a.sizes == {0: 32, 1: 32, 2: 32, 3: 32}


def test_nd_does_not_move_a_server_whose_slowness_is_noise_beside_the_step():
    pol = NdPolicy({"margin": "100"})
    mon = monitor_for(pol)
    run(mon, {0: 0.3, 1: 0.3}, start=0, end=300)  # 300 ms steps
    for t in range(301):
        for rank, upd in {0: 0.0003, 1: 0.0003, 2: 0.0010}.items():  # 3.3x, but 0.7 ms
            mon.report_server(rank, now=t, step=t, update_s=upd)
    mon.set_spare_capacity(1, ["spare9"])
    [n] = pol.decide(mon.snapshot(300, remaining_steps=10**6, restart_cost_s=0.0))
    assert isinstance(n, NoAction) and "min_saving 0.05" in n.reason
    eager = NdPolicy({"margin": "100", "min_saving": "0"})
    [k] = eager.decide(mon.snapshot(300, remaining_steps=10**6, restart_cost_s=0.0))
    assert isinstance(k, KillRestart) and (k.role, k.rank) == ("server", 2)
