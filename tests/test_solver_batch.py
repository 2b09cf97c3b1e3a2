"""Exact batch balancing (AntDT eq. 3): optimality against brute force, a MIP and a certificate."""

from __future__ import annotations

import heapq
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtlaunch.solvers import InfeasibleError, makespan, solve_batch_sizes
from dtlaunch.solvers.batch import MAX_TOTAL

# Values whose ratios create exact and float-near ties (0.1 * 3 != 0.3 in floats).
TIE_PRONE = [0.1, 0.2, 0.3, 1 / 3, 0.7, 1.0, 2.0, 3.0, 7.0, 1e-3, 1e3, 0.001 * 3]


def exact_makespan(sizes, speeds):
    return max(Fraction(b) / Fraction(v) for b, v in zip(sizes, speeds, strict=True))


def assert_feasible(sizes, speeds, total, minimum):
    assert len(sizes) == len(speeds)
    assert all(type(b) is int for b in sizes)
    assert sum(sizes) == total
    assert min(sizes) >= minimum


def assert_certified_optimal(sizes, speeds, total, minimum):
    """No allocation finishes before z: below z worker i holds at most ceil(z v_i) - 1."""
    z = exact_makespan(sizes, speeds)
    if z == 0:
        return  # nothing finishes before time 0
    capacity = 0
    for v in speeds:
        zv = z * Fraction(v)
        most = -(-zv.numerator // zv.denominator) - 1
        assert most >= 0
        if most < minimum:
            return  # this worker alone cannot meet the minimum faster than z
        capacity += most
    assert capacity < total, "a strictly smaller makespan would be feasible"


def greedy_reference(speeds, total, minimum):
    """The documented tie-break: each unit to the soonest finisher, lowest rank on ties."""
    sizes = [minimum] * len(speeds)
    heap = [(Fraction(minimum + 1) / Fraction(v), i) for i, v in enumerate(speeds)]
    heapq.heapify(heap)
    for _ in range(total - minimum * len(speeds)):
        _, i = heapq.heappop(heap)
        sizes[i] += 1
        heapq.heappush(heap, (Fraction(sizes[i] + 1) / Fraction(speeds[i]), i))
    return sizes


def brute_force_optimum(speeds, total, minimum):
    best = None
    n = len(speeds)
    for cuts in itertools.combinations_with_replacement(range(total + 1), n - 1):
        sizes = [b - a for a, b in itertools.pairwise((0, *cuts, total))]
        if min(sizes) < minimum:
            continue
        value = exact_makespan(sizes, speeds)
        if best is None or value < best:
            best = value
    return best


def mip_optimum(speeds, total, minimum):
    cp = pytest.importorskip("cvxpy")
    n = len(speeds)
    sizes = cp.Variable(n, integer=True)
    z = cp.Variable()
    problem = cp.Problem(
        cp.Minimize(z),
        [sizes <= z * np.asarray(speeds), cp.sum(sizes) == total, sizes >= minimum],
    )
    problem.solve(solver="HIGHS", mip_rel_gap=0.0, mip_abs_gap=0.0)
    assert problem.status == "optimal"
    integral = [round(float(b)) for b in sizes.value]
    assert_feasible(integral, speeds, total, minimum)
    return float(exact_makespan(integral, speeds)), float(problem.value)


# --- exactness -------------------------------------------------------------------------


def test_small_hand_checked_cases():
    assert solve_batch_sizes([1, 1, 1, 1], 10) == [3, 3, 2, 2]
    assert solve_batch_sizes([1, 2, 3], 12) == [2, 4, 6]
    assert solve_batch_sizes([1000, 0.001], 200, 1) == [199, 1]
    assert solve_batch_sizes([3.0, 1.0], 7, 0) == [6, 1]
    assert solve_batch_sizes([5.0], 17, 3) == [17]
    assert solve_batch_sizes([2.0, 9.0], 4, 2) == [2, 2]
    assert solve_batch_sizes([2.0, 9.0], 0, 0) == [0, 0]


def test_float_collisions_are_ranked_exactly():
    """43 / v0 and 43 / v1 round to the same float, yet worker 1 is (barely) faster."""
    speeds = [2.517348673344754, 2.5173486733447543]
    assert 43 / speeds[0] == 43 / speeds[1]
    assert Fraction(43) / Fraction(speeds[1]) < Fraction(43) / Fraction(speeds[0])
    assert solve_batch_sizes(speeds, 85, 0) == [42, 43]
    assert solve_batch_sizes(speeds, 85, 0) == greedy_reference(speeds, 85, 0)


@pytest.mark.parametrize("seed", range(60))
def test_matches_brute_force_on_tiny_instances(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    total = int(rng.integers(0, 13))
    minimum = int(rng.integers(0, total // n + 1))
    if seed % 2:
        speeds = [float(x) for x in rng.choice(TIE_PRONE, n)]
    else:
        speeds = [float(x) for x in 10 ** rng.uniform(-3, 3, n)]
    sizes = solve_batch_sizes(speeds, total, minimum)
    assert_feasible(sizes, speeds, total, minimum)
    assert exact_makespan(sizes, speeds) == brute_force_optimum(speeds, total, minimum)
    assert sizes == greedy_reference(speeds, total, minimum)


@st.composite
def instances(draw, max_n=8, max_total=200):
    n = draw(st.integers(1, max_n))
    tie_prone = st.sampled_from(TIE_PRONE)
    spread = st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False)
    speeds = draw(st.lists(st.one_of(tie_prone, spread), min_size=n, max_size=n))
    total = draw(st.integers(0, max_total))
    minimum = draw(st.integers(0, total // n))
    return speeds, total, minimum


@settings(max_examples=120, deadline=None, derandomize=True)
@given(instances())
def test_matches_exact_greedy_reference(instance):
    speeds, total, minimum = instance
    sizes = solve_batch_sizes(speeds, total, minimum)
    assert_feasible(sizes, speeds, total, minimum)
    assert sizes == greedy_reference(speeds, total, minimum)
    assert_certified_optimal(sizes, speeds, total, minimum)


def check_against_mip(speeds, total, minimum):
    sizes = solve_batch_sizes(speeds, total, minimum)
    assert_feasible(sizes, speeds, total, minimum)
    ours = makespan(sizes, speeds)
    mip_solution_value, mip_objective = mip_optimum(speeds, total, minimum)
    assert ours == pytest.approx(mip_solution_value, rel=1e-9, abs=0)
    # HiGHS's own z carries its feasibility tolerance (1e-7 absolute on B_i - z v_i).
    assert ours == pytest.approx(mip_objective, rel=1e-6, abs=1e-6)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(instances())
def test_matches_cvxpy_highs_mip(instance):
    check_against_mip(*instance)


@pytest.mark.parametrize(
    ("speeds", "total", "minimum"),
    [
        ([1.0] * 8, 200, 1),  # equal speeds
        ([1e-3, 1e3, 1e-3, 1e3], 200, 5),  # extreme spread, minimum binds
        ([0.1, 0.3, 0.2, 0.3, 0.1], 157, 3),  # float near-ties
        ([7.0, 3.5, 14.0, 1.75], 199, 0),  # exact power-of-two ties
        ([2.0, 3.0, 5.0, 7.0, 11.0, 13.0, 17.0, 19.0], 200, 20),  # minimum forces all
    ],
)
def test_matches_cvxpy_highs_mip_fixed(speeds, total, minimum):
    check_against_mip(speeds, total, minimum)


# --- properties ------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, derandomize=True)
@given(instances(max_n=30, max_total=5000))
def test_properties(instance):
    speeds, total, minimum = instance
    sizes = solve_batch_sizes(speeds, total, minimum)
    assert_feasible(sizes, speeds, total, minimum)
    for i, j in itertools.permutations(range(len(speeds)), 2):
        if speeds[i] > speeds[j]:
            assert sizes[i] >= sizes[j], "a faster worker got fewer samples"
        if speeds[i] == speeds[j]:
            assert abs(sizes[i] - sizes[j]) <= 1
            if i < j:
                assert sizes[i] >= sizes[j], "equal-speed ties go to the lowest rank"
    # Power-of-two scaling is exact in floats: identical answer.
    for scale in (2.0**-30, 0.5, 8.0, 2.0**40):
        assert solve_batch_sizes([v * scale for v in speeds], total, minimum) == sizes
    # Any other constant rounds each speed, but the optimum value scales continuously.
    scaled = [v * 3.7 for v in speeds]
    other = solve_batch_sizes(scaled, total, minimum)
    assert makespan(other, scaled) * 3.7 == pytest.approx(makespan(sizes, speeds), rel=1e-9, abs=0)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_equal_speeds_split_evenly(n):
    for total in (n, 3 * n + 1, 64 * n - 1, 1000 * n + n // 2):
        sizes = solve_batch_sizes([3.25] * n, total)
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)
        assert sum(sizes) == total


def test_accepts_numpy_inputs():
    speeds = np.array([1.0, 2.0, 4.0])
    assert solve_batch_sizes(speeds, np.int64(70), np.int32(0)) == [10, 20, 40]


# --- large instances: exact optimality certificate -------------------------------------


@pytest.mark.parametrize(
    ("n", "seed", "total_per_worker", "minimum", "kind"),
    [
        (1000, 0, 64, 1, "uniform"),
        (1000, 1, 10_000, 0, "lognormal"),
        (1000, 2, 64, 50, "lognormal"),  # minimum binds for the slow workers
        (10_000, 3, 64, 1, "uniform"),
        (10_000, 4, 1000, 16, "lognormal"),  # B = 10^7
        (10_000, 5, 64, 1, "tie_prone"),
        (10_000, 6, 65, 1, "equal"),
    ],
)
def test_large_instances_are_certified_optimal(n, seed, total_per_worker, minimum, kind):
    rng = np.random.default_rng(seed)
    speeds = {
        "uniform": lambda: rng.uniform(1, 100, n),
        "lognormal": lambda: rng.lognormal(0, 2, n),
        "tie_prone": lambda: rng.choice(TIE_PRONE, n),
        "equal": lambda: np.full(n, 0.3),
    }[kind]().tolist()
    total = total_per_worker * n + int(rng.integers(0, n))
    sizes = solve_batch_sizes(speeds, total, minimum)
    assert_feasible(sizes, speeds, total, minimum)
    assert_certified_optimal(sizes, speeds, total, minimum)
    if kind == "equal":
        assert max(sizes) - min(sizes) <= 1


def test_certificate_rejects_a_suboptimal_allocation():
    """The certificate used above can fail: one moved sample breaks it."""
    speeds = [1.0, 2.0, 3.0]
    sizes = solve_batch_sizes(speeds, 60, 1)
    worse = [sizes[0] + 1, sizes[1], sizes[2] - 1]
    with pytest.raises(AssertionError, match="smaller makespan"):
        assert_certified_optimal(worse, speeds, 60, 1)


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("speeds", "total", "minimum", "fragments"),
    [
        ([1.0, 1.0, 1.0], 5, 2, ["3 workers x minimum 2 = 6", "at most 1", "at least 6"]),
        ([1.0, 0.0], 5, 1, ["worker 1", "finite number > 0"]),
        ([-2.0, 1.0], 5, 1, ["worker 0", "-2.0"]),
        ([1.0, math.nan], 5, 1, ["worker 1", "nan"]),
        ([math.inf, 1.0], 5, 1, ["worker 0", "inf"]),
        ([], 5, 1, ["non-empty"]),
        ([[1.0, 2.0]], 5, 1, ["flat sequence"]),
        (["fast"], 5, 1, ["sequence of numbers"]),
        ([1.0], -1, 0, ["total is -1", ">= 0"]),
        ([1.0], 5, -1, ["minimum is -1", ">= 0"]),
        ([1.0], 5.0, 1, ["total must be an integer"]),
        ([1.0], True, 0, ["total must be an integer, not a bool"]),
        ([1.0], MAX_TOTAL + 1, 0, ["supported"]),
        ([1e-200, 1e200], 5, 1, ["ratio", "drop the stalled worker"]),
    ],
)
def test_bad_input_raises_clear_error(speeds, total, minimum, fragments):
    with pytest.raises(InfeasibleError) as info:
        solve_batch_sizes(speeds, total, minimum)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_makespan():
    assert makespan([2, 4, 6], [1.0, 2.0, 3.0]) == 2.0
    assert makespan([0, 0], [1.0, 5.0]) == 0.0
    with pytest.raises(InfeasibleError, match="one batch size per worker"):
        makespan([1, 2], [1.0])
    with pytest.raises(InfeasibleError, match="negative"):
        makespan([-1, 2], [1.0, 1.0])
    with pytest.raises(InfeasibleError, match="finite number > 0"):
        makespan([1], [0.0])
