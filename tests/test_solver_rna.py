"""RNA's pure core (§3.2-§4): staleness weights, learning-rate factor, grouping and
the power-of-d probe's response quantiles.

Hand-worked cases carry their arithmetic in comments; the quantile formula is held
against a Monte-Carlo of the probe itself, the rest against properties (hypothesis).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtlaunch.solvers.rna import (
    InfeasibleError,
    average_decay,
    lr_factor,
    momentum_for_staleness,
    probe_median_response,
    probe_response_quantile,
    split_groups,
    staleness_weights,
)

# --- §3.3 staleness weights ----------------------------------------------------------


def test_weights_grow_linearly_with_the_version():
    # k = 5, versions 3, 3, 5: tau = 5 - 3 = 2, weight t - (k - tau) + 1 = t - 3 + 1:
    # 1, 1, 3 -> / 5.
    assert staleness_weights([3, 3, 5], current=5, bound=4) == pytest.approx(
        [0.2, 0.2, 0.6], abs=1e-15
    )


def test_weights_of_figure_4_two_pending_gradients():
    # Fig. 4, round t+1 (t = 7): w_1 holds g computed on x_t and one on x_{t+1}:
    # tau = 1, weights 1 and 2 -> 1/3, 2/3.
    assert staleness_weights([7, 8], current=8, bound=3) == pytest.approx([1 / 3, 2 / 3])


def test_weights_drop_gradients_beyond_the_bound_and_rebase_on_the_kept_ones():
    # k = 6, bound 2: version 1 (gap 5) and 3 (gap 3) dropped; kept 4, 5, 6 -> tau = 2,
    # weights 4-4+1, 5-4+1, 6-4+1 = 1, 2, 3 -> / 6. The stalest kept one gets 1,
    # not 4-1+1 (tau is over the kept gradients).
    weights = staleness_weights([1, 4, 5, 3, 6], current=6, bound=2)
    assert weights == pytest.approx([0.0, 1 / 6, 2 / 6, 0.0, 3 / 6])
    assert weights[0] == 0.0
    assert weights[3] == 0.0


def test_weights_at_the_bound_are_kept():
    # gap exactly 2 = bound: kept (only a gap > bound is dropped).
    assert staleness_weights([4, 6], current=6, bound=2) == pytest.approx([1 / 4, 3 / 4])


def test_weights_with_bound_zero_keep_only_fresh_gradients_equally():
    assert staleness_weights([5, 4, 5], current=5, bound=0) == pytest.approx([0.5, 0.0, 0.5])


def test_one_gradient_gets_all_the_weight():
    assert staleness_weights([9], current=9, bound=0) == [1.0]
    assert staleness_weights([2], current=9, bound=7) == [1.0]


def test_weights_when_nothing_is_kept():
    assert staleness_weights([], current=3, bound=1) == []
    assert staleness_weights([0, 1], current=5, bound=2) == [0.0, 0.0]


def test_a_gradient_from_the_future_is_a_bug():
    with pytest.raises(ValueError, match=r"versions\[1\] is 6, after the current round 5"):
        staleness_weights([2, 6], current=5, bound=10)


@pytest.mark.parametrize(
    ("versions", "current", "bound", "match"),
    [
        ([1], 3, -1, "bound is -1"),
        ([1], -1, 3, "current is -1"),
        ([-1], 3, 3, r"versions\[0\] is -1"),
        ([1.5], 3, 3, r"versions\[0\] must be an integer"),
        ([True], 3, 3, "not a bool"),
    ],
)
def test_weights_reject_invalid_input(versions, current, bound, match):
    with pytest.raises(InfeasibleError, match=match):
        staleness_weights(versions, current=current, bound=bound)


def test_weights_accept_numpy_integers():
    versions = np.array([3, 3, 5], dtype=np.int64)
    assert staleness_weights(list(versions), current=np.int64(5), bound=4) == pytest.approx(
        [0.2, 0.2, 0.6]
    )


@settings(max_examples=300, deadline=None)
@given(
    current=st.integers(0, 60),
    bound=st.integers(0, 70),
    data=st.data(),
)
def test_weight_properties(current, bound, data):
    versions = data.draw(st.lists(st.integers(0, current), max_size=12))
    weights = staleness_weights(versions, current=current, bound=bound)
    assert len(weights) == len(versions)
    assert all(w >= 0 for w in weights)
    kept = [t for t in versions if current - t <= bound]
    if not kept:
        assert weights == [0.0] * len(versions)
        return
    assert math.fsum(weights) == pytest.approx(1.0, abs=1e-12)
    lowest = min(kept)
    unit = min(w for t, w in zip(versions, weights, strict=True) if t == lowest)
    for t, w in zip(versions, weights, strict=True):
        if current - t > bound:
            assert w == 0.0
        else:  # linear in the version, the stalest kept one counting 1
            assert w == pytest.approx((t - lowest + 1) * unit, rel=1e-12)


# --- §3.3 learning rate ----------------------------------------------------------------


def test_lr_factor_is_the_share_of_contributors():
    assert lr_factor(3, 4) == 0.75
    assert lr_factor(4, 4) == 1.0
    assert lr_factor(0, 4) == 0.0
    assert lr_factor(1.5, 6) == 0.25
    assert lr_factor(1, 1) == 1.0


@pytest.mark.parametrize(
    ("contributors", "world", "match"),
    [
        (1, 0, "world is 0"),
        (5, 4, r"contributors is 5; it must be a number in \[0, world=4\]"),
        (-0.5, 4, "contributors is -0.5"),
        (math.nan, 4, "contributors is nan"),
        (1, 2.0, "world must be an integer"),
    ],
)
def test_lr_factor_rejects_invalid_input(contributors, world, match):
    with pytest.raises(ValueError, match=match):
        lr_factor(contributors, world)


def test_momentum_fades_with_staleness_at_the_same_step():
    # Fresh gradients: the optimizer as configured.
    assert momentum_for_staleness(0.9, 0) == (0.9, 1.0)
    # Half a round old on average: half the momentum, the rate raised so that
    # lr / (1 - momentum) is the configured optimizer's.
    momentum, rate = momentum_for_staleness(0.9, 0.5)
    assert momentum == pytest.approx(0.45) and rate == pytest.approx(5.5)
    assert rate / (1 - momentum) == pytest.approx(1 / (1 - 0.9))
    # A round or more old: plain SGD at the step lr / (1 - 0.9).
    assert momentum_for_staleness(0.9, 1) == (0.0, pytest.approx(10.0))
    assert momentum_for_staleness(0.9, 2.3) == (0.0, pytest.approx(10.0))
    assert momentum_for_staleness(0.0, 3) == (0.0, 1.0)
    # Not corrected: no finite step to keep, or a step of another formula.
    assert momentum_for_staleness(1.0, 2) == (1.0, 1.0)
    assert momentum_for_staleness(0.9, 2, dampening=0.1) == (0.9, 1.0)


@pytest.mark.parametrize(
    ("momentum", "staleness", "match"),
    [(-0.1, 0, "momentum"), (float("nan"), 0, "momentum"),
     (0.9, -1, "staleness"), (0.9, float("inf"), "staleness")],
)  # fmt: skip
def test_momentum_for_staleness_rejects_invalid_input(momentum, staleness, match):
    with pytest.raises(InfeasibleError, match=match):
        momentum_for_staleness(momentum, staleness)


def test_the_average_s_decay_warms_up_to_the_configured_one():
    assert average_decay(0.9, 0) == pytest.approx(0.1)  # the first update is mostly kept
    assert average_decay(0.9, 1) == pytest.approx(2 / 11)
    decays = [average_decay(0.9, k) for k in range(200)]
    assert decays == sorted(decays)  # never decreases
    assert decays[80] == 0.9 and decays[79] < 0.9  # from the 81st update on: as configured
    assert average_decay(0.0, 5) == 0.0
    # 34 updates (a short job): the initial model's weight, prod(d_k), is
    # negligible, where a constant 0.9 keeps 0.9^34 = 3 % of it.
    assert math.prod(decays[:34]) < 1e-6 < 0.9**34


@pytest.mark.parametrize(
    ("average", "updates"), [(1.0, 0), (-0.1, 0), (float("nan"), 0), (0.5, -1)]
)
def test_average_decay_rejects_invalid_input(average, updates):
    with pytest.raises(InfeasibleError):
        average_decay(average, updates)


# --- §4 grouping ---------------------------------------------------------------------


def test_homogeneous_workers_stay_one_group():
    # mean 11, zeta 2 <= 11.
    assert split_groups({0: 10.0, 1: 11.0, 2: 12.0}) == [(0, 1, 2)]


def test_no_split_when_zeta_equals_v():
    # mean 2, zeta 3 - 1 = 2: the condition is zeta > v, strictly.
    assert split_groups({0: 1.0, 1: 2.0, 2: 3.0}) == [(0, 1, 2)]


def test_one_slow_worker_is_split_off():
    # mean 50/3 = 16.7, zeta 20 > 16.7: {0, 1} (10 <= v) and {2}.
    assert split_groups({2: 30.0, 0: 10.0, 1: 10.0}) == [(0, 1), (2,)]


def test_recursion_into_three_groups_fastest_first():
    # times 1, 1.2 | 4, 4.4 | 20, 21 on shuffled ranks.
    # top: mean 51.6 / 6 = 8.6, zeta 20 > 8.6 -> {1, 1.2, 4, 4.4} and {20, 21};
    # faster: mean 2.65, zeta 3.4 > 2.65 -> {1, 1.2} and {4, 4.4} (zeta 0.2 <= 1.1,
    # 0.4 <= 4.2); slower: zeta 1 <= 20.5.
    times = {5: 1.0, 2: 1.2, 0: 4.0, 4: 4.4, 1: 20.0, 3: 21.0}
    assert split_groups(times) == [(2, 5), (0, 4), (1, 3)]


def test_a_time_equal_to_the_mean_counts_as_faster():
    # mean 3, zeta 6 > 3: {0, 3} (3 <= v) and {6}; then {0, 3}: mean 1.5, zeta 3 >
    # 1.5 -> {0} and {3}.
    assert split_groups({0: 0.0, 1: 3.0, 2: 6.0}) == [(0,), (1,), (2,)]


def test_min_size_keeps_a_group_whole():
    # times 1, 1.2, 4 | 20, 21, 22: top mean 69.2 / 6 = 11.53, zeta 21 -> 3 + 3;
    # faster: mean 2.067, zeta 3 -> {1, 1.2} + {4}, a part of 1.
    times = {0: 1.0, 1: 1.2, 2: 4.0, 3: 20.0, 4: 21.0, 5: 22.0}
    assert split_groups(times) == [(0, 1), (2,), (3, 4, 5)]
    assert split_groups(times, min_size=2) == [(0, 1, 2), (3, 4, 5)]
    assert split_groups(times, min_size=3) == [(0, 1, 2), (3, 4, 5)]
    assert split_groups(times, min_size=4) == [(0, 1, 2, 3, 4, 5)]


def test_a_threshold_below_one_splits_a_milder_spread():
    # benchmarks/rna.py's scenario b: four workers at ~75 ms, four at ~125 ms.
    # v = 100, zeta = 50: the paper's zeta > v keeps them whole; zeta > 0.3 v
    # splits them, and each half (zeta 2 <= 0.3 x 75) stays whole.
    times = {r: 74.0 + 2.0 * (r % 2) for r in range(4)} | {
        r: 124.0 + 2.0 * (r % 2) for r in range(4, 8)
    }
    assert split_groups(times) == [tuple(range(8))]
    assert split_groups(times, threshold=0.3) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert split_groups({0: 1.0, 1: 1.0}, threshold=0.01) == [(0, 1)]  # zeta 0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InfeasibleError, match="threshold"):
            split_groups({0: 1.0}, threshold=bad)


def test_grouping_corners():
    assert split_groups({}) == []
    assert split_groups({7: 0.25}) == [(7,)]
    assert split_groups({0: 0.0, 1: 0.0}) == [(0, 1)]  # zeta 0 is not > v 0


@pytest.mark.parametrize(
    ("times", "min_size", "match"),
    [
        ({0: math.nan}, 1, "iteration time of rank 0 is nan"),
        ({0: math.inf}, 1, "iteration time of rank 0 is inf"),
        ({3: -1.0}, 1, "iteration time of rank 3 is -1.0"),
        ({-1: 1.0}, 1, "rank is -1"),
        ({0: 1.0}, 0, "min_size is 0"),
    ],
)
def test_grouping_rejects_invalid_input(times, min_size, match):
    with pytest.raises(InfeasibleError, match=match):
        split_groups(times, min_size=min_size)


times_st = st.dictionaries(
    st.integers(0, 500),
    st.floats(0, 1e3, allow_nan=False, allow_infinity=False),
    max_size=40,
)


def _splittable(times: list[float], min_size: int) -> bool:
    mean = math.fsum(times) / len(times)
    if not max(times) - min(times) > mean:
        return False
    faster = sum(1 for t in times if t <= mean)
    return faster >= min_size and len(times) - faster >= min_size


@settings(max_examples=300, deadline=None)
@given(times=times_st, min_size=st.integers(1, 4))
def test_grouping_properties(times, min_size):
    groups = split_groups(times, min_size=min_size)
    ranks = [r for g in groups for r in g]
    assert sorted(ranks) == sorted(times)  # a partition: every rank once
    assert all(list(g) == sorted(g) and g for g in groups)
    for g in groups:  # every group is done: homogeneous, or a split is too small
        assert not _splittable([times[r] for r in g], min_size)
    for a, b in itertools.pairwise(groups):  # fastest first, no overlap
        assert max(times[r] for r in a) <= min(times[r] for r in b)
    assert split_groups(dict(reversed(times.items())), min_size=min_size) == groups


# --- §3.2 probe response ---------------------------------------------------------------


def test_quantile_on_an_even_grid_is_the_closed_form():
    # residuals 0, 1, ..., 100: the linear sample quantile is F^-1(p) = 100 p exactly,
    # so the median of the first of d is 100 (1 - 2^(-1/d)).
    grid = list(range(101))
    assert probe_median_response(grid, 1) == pytest.approx(50.0)
    assert probe_median_response(grid, 2) == pytest.approx(100 * (1 - 2**-0.5))  # 29.29
    assert probe_median_response(grid, 3) == pytest.approx(100 * (1 - 2 ** (-1 / 3)))
    # q = 0.95 with 2 probes: 1 - 0.05^(1/2) = 0.7764.
    assert probe_response_quantile(grid, 2, 0.95) == pytest.approx(100 * (1 - 0.05**0.5))
    # small q: 1 - (1 - 1e-9)^(1/2) = 5e-10 (no cancellation to 0).
    assert probe_response_quantile(grid, 2, 1e-9) == pytest.approx(100 * 5e-10, rel=1e-6)


def test_more_probes_answer_sooner():
    sample = [0.5, 3.0, 7.0, 12.0, 40.0]
    medians = [probe_median_response(sample, d) for d in (1, 2, 3, 8)]
    assert medians == sorted(medians, reverse=True)
    assert medians[0] == 7.0  # one probe: the plain median


@pytest.mark.parametrize("probes", [1, 2, 3])
@pytest.mark.parametrize("q", [0.05, 0.5, 0.95])
def test_quantile_matches_a_monte_carlo_of_the_probe(probes, q):
    # The probe itself: draw `probes` residuals iid from the sample (with replacement,
    # so the sample is exactly the distribution F_n) and keep the first to be ready.
    # Checked in probability space: the share of draws at or below the predicted
    # quantile x must be q. Two errors: (1) F_n is a step function and x is
    # interpolated between order statistics, so F_n(x) is within 1/n of the level
    # 1 - (1 - q)^(1/d) and 1 - (1 - F_n(x))^d within d/n of q; (2) the share over M
    # draws has standard deviation sqrt(q (1 - q) / M) <= 0.00079 at M = 400,000;
    # 5 of those. A wrong level (say q itself, ignoring d, or 1 - (1 - q)^d) is off by
    # 0.04 or more in every case with d > 1.
    rng = np.random.default_rng(20201207)
    n, draws = 20_001, 400_000
    sample = rng.lognormal(mean=np.log(15.0), sigma=0.6, size=n)  # ms, long-tailed
    x = probe_response_quantile(sample.tolist(), probes, q)
    first = sample[rng.integers(0, n, size=(draws, probes))].min(axis=1)
    share = float(np.mean(first <= x))
    tolerance = probes / n + 5 * math.sqrt(q * (1 - q) / draws)
    assert abs(share - q) <= tolerance


@pytest.mark.parametrize(
    ("sample", "probes", "q", "match"),
    [
        ([], 2, 0.5, "non-empty"),
        ([1.0, math.nan], 2, 0.5, "finite times >= 0"),
        ([1.0, -2.0], 2, 0.5, "finite times >= 0"),
        ([1.0], 0, 0.5, "probes is 0"),
        ([1.0], 2, 0.0, "q is 0.0"),
        ([1.0], 2, 1.0, "q is 1.0"),
    ],
)
def test_quantile_rejects_invalid_input(sample, probes, q, match):
    with pytest.raises(InfeasibleError, match=match):
        probe_response_quantile(sample, probes, q)
