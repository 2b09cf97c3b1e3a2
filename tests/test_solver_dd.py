"""AntDT-DD (eq. 4) solver: hand-worked paper cases, brute force, a cvxpy MIP, properties."""

from __future__ import annotations

import itertools
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtlaunch.solvers.batch import makespan, solve_batch_sizes
from dtlaunch.solvers.dd import (
    MAX_GLOBAL_BATCH,
    DeviceClass,
    InfeasibleError,
    dd_makespan,
    solve_dd,
    solve_dd_workers,
)

try:  # imported once here: it takes seconds, which no single test should carry
    import cvxpy as cp
except ImportError:  # pragma: no cover - cvxpy is a dev dependency
    cp = None
needs_cvxpy = pytest.mark.skipif(cp is None, reason="cvxpy is not installed")

# Values whose ratios create exact and float-near ties (0.1 * 3 != 0.3 in floats).
TIE_PRONE = [0.1, 0.2, 0.3, 1 / 3, 0.7, 1.0, 1.6, 2.0, 3.0, 1e-3, 1e3, 0.001 * 3]


def work(plan):
    """Samples per device of each class, C_i * B_i."""
    return tuple(b * c for b, c in zip(plan.batch_sizes, plan.accumulations, strict=True))


def exact_times(ws, classes):
    return [Fraction(w) / Fraction(cls.throughput) for w, cls in zip(ws, classes, strict=True)]


def assert_valid(plan, classes, total, cmin=1, cmax=5):
    """Every constraint of eq. 4, plus tie-break rule 4 (the smallest fitting C_i)."""
    assert len(plan.batch_sizes) == len(plan.accumulations) == len(classes)
    assert plan.counts == tuple(cls.count for cls in classes)
    assert all(type(x) is int for x in plan.batch_sizes + plan.accumulations)
    assert sum(cls.count * w for cls, w in zip(classes, work(plan), strict=True)) == total
    assert plan.global_batch == total
    for cls, b, c in zip(classes, plan.batch_sizes, plan.accumulations, strict=True):
        assert cls.min_batch <= b <= cls.max_batch
        assert cmin <= c <= cmax
        for smaller in range(cmin, c):
            assert not (b * c % smaller == 0 and cls.min_batch <= b * c // smaller <= cls.max_batch)
    times = exact_times(work(plan), classes)
    assert plan.makespan == float(max(times))
    assert plan.earliest_finish == float(min(times))
    assert plan.step_times == tuple(float(t) for t in times)


def work_sets(classes, total, cmin, cmax):
    return [
        sorted(
            {c * b for c in range(cmin, cmax + 1) for b in range(cls.min_batch, cls.max_batch + 1)}
            & set(range(total // cls.count + 1))
        )
        for cls in classes
    ]


def brute_force(classes, total, cmin=1, cmax=5):
    """The documented tie-break by enumeration: min makespan, max earliest, lexmax work."""
    best = None
    for ws in itertools.product(*work_sets(classes, total, cmin, cmax)):
        if sum(cls.count * w for cls, w in zip(classes, ws, strict=True)) == total:
            times = exact_times(ws, classes)
            key = (max(times), -min(times), [-w for w in ws])
            best = min(best, (key, ws)) if best else (key, ws)
    return None if best is None else best[1]


def mip_optimum(classes, total, cmin=1, cmax=5):
    """Eq. 4 as a MIP (per class: pick one C with a binary, B_i as integer y on it)."""
    assert "HIGHS" in cp.installed_solvers()
    counts = list(range(cmin, cmax + 1))
    pick = cp.Variable((len(classes), len(counts)), boolean=True)
    batch = cp.Variable((len(classes), len(counts)), integer=True)
    z = cp.Variable()
    low = np.array([[cls.min_batch] * len(counts) for cls in classes])
    high = np.array([[cls.max_batch] * len(counts) for cls in classes])
    ws = batch @ np.array(counts, dtype=float)
    problem = cp.Problem(
        cp.Minimize(z),
        [
            cp.sum(pick, axis=1) == 1,
            batch >= cp.multiply(low, pick),
            batch <= cp.multiply(high, pick),
            np.array([cls.count for cls in classes], dtype=float) @ ws == total,
            ws <= z * np.array([cls.throughput for cls in classes]),
        ],
    )
    problem.solve(solver=cp.HIGHS, mip_rel_gap=0.0, mip_abs_gap=0.0)
    if problem.status in ("infeasible", "infeasible_inaccurate"):
        return None
    assert problem.status == "optimal"
    integral = [round(float(w)) for w in ws.value]
    assert sum(cls.count * w for cls, w in zip(classes, integral, strict=True)) == total
    return float(max(exact_times(integral, classes))), float(problem.value)


# --- hand-worked examples from the paper's definitions ----------------------------------


V100 = DeviceClass(throughput=160.0, min_batch=32, max_batch=96, count=2)
P100 = DeviceClass(throughput=100.0, min_batch=32, max_batch=64, count=2)  # 1.6x slower


def test_v100_p100_with_accumulation():
    # Cluster-B-like: 2 V100 + 2 P100, global batch B = 768 (§VII), Cmax = 5.
    # DDP: 768 / 4 = 192 samples per device; a P100 holds 64 per pass, so C = 3 and
    # the step takes max(192/160, 192/100) = 1.92 s.
    # Eq. 4: 2 w_V + 2 w_P = 768, so w_V + w_P = 384.  Below z = 1.48 a P100 does at
    # most 147 samples (147/100 = 1.47) and a V100 at most floor(1.48 * 160 - eps) = 236:
    # 383 < 384, infeasible.  At z = 1.48 exactly w_P = 148, w_V = 236 fits:
    # 148 = 4 x 37 (2 x 74 > 64, 148/3 not integral) and 236 = 4 x 59 (2 x 118 > 96).
    plan = solve_dd([V100, P100], 768)
    assert_valid(plan, [V100, P100], 768)
    assert plan.batch_sizes == (59, 37)
    assert plan.accumulations == (4, 4)
    assert plan.makespan == 1.48  # 148 / 100, 23% below DDP's 1.92 s
    assert plan.earliest_finish == 236 / 160  # 1.475 s
    assert plan.worker_batch_sizes() == [59, 59, 37, 37]
    assert plan.worker_accumulations() == [4, 4, 4, 4]
    assert dd_makespan([V100, P100], plan.batch_sizes, plan.accumulations) == 1.48
    assert dd_makespan([V100, P100], [64, 64], [3, 3]) == 1.92  # the DDP plan


def test_memory_bound_on_the_slow_class_binds():
    # P100 memory limit 48 and Cmax = 3: W_P tops out at 3 x 48 = 144, so w_V >= 240
    # and z >= 240 / 160 = 1.5.  w_V = 240 = 3 x 80 (2 x 120 > 96) is in W_V: z* = 1.5,
    # the unique optimum (w_V <= 240 forces w_P >= 144).
    small = DeviceClass(100.0, 32, 48, 2)
    plan = solve_dd([V100, small], 768, max_accumulation=3)
    assert_valid(plan, [V100, small], 768, 1, 3)
    assert (plan.batch_sizes, plan.accumulations) == ((80, 48), (3, 3))
    assert (plan.makespan, plan.earliest_finish) == (1.5, 1.44)


def test_without_accumulation_the_paper_batch_does_not_fit():
    # LB-BSP-like, C = 1: at most 2 x 96 + 2 x 64 = 320 < 768 samples per step.
    with pytest.raises(InfeasibleError, match="largest step") as info:
        solve_dd([V100, P100], 768, max_accumulation=1)
    assert "320" in str(info.value)
    assert "raise max_accumulation" in str(info.value)


def test_one_class():
    # 4 equal devices: 4 w = 200 forces w = 50 = 2 x 25 (50 > 32 rules out C = 1).
    cls = DeviceClass(2.0, 8, 32, 4)
    plan = solve_dd([cls], 200)
    assert (plan.batch_sizes, plan.accumulations, plan.makespan) == ((25,), (2,), 25.0)
    assert plan.earliest_finish == plan.makespan
    # 202 is no multiple of 4 devices.
    with pytest.raises(InfeasibleError, match=r"multiple of 4.*200 or 204"):
        solve_dd([cls], 202)


def test_fixed_accumulation():
    # Cmin = Cmax = 2: w is even in [20, 40].  w_1 + w_2 = 60 and the slow class
    # (v = 1) is cheapest at its least work 20 = 2 x 10, so w_1 = 40, z = 20.
    fast, slow = DeviceClass(3.0, 10, 20), DeviceClass(1.0, 10, 20)
    plan = solve_dd([fast, slow], 60, min_accumulation=2, max_accumulation=2)
    assert (plan.batch_sizes, plan.accumulations, plan.makespan) == ((20, 10), (2, 2), 20.0)
    with pytest.raises(InfeasibleError, match="multiple of 2"):
        solve_dd([fast, slow], 61, min_accumulation=2, max_accumulation=2)


def test_equal_speeds_split_evenly():
    # Without accumulation: 100 = 34 + 33 + 33, the extra sample to the lowest rank.
    plan = solve_dd_workers([1.5] * 3, 1, 100, 100, max_accumulation=1)
    assert plan.batch_sizes == (34, 33, 33)
    # With it: 1030 / 4 = 257.5, but 257 (prime > 128) and 259 = 7 x 37 are not in W;
    # 258 = 3 x 86 and 256 = 2 x 128 are: z = 258, three at 258 and one at 256 = 1030
    # (a minimum of 257 is impossible, 258 for all sums to 1032).
    plan = solve_dd_workers([2.0] * 4, 32, 128, 1030)
    assert work(plan) == (258, 258, 258, 256)
    assert plan.accumulations == (3, 3, 3, 2)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_equal_speeds_match_the_eq3_split(n):
    for total in (n, 3 * n + 1, 64 * n - 1):
        plan = solve_dd_workers([3.25] * n, 1, total, total, max_accumulation=1)
        assert list(plan.batch_sizes) == solve_batch_sizes([3.25] * n, total, 1)
        assert max(plan.batch_sizes) - min(plan.batch_sizes) <= 1


def test_a_series_of_equal_devices_is_one_class():
    # One class of 3 equal devices vs 3 single workers: 3 w = 99, w = 33.
    grouped = solve_dd([DeviceClass(1.0, 10, 40, 3)], 99, max_accumulation=1)
    alone = solve_dd_workers([1.0] * 3, 10, 40, 99, max_accumulation=1)
    assert grouped.worker_batch_sizes() == alone.worker_batch_sizes() == [33] * 3
    # 100 cannot be split over 3 tied devices, over 3 free workers it can.
    with pytest.raises(InfeasibleError, match="multiple of 3"):
        solve_dd([DeviceClass(1.0, 10, 40, 3)], 100, max_accumulation=1)
    assert solve_dd_workers([1.0] * 3, 10, 40, 100, max_accumulation=1).batch_sizes == (34, 33, 33)


def test_float_collisions_are_ranked_exactly():
    """43 / v0 and 43 / v1 round to the same float, yet worker 1 is (barely) faster."""
    speeds = [2.517348673344754, 2.5173486733447543]
    assert 43 / speeds[0] == 43 / speeds[1]
    assert Fraction(43) / Fraction(speeds[1]) < Fraction(43) / Fraction(speeds[0])
    plan = solve_dd_workers(speeds, 1, 100, 85, max_accumulation=1)
    assert plan.batch_sizes == (42, 43)
    assert list(plan.batch_sizes) == solve_batch_sizes(speeds, 85, 1)
    reverse = solve_dd_workers(speeds[::-1], 1, 100, 85, max_accumulation=1)
    assert reverse.batch_sizes == (43, 42)


# --- exactness against brute force and a MIP -------------------------------------------


def random_instance(rng, max_classes=3, max_count=3, max_span=8):
    classes = []
    for _ in range(int(rng.integers(1, max_classes + 1))):
        low = int(rng.integers(1, 7))
        speed = float(rng.choice(TIE_PRONE)) if rng.random() < 0.5 else float(rng.uniform(0.1, 10))
        high = low + int(rng.integers(0, max_span + 1))
        classes.append(DeviceClass(speed, low, high, int(rng.integers(1, max_count + 1))))
    cmin = int(rng.integers(1, 3))
    cmax = cmin + int(rng.integers(0, 4))
    least = sum(cls.count * cls.min_batch * cmin for cls in classes)
    most = sum(cls.count * cls.max_batch * cmax for cls in classes)
    return classes, int(rng.integers(least, most + 1)), cmin, cmax


@pytest.mark.parametrize("seed", range(80))
def test_matches_brute_force_including_the_tie_break(seed):
    classes, total, cmin, cmax = random_instance(np.random.default_rng(seed))
    expected = brute_force(classes, total, cmin, cmax)
    if expected is None:
        with pytest.raises(InfeasibleError, match="reachable"):
            solve_dd(classes, total, min_accumulation=cmin, max_accumulation=cmax)
        return
    plan = solve_dd(classes, total, min_accumulation=cmin, max_accumulation=cmax)
    assert_valid(plan, classes, total, cmin, cmax)
    assert work(plan) == expected


def check_against_mip(classes, total, cmin, cmax):
    mip = mip_optimum(classes, total, cmin, cmax)
    if mip is None:
        with pytest.raises(InfeasibleError):
            solve_dd(classes, total, min_accumulation=cmin, max_accumulation=cmax)
        return
    plan = solve_dd(classes, total, min_accumulation=cmin, max_accumulation=cmax)
    assert_valid(plan, classes, total, cmin, cmax)
    assert plan.makespan == pytest.approx(mip[0], rel=1e-9, abs=0)
    # HiGHS's own z carries its feasibility tolerance (1e-7 absolute on w - z v).
    assert plan.makespan == pytest.approx(mip[1], rel=1e-6, abs=1e-6)


@needs_cvxpy
@pytest.mark.parametrize("seed", range(20))
def test_matches_cvxpy_highs_mip(seed):
    rng = np.random.default_rng(1000 + seed)
    check_against_mip(*random_instance(rng, max_classes=4, max_count=5, max_span=40))


@pytest.mark.parametrize(
    ("classes", "total", "cmin", "cmax"),
    [
        ([V100, P100], 768, 1, 5),
        ([V100, DeviceClass(100.0, 32, 48, 2)], 768, 1, 3),
        ([DeviceClass(v, 16, 64, n) for v, n in ((310, 3), (160, 5), (100, 7))], 1601, 1, 5),
        ([DeviceClass(v, 8, 8, 1) for v in (0.1, 0.3, 0.2, 0.7)], 96, 1, 5),  # C only
        ([DeviceClass(v, 5, 9, 1) for v in TIE_PRONE[:6]], 150, 2, 4),
    ],
)
@needs_cvxpy
def test_matches_cvxpy_highs_mip_fixed(classes, total, cmin, cmax):
    check_against_mip(classes, total, cmin, cmax)


# --- properties -------------------------------------------------------------------------


@st.composite
def planted(draw, max_classes=6, max_count=4):
    """An instance with a known feasible plan, and that plan's work per class."""
    cmin = draw(st.integers(1, 3))
    cmax = draw(st.integers(cmin, cmin + 4))
    speed = st.one_of(st.sampled_from(TIE_PRONE), st.floats(1e-2, 1e2))
    classes, ws = [], []
    for _ in range(draw(st.integers(1, max_classes))):
        low = draw(st.integers(1, 64))
        cls = DeviceClass(
            draw(speed), low, draw(st.integers(low, low + 128)), draw(st.integers(1, max_count))
        )
        classes.append(cls)
        ws.append(draw(st.integers(cls.min_batch, cls.max_batch)) * draw(st.integers(cmin, cmax)))
    total = sum(cls.count * w for cls, w in zip(classes, ws, strict=True))
    return classes, total, cmin, cmax, ws


@settings(
    max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(planted())
def test_properties(instance):
    classes, total, cmin, cmax, ws = instance
    plan = solve_dd(classes, total, min_accumulation=cmin, max_accumulation=cmax)
    assert_valid(plan, classes, total, cmin, cmax)
    # Never worse than the planted plan, exactly.
    assert max(exact_times(work(plan), classes)) <= max(exact_times(ws, classes))
    # Deterministic, and a power-of-two speed scale changes nothing but the times.
    assert solve_dd(classes, total, min_accumulation=cmin, max_accumulation=cmax) == plan
    scaled = [DeviceClass(c.throughput * 8, c.min_batch, c.max_batch, c.count) for c in classes]
    assert work(solve_dd(scaled, total, min_accumulation=cmin, max_accumulation=cmax)) == work(plan)
    # Letting every worker choose alone can only help.
    alone = solve_dd_workers(
        [c.throughput for c in classes for _ in range(c.count)],
        [c.min_batch for c in classes for _ in range(c.count)],
        [c.max_batch for c in classes for _ in range(c.count)],
        total,
        min_accumulation=cmin,
        max_accumulation=cmax,
    )
    assert alone.makespan <= plan.makespan


# --- large instances ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_without_accumulation_it_is_eq3(seed):
    """Cmin = Cmax = 1 and no memory bound: eq. 4 is eq. 3, whose solver is certified."""
    rng = np.random.default_rng(seed)
    speeds = (100 * rng.lognormal(0, 1, 1000)).tolist()
    total = 64 * 1000 + int(rng.integers(0, 1000))
    plan = solve_dd_workers(speeds, 1, total, total, max_accumulation=1)
    assert sum(plan.batch_sizes) == total and min(plan.batch_sizes) >= 1
    assert plan.makespan == makespan(solve_batch_sizes(speeds, total, 1), speeds)


def cpu_seconds(call):
    call()  # warm-up
    start = time.process_time()
    result = call()
    return time.process_time() - start, result


def test_1000_workers_solve_fast():
    """Measured 1.4-16 ms (3-4 series) and 7-21 ms (distinct speeds) median CPU time."""
    series = [
        DeviceClass(310.0, 32, 160, 103),
        DeviceClass(160.0, 32, 96, 397),
        DeviceClass(100.0, 32, 64, 301),
        DeviceClass(70.0, 24, 48, 199),
    ]
    seconds, plan = cpu_seconds(lambda: solve_dd(series, 64037))
    assert_valid(plan, series, 64037)
    assert seconds < 0.5
    rng = np.random.default_rng(7)
    speeds = (100 * rng.lognormal(0, 0.5, 1000)).tolist()
    lows = rng.integers(16, 64, 1000)
    highs = (lows + rng.integers(0, 200, 1000)).tolist()
    seconds, plan = cpu_seconds(lambda: solve_dd_workers(speeds, lows.tolist(), highs, 64321))
    workers = [DeviceClass(v, int(a), b) for v, a, b in zip(speeds, lows, highs, strict=True)]
    assert_valid(plan, workers, 64321)
    assert seconds < 0.5


# --- infeasible and bad input -------------------------------------------------------------


def test_unreachable_batch_names_the_nearest_reachable_ones():
    # W = {5, 10} and {7}: the reachable totals are 12 and 17 only.
    classes = [DeviceClass(1.0, 5, 5), DeviceClass(1.0, 7, 7)]
    with pytest.raises(InfeasibleError, match="nearest reachable global batches are 12 and 17"):
        solve_dd(classes, 15, max_accumulation=2)
    assert work(solve_dd(classes, 17, max_accumulation=2)) == (10, 7)


@pytest.mark.parametrize(
    ("classes", "total", "kwargs", "fragments"),
    [
        ([V100, P100], 100, {}, ["below the smallest step", "128", "at least 128"]),
        ([V100, P100], 5000, {}, ["exceeds the largest step", "1600", "raise max_accumulation"]),
        ([DeviceClass(1.0, 9, 8)], 50, {}, ["class 0", "min_batch 9 exceeds max_batch 8"]),
        ([DeviceClass(0.0, 1, 8)], 5, {}, ["class 0", "finite number > 0"]),
        ([DeviceClass(1.0, 1, 8), DeviceClass(math.nan, 1, 8)], 5, {}, ["class 1", "nan"]),
        ([DeviceClass(1e-200, 1, 8), DeviceClass(1e200, 1, 8)], 5, {}, ["ratio"]),
        ([DeviceClass(1.0, 0, 8)], 5, {}, ["min_batch of class 0 is 0"]),
        ([DeviceClass(1.0, 1, 8, 0)], 5, {}, ["count of class 0 is 0"]),
        ([DeviceClass(1.0, 1.5, 8)], 5, {}, ["min_batch must be integers"]),
        ([DeviceClass(1.0, 1, 8)], 5.0, {}, ["global_batch must be integers"]),
        ([DeviceClass(1.0, 1, 8)], True, {}, ["global_batch must be integers"]),
        ([DeviceClass(1.0, 1, 8)], 0, {}, ["global_batch is 0"]),
        ([DeviceClass(1.0, 1, 8)], MAX_GLOBAL_BATCH + 1, {}, ["global_batch is", "1 to"]),
        ([DeviceClass(1.0, 1, 8)], 5, {"min_accumulation": 3, "max_accumulation": 2}, ["exceeds"]),
        ([DeviceClass(1.0, 1, 8)], 5, {"min_accumulation": 0}, ["min_accumulation is 0"]),
        ([], 5, {}, ["non-empty"]),
        ([(1.0, 1, 8)], 5, {}, ["DeviceClass"]),
    ],
)
def test_bad_input_raises_clear_error(classes, total, kwargs, fragments):
    with pytest.raises(InfeasibleError) as info:
        solve_dd(classes, total, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_workers_input_checks():
    with pytest.raises(InfeasibleError, match="count per class"):
        solve_dd_workers([1.0, 2.0], [1, 2, 3], 8, 10)
    with pytest.raises(InfeasibleError, match="throughputs must be numbers"):
        solve_dd_workers(["fast"], 1, 8, 10)
    plan = solve_dd_workers(np.array([1.0, 3.0]), np.int64(1), np.array([8, 8]), np.int32(16))
    assert plan.batch_sizes == (4, 6) and plan.accumulations == (1, 2)
