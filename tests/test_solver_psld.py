"""PSLD load distribution (§4): fits, trigger, superior set and ε-greedy assignment.

Hand-worked cases carry their arithmetic in comments; a line-by-line transcription of
Alg. 2-3 (``reference_assign``) checks the fast implementation on random instances.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtlaunch.solvers.proportional import assign_proportional
from dtlaunch.solvers.psld import (
    CONFIDENCE_Z,
    BlockAssignment,
    InfeasibleError,
    ServerFit,
    assign_blocks,
    fit_server,
    predicted_makespan,
    predicted_times,
    should_reassign,
    speed_variation,
    superior_servers,
)

MIB = 2**20


def interval(mean: float, sem: float) -> ServerFit:
    """A fit whose bounds are ``mean -/+ 1.645 * sem`` at every size (alpha = 0)."""
    return ServerFit(alpha=0.0, beta=mean, var_center=sem * sem)


# Two servers used by the hand-worked assignments (units: bytes and seconds):
# server 0: Pred = 1 * s + 2 (slow link start-up), server 1: Pred = 2 * s (no latency).
TWO = [ServerFit(alpha=1.0, beta=2.0), ServerFit(alpha=2.0, beta=0.0)]


# --- §4.1 performance model ------------------------------------------------------------


def test_fit_recovers_an_exact_line():
    # t = 0.5 + s / 2^20 at s = 0, 1, 2, 3 MiB: t = 0.5, 1.5, 2.5, 3.5 (all exact floats).
    # mean s = 1.5 MiB, mean t = 2; Sxx = (2.25+0.25+0.25+2.25) MiB^2 = 5 MiB^2,
    # Sxy = 5 MiB -> alpha = 1 / MiB, beta = 2 - 1.5 = 0.5; residuals 0 -> SEM 0.
    fit = fit_server([0, MIB, 2 * MIB, 3 * MIB], [0.5, 1.5, 2.5, 3.5])
    assert fit.alpha == pytest.approx(1 / MIB, rel=1e-12)
    assert fit.beta == pytest.approx(0.5, rel=1e-12)
    assert fit.n == 4
    assert fit.center == 1.5 * MIB
    assert fit.mean(8 * MIB) == pytest.approx(8.5, rel=1e-12)
    assert fit.sem(8 * MIB) == 0.0
    assert fit.bounds(MIB) == (fit.mean(MIB), fit.mean(MIB))


def test_fit_noisy_line_and_its_standard_error_by_hand():
    # s = 1, 2, 3; t = 1, 3, 2. mean s = 2, mean t = 2, Sxx = 2, Sxy = 1
    # -> alpha = 0.5, beta = 2 - 0.5 * 2 = 1. Fitted 1.5, 2, 2.5: residuals -0.5, 1, -0.5,
    # RSS = 1.5, sigma^2 = RSS / (n - 2) = 1.5.
    # SEM(s)^2 = sigma^2 (1/n + (s - 2)^2 / Sxx): SEM(2)^2 = 0.5, SEM(4)^2 = 1.5 * 7/3 = 3.5.
    fit = fit_server([1, 2, 3], [1, 3, 2])
    assert (fit.alpha, fit.beta, fit.n) == (0.5, 1.0, 3)
    assert fit.var_center == pytest.approx(0.5)
    assert fit.var_slope == pytest.approx(0.75)
    assert fit.sem(2) == pytest.approx(math.sqrt(0.5))
    assert fit.sem(4) == pytest.approx(math.sqrt(3.5))
    lower, upper = fit.bounds(2)
    assert lower == pytest.approx(2 - 1.645 * math.sqrt(0.5))
    assert upper == pytest.approx(2 + 1.645 * math.sqrt(0.5))


def test_fit_is_exact_under_power_of_two_rescaling_of_sizes():
    # Sizes are rescaled by a power of two before fitting: tiny or huge sizes neither
    # underflow nor overflow sum(s^2), and the same samples in other units give the
    # same fit in those units, bit for bit (alpha scales by 2^k, var(alpha) by 4^k).
    base = fit_server([1, 2, 3], [1.0, 3.0, 2.0])
    for k in (-500, 60):
        scaled = fit_server([math.ldexp(v, k) for v in (1, 2, 3)], [1.0, 3.0, 2.0])
        assert scaled.alpha == math.ldexp(base.alpha, -k)
        assert (scaled.beta, scaled.var_center) == (base.beta, base.var_center)
        assert scaled.var_slope == math.ldexp(base.var_slope, -2 * k)
        assert scaled.sem(math.ldexp(4, k)) == base.sem(4)


def test_fit_with_one_size_goes_through_the_origin_and_keeps_the_classic_sem():
    # A window between two reassignments: the server moved 4 bytes every step.
    # alpha = sum(s t) / sum(s^2) = 4 * 8 / (4 * 16) = 0.5 = mean time / size, beta = 0.
    # sigma^2 = sum((t - 2)^2) / (n - 1) = 2/3; SEM(4) = 4 * sqrt(2/3 / 64) = sd / sqrt(n).
    times = [1.0, 2.0, 3.0, 2.0]
    fit = fit_server([4, 4, 4, 4], times)
    assert (fit.alpha, fit.beta, fit.center, fit.var_center) == (0.5, 0.0, 0.0, 0.0)
    assert fit.sem(4) == pytest.approx(statistics.stdev(times) / 2)
    assert fit.sem(8) == pytest.approx(2 * fit.sem(4))  # proportional model: SEM grows with s
    assert fit.mean(8) == 4.0


def test_fit_with_zero_variance_is_exact():
    fit = fit_server([4, 4, 4], [2.0, 2.0, 2.0])
    assert (fit.alpha, fit.beta) == (0.5, 0.0)
    assert fit.sem(4) == 0.0
    assert fit.sem(100) == 0.0


def test_fit_without_a_degree_of_freedom_has_an_unknown_noise():
    one = fit_server([4], [2.0])  # one sample: through the origin, alpha = 2 / 4
    assert (one.alpha, one.beta, one.n) == (0.5, 0.0, 1)
    assert one.sem(4) == math.inf
    assert one.bounds(4) == (-math.inf, math.inf)
    assert one.sem(0) == 0.0  # through the origin the model is exact at 0 bytes
    two = fit_server([1, 3], [2.0, 4.0])  # two sizes: the line t = s + 1, n - 2 = 0
    assert (two.alpha, two.beta) == (1.0, 1.0)
    assert two.sem(2) == math.inf


def test_fit_with_a_negative_slope_or_intercept_lies_on_an_edge():
    # t = 3, 2, 1 at s = 1, 2, 3: OLS slope -1 is not physical (more bytes, less time).
    # Edges of alpha, beta >= 0: the level beta = mean t = 2 leaves RSS 1 + 0 + 1 = 2;
    # through the origin alpha = (3 + 4 + 3) / 14 = 5/7 leaves residuals 16/7, 4/7, -8/7,
    # RSS 336/49 = 6.9. The level wins: a latency-bound server, sigma^2 = 2 / (n - 1) = 1,
    # SEM = 1 / sqrt(3) at every size.
    level = fit_server([1, 2, 3], [3.0, 2.0, 1.0])
    assert (level.alpha, level.beta) == (0.0, 2.0)
    assert level.sem(1) == level.sem(100) == pytest.approx(1 / math.sqrt(3))
    # t = 1, 3, 5: OLS t = 2 s - 1 has a negative latency. Level 3: RSS 4 + 0 + 4 = 8;
    # origin alpha = (1 + 6 + 15) / 14 = 11/7: residuals -4/7, -1/7, 2/7, RSS 21/49 = 3/7.
    # The origin wins; sigma^2 = 3/7 / 2, var(alpha) = 3/14 / 14 = 3/196.
    steep = fit_server([1, 2, 3], [1.0, 3.0, 5.0])
    assert (steep.alpha, steep.beta) == (pytest.approx(11 / 7), 0.0)
    assert steep.var_slope == pytest.approx(3 / 196)
    assert steep.sem(2) == pytest.approx(2 * math.sqrt(3 / 196))


@pytest.mark.parametrize(
    ("sizes", "seconds", "message"),
    [
        ([], [], "no samples to fit"),
        ([1, 2], [1.0], "2 sizes for 1 times"),
        ([1, -2], [1.0, 1.0], r"sizes\[1\] is -2.0"),
        ([1, 2], [1.0, math.nan], r"seconds\[1\] is nan"),
        ([1, 2], [1.0, math.inf], r"seconds\[1\] is inf"),
        ([0, 0], [1.0, 2.0], "every sample moved 0 bytes"),
        ([[1, 2]], [[1.0, 2.0]], "flat sequence"),
        (["a"], [1.0], "sequence of numbers"),
    ],
)
def test_fit_rejects_bad_samples(sizes, seconds, message):
    with pytest.raises(InfeasibleError, match=message):
        fit_server(sizes, seconds)


def test_server_fit_validates_its_fields_and_gives_speeds():
    with pytest.raises(InfeasibleError, match=r"ServerFit\.alpha is -1\.0; it must be finite"):
        ServerFit(alpha=-1.0, beta=0.0)
    with pytest.raises(InfeasibleError, match=r"ServerFit\.beta is nan"):
        ServerFit(alpha=1.0, beta=math.nan)
    with pytest.raises(
        InfeasibleError, match=r"ServerFit\.var_slope is -1\.0; it must be a variance"
    ):
        ServerFit(alpha=1.0, beta=0.0, var_slope=-1.0)
    with pytest.raises(InfeasibleError, match=r"ServerFit\.center is inf"):
        ServerFit(alpha=1.0, beta=0.0, center=math.inf)
    with pytest.raises(InfeasibleError, match=r"ServerFit\.n is True; it must be an integer"):
        ServerFit(alpha=1.0, beta=0.0, n=True)
    assert ServerFit(alpha=1.0, beta=0.0, var_center=math.inf).sem(1) == math.inf
    # 4 bytes on server 0 of TWO take 1 * 4 + 2 = 6 s: 4/6 bytes/s; on server 1 8 s.
    assert TWO[0].speed(4) == pytest.approx(4 / 6)
    assert TWO[1].speed(4) == 0.5
    assert ServerFit(alpha=0.0, beta=0.0).speed(4) == math.inf
    with pytest.raises(InfeasibleError, match="size > 0"):
        TWO[0].speed(0)


# --- trigger -------------------------------------------------------------------------


def test_trigger_threshold_is_strict():
    # (2 - 1) / 1 = 1: not above the paper's threshold 1; (2.5 - 1) / 1 = 1.5 is.
    assert speed_variation([1.0, 2.0, 1.5]) == 1.0
    assert not should_reassign([1.0, 2.0, 1.5])
    assert should_reassign([1.0, 2.5])
    assert should_reassign([1.0, 2.0], threshold=0.999)
    assert not should_reassign([3.0, 3.0, 3.0])
    assert not should_reassign([5.0])  # one server: nothing to balance


def test_trigger_fires_on_a_changed_server_set_and_on_stalled_servers():
    assert should_reassign([3.0, 3.0], server_set_changed=True)
    assert speed_variation([0.0, 1.0]) == math.inf
    assert should_reassign([0.0, 1.0])
    assert speed_variation([0.0, 0.0]) == 0.0  # all stalled: moving blocks cannot help
    assert speed_variation([math.inf, 1.0]) == math.inf


def test_trigger_on_speeds_predicted_at_a_common_size():
    # At 4 bytes: server 0 of TWO 4/6 bytes/s, server 1 4/8: (2/3 - 1/2) / (1/2) = 1/3.
    speeds = [fit.speed(4) for fit in TWO]
    assert speed_variation(speeds) == pytest.approx(1 / 3)
    assert not should_reassign(speeds)
    assert should_reassign(speeds, threshold=0.3)


@pytest.mark.parametrize(
    ("speeds", "threshold", "message"),
    [
        ([], 1.0, "no server speeds"),
        ([1.0, -1.0], 1.0, "speed of server 1 is -1.0"),
        ([1.0, math.nan], 1.0, "speed of server 1 is nan"),
        ([1.0, 2.0], -0.5, "threshold is -0.5"),
        ([1.0, 2.0], math.nan, "threshold is nan"),
    ],
)
def test_trigger_rejects_bad_input(speeds, threshold, message):
    with pytest.raises(InfeasibleError, match=message):
        should_reassign(speeds, threshold=threshold)


# --- §4.2 superior set (Alg. 1) -----------------------------------------------------


def test_superior_set_chains_overlapping_intervals():
    # SEM 0.1 -> half width 0.1645. Servers (index: mean -> [lower, upper]):
    #   0: 3.0 -> [2.8355, 3.1645]   1: 1.2 -> [1.0355, 1.3645]
    #   2: 1.0 -> [0.8355, 1.1645]   3: 1.5 -> [1.3355, 1.6645]
    # Alg. 1 by upper bound: 2 (threshold 1.1645); 1 (lower 1.0355 < 1.1645, threshold
    # 1.3645); 3 (1.3355 < 1.3645: it does not overlap server 2, it joins through server 1;
    # threshold 1.6645); 0 (2.8355 >= 1.6645): stop. The definition's sweep agrees.
    fits = [interval(3.0, 0.1), interval(1.2, 0.1), interval(1.0, 0.1), interval(1.5, 0.1)]
    for rule in ("definition", "algorithm1"):
        chosen = superior_servers(fits, 4 * MIB, rule=rule)
        assert chosen.servers == (1, 2, 3)
        assert chosen.probe_bytes == MIB  # Alg. 1 line 2: model size / number of servers
        assert chosen.lower[3] == pytest.approx(1.5 - CONFIDENCE_Z * 0.1) == pytest.approx(1.3355)
        assert chosen.upper[2] == pytest.approx(1.1645)
        assert not chosen.scale_out  # 3 superior >= 1/2 * 4


def test_scale_out_flag_below_half_the_initial_servers():
    fits = [interval(1.0, 0.1), interval(5.0, 0.1), interval(6.0, 0.1), interval(7.0, 0.1)]
    alone = superior_servers(fits, 4 * MIB)
    assert alone.servers == (0,)
    assert alone.scale_out  # 1 < 0.5 * 4
    assert not superior_servers(fits, 4 * MIB, initial_servers=2).scale_out  # 1 < 1: no
    assert not superior_servers(fits, 4 * MIB, scale_threshold=0.0).scale_out


def test_superior_set_is_judged_at_the_per_server_share_of_the_model():
    # Exact fits, server 0: 2 s per byte; server 1: 1 s per byte + 10 s.
    fits = [ServerFit(alpha=2.0, beta=0.0), ServerFit(alpha=1.0, beta=10.0)]
    # Model 8 bytes -> s = 4: server 0 takes 8 s, server 1 14 s.
    assert superior_servers(fits, 8).servers == (0,)
    # Model 40 bytes -> s = 20: server 0 takes 40 s, server 1 30 s.
    assert superior_servers(fits, 40).servers == (1,)


def test_definition_and_algorithm_1_differ_on_a_wide_interval():
    # 0: [0.8355, 1.1645]  1: [1.8355, 2.1645]  2: mean 3, SEM 1.5 -> [0.5325, 5.4675].
    # Alg. 1 by upper: 0 (threshold 1.1645), then 1 has lower 1.8355 >= 1.1645: stop -> {0}.
    # But server 2's lower bound 0.5325 is below server 0's upper bound: we are not sure
    # it is worse, so the definition takes it, and with its upper bound 5.4675 server 1 too.
    fits = [interval(1.0, 0.1), interval(2.0, 0.1), interval(3.0, 1.5)]
    assert superior_servers(fits, 3, rule="algorithm1").servers == (0,)
    assert superior_servers(fits, 3).servers == (0, 1, 2)


def test_definition_and_algorithm_1_differ_on_an_exact_tie():
    # SEM 0: both intervals are the point 2e-3 s. Alg. 1: lower 2e-3 >= threshold 2e-3.
    fits = [ServerFit(alpha=1e-9, beta=1e-3), ServerFit(alpha=1e-9, beta=1e-3)]
    assert superior_servers(fits, 2 * 10**6, rule="algorithm1").servers == (0,)
    assert superior_servers(fits, 2 * 10**6).servers == (0, 1)


def test_a_server_with_unknown_noise_cannot_be_ruled_out():
    unknown = fit_server([4 * MIB], [0.004])  # one sample: bounds (-inf, inf)
    fits = [interval(1.0, 0.1), interval(5.0, 0.1), unknown]
    assert superior_servers(fits, 12 * MIB).servers == (0, 1, 2)
    # Alg. 1 takes it last (upper bound inf) and stops before it at server 1's gap.
    assert superior_servers(fits, 12 * MIB, rule="algorithm1").servers == (0,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fits": [], "model_bytes": 1}, "no servers"),
        ({"fits": TWO, "model_bytes": -1}, "model_bytes is -1"),
        ({"fits": TWO, "model_bytes": math.inf}, "model_bytes is inf"),
        ({"fits": TWO, "model_bytes": 1, "rule": "paper"}, "unknown rule 'paper'"),
        ({"fits": TWO, "model_bytes": 1, "initial_servers": 0}, "initial_servers is 0"),
        ({"fits": TWO, "model_bytes": 1, "scale_threshold": -1.0}, "scale_threshold"),
        ({"fits": [TWO[0], "fast"], "model_bytes": 1}, r"fits\[1\] is a str"),
    ],
)
def test_superior_set_rejects_bad_input(kwargs, message):
    with pytest.raises(InfeasibleError, match=message):
        superior_servers(**kwargs)


# --- §4.3 assignment (Alg. 2-3) -----------------------------------------------------


def test_greedy_assignment_by_hand():
    # TWO: Pred0 = s + 2, Pred1 = 2 s; theta0 = theta1 = 1; cost = Pred/omega + S_r/S_assign.
    # block 4: S_assign = 0 -> time only: Pred0(4) = 6 < Pred1(4) = 8        -> server 0
    # block 2: omega = (Pred0(4) + Pred1(0)) / 2 = (6 + 0) / 2 = 3, S_assign = 4:
    #   0: 8/3 + 6/4 = 4.17;  1: Pred1(2) = 4 -> 4/3 + 2/4 = 1.83           -> server 1
    # block 2: omega = (6 + 4) / 2 = 5, S_assign = 6:
    #   0: 8/5 + 6/6 = 2.6;   1: Pred1(4) = 8 -> 8/5 + 4/6 = 2.27           -> server 1
    # block 4: omega = (6 + 8) / 2 = 7, S_assign = 8:
    #   0: Pred0(8) = 10 -> 10/7 + 8/8 = 2.43;  1: Pred1(8) = 16 -> 16/7 + 1 = 3.29 -> 0
    # Loads 8 and 4 bytes: times 8 + 2 = 10 and 2 * 4 = 8, makespan 10.
    sizes = [4, 2, 2, 4]
    result = assign_blocks(sizes, TWO, [0, 1], epsilon=0.0)
    assert result == BlockAssignment(
        servers=(0, 1, 1, 0),
        loads=(8, 4),
        times=(10.0, 8.0),
        makespan=10.0,
        superior=(0, 1),
        explored=(),
    )
    # Here that is optimal: every split of the 12 bytes is no better.
    best = min(predicted_makespan(sizes, s, TWO) for s in itertools.product((0, 1), repeat=4))
    assert best == 10.0
    assert predicted_makespan(sizes, (0, 0, 1, 1), TWO) == 12.0  # loads 6, 6: 8 and 12


def test_first_blocks_with_nothing_assigned_go_by_time_alone():
    # S_assign = 0 until a non-empty block is placed: the workload term S_r / S_assign
    # would divide by 0, but every S_r equals the block's size, so it is the same for all
    # servers and left out. Pred0 = s + 2, Pred1 = 2 s + 0.5:
    # block 0 (twice): Pred0(0) = 2 > Pred1(0) = 0.5                  -> server 1, twice
    # block 4: S_assign still 0: Pred0(4) = 6 < Pred1(4) = 8.5          -> server 0
    # Server 1 holds only empty blocks, yet is contacted: its time is Pred1(0) = 0.5.
    fits = [ServerFit(alpha=1.0, beta=2.0), ServerFit(alpha=2.0, beta=0.5)]
    result = assign_blocks([0, 0, 4], fits, [0, 1], epsilon=0.0)
    assert result.servers == (1, 1, 0)
    assert result.loads == (4, 0)
    assert result.times == (6.0, 0.5)
    assert result.makespan == 6.0


def test_omega_zero_lets_time_decide():
    # Pred0 = s, Pred1 = 2 s: before any block omega = (0 + 0) / 2 = 0, so theta0 / omega
    # is unbounded and the least time wins: block 4 -> Pred0(4) = 4 < 8        -> server 0
    # block 4: omega = (4 + 0) / 2 = 2, S_assign = 4:
    #   0: Pred0(8) / 2 + 8/4 = 6;  1: Pred1(4) / 2 + 4/4 = 5                 -> server 1
    fits = [ServerFit(alpha=1.0, beta=0.0), ServerFit(alpha=2.0, beta=0.0)]
    result = assign_blocks([4, 4], fits, [0, 1], epsilon=0.0)
    assert result.servers == (0, 1)
    assert result.times == (4.0, 8.0)


def test_time_only_greedy_and_ties_to_the_lowest_index():
    # theta1 = 0: cost = Pred / omega. TWO, blocks 4, 2, 2, 4:
    # block 4: 6 < 8 -> 0.  block 2: omega 3: 8/3 > 4/3 -> 1.
    # block 2: Pred0(6) = 8, Pred1(4) = 8: an exact tie        -> server 0 (lowest index)
    # block 4: Pred0(10) = 12, Pred1(6) = 12: a tie again       -> server 0
    # Loads 10 and 2: times 12 and 4, worse than the default weights' 10.
    result = assign_blocks([4, 2, 2, 4], TWO, [0, 1], epsilon=0.0, theta1=0.0)
    assert result.servers == (0, 1, 0, 0)
    assert result.makespan == 12.0


def test_exploitation_stays_in_the_superior_set_and_defaults_to_alg_1():
    fits = [interval(1.0, 0.1), interval(1.1, 0.1), interval(9.0, 0.1)]
    sizes = [MIB] * 10
    result = assign_blocks(sizes, fits, epsilon=0.0)
    assert result.superior == superior_servers(fits, 10 * MIB).servers == (0, 1)
    assert set(result.servers) == {0, 1}
    # Given explicitly, the superior set wins even over a faster server.
    assert set(assign_blocks(sizes, fits, [2], epsilon=0.0).servers) == {2}


def test_greedy_does_not_touch_the_rng():
    rng = random.Random(5)
    state = rng.getstate()
    assert assign_blocks([4, 2, 2, 4], TWO, [0, 1], rng=rng, epsilon=0.0).servers == (0, 1, 1, 0)
    assert rng.getstate() == state


def test_exploration_is_reproducible_and_leaves_the_superior_set():
    fits = [interval(1.0, 0.1), interval(4.0, 0.1), interval(5.0, 0.1)]
    sizes = [4 * MIB] * 100
    strays = 0
    for seed in range(20):
        result = assign_blocks(sizes, fits, [0], rng=random.Random(seed))
        assert result == assign_blocks(sizes, fits, [0], rng=random.Random(seed))
        exploited = set(range(len(sizes))) - set(result.explored)
        assert all(result.servers[i] == 0 for i in exploited)
        strays += sum(server != 0 for server in result.servers)
    # 2000 blocks, each off server 0 with probability 0.1 * 2/3: about 133.
    assert 60 < strays < 250
    many = assign_blocks([MIB] * 1000, fits, [0], rng=random.Random(0))
    assert 60 < len(many.explored) < 140  # epsilon = 0.1 of 1000


def test_exploration_draws_follow_the_documented_protocol():
    # epsilon = 1: every block draws u = random() (< 1) then randrange(3).
    draws = random.Random(11)
    expected = []
    for _ in range(50):
        assert draws.random() < 1
        expected.append(draws.randrange(3))
    result = assign_blocks([MIB] * 50, [interval(1.0, 0.1)] * 3, rng=random.Random(11), epsilon=1.0)
    assert result.servers == tuple(expected)
    assert result.explored == tuple(range(50))


def test_predicted_times_count_a_server_once_it_holds_a_block():
    assert predicted_times([4, 0], (0, 1), TWO) == (6.0, 0.0)  # Pred1(0) = 0
    assert predicted_times([0], (0,), TWO) == (2.0, 0.0)  # an empty block still costs beta
    assert predicted_makespan([], (), TWO) == 0.0


@pytest.mark.parametrize(
    ("sizes", "kwargs", "message"),
    [
        ([4, -3], {}, r"size of block 1 \(bytes\) is -3; it must be an integer >= 0"),
        ([4, 1.5], {}, r"size of block 1 \(bytes\) must be an integer, got 1.5"),
        ([True], {}, "must be an integer, not a bool"),
        ([4], {"fits": []}, "no servers; pass one ServerFit per parameter server"),
        ([4], {"superior": [2]}, "superior server 2 does not exist; there are 2 fits"),
        ([4], {"superior": [0, 0]}, "repeat an index"),
        ([4], {"superior": []}, "superior set is empty"),
        ([4], {"epsilon": 1.5}, r"epsilon is 1.5; it must be a probability in \[0, 1\]"),
        ([4], {"epsilon": -0.1}, "epsilon is -0.1"),
        ([4], {"epsilon": 0.1, "rng": None}, r"needs rng=random.Random\(seed\)"),
        ([4], {"theta0": -1.0}, "theta0 is -1.0"),
        ([4], {"theta0": 0.0, "theta1": 0.0}, "both 0"),
        ([2**53, 1], {}, "the blocks total more than"),
    ],
)
def test_assignment_rejects_bad_input(sizes, kwargs, message):
    arguments = {"fits": TWO, "superior": None, "rng": random.Random(0), **kwargs}
    with pytest.raises(InfeasibleError, match=message):
        assign_blocks(sizes, **arguments)


def test_makespan_rejects_bad_assignments():
    with pytest.raises(InfeasibleError, match="1 servers for 2 blocks"):
        predicted_makespan([4, 4], (0,), TWO)
    with pytest.raises(InfeasibleError, match="block 1 is on server 2, but there are 2 fits"):
        predicted_makespan([4, 4], (0, 2), TWO)
    with pytest.raises(InfeasibleError, match="server of block 0 is -1"):
        predicted_makespan([4], (-1,), TWO)
    assert issubclass(InfeasibleError, ValueError)


def test_thousand_blocks_on_twenty_superior_servers_is_fast():
    draws = random.Random(3)
    fits = [
        ServerFit(alpha=draws.uniform(1e-9, 5e-9), beta=draws.uniform(1e-4, 1e-3))
        for _ in range(20)
    ]
    sizes = [draws.randint(1, 4 * MIB) for _ in range(1000)]
    best = math.inf
    for _ in range(3):
        start = time.process_time()
        result = assign_blocks(sizes, fits, range(20), rng=random.Random(0))
        best = min(best, time.process_time() - start)
    assert len(result.servers) == 1000
    assert best < 0.2, f"{best * 1e3:.1f} ms"


# --- properties -----------------------------------------------------------------------


def reference_assign(sizes, fits, superior, rng, epsilon, theta0=1.0, theta1=1.0):
    """Alg. 3 with Alg. 2 transcribed line by line (O(n^2)), corners as documented."""
    ps_set = range(len(fits))
    if superior is None:
        superior = superior_servers(fits, sum(sizes)).servers
    assign = {}
    for i, param in enumerate(sizes):
        if epsilon > 0 and rng.random() < epsilon:  # Rand() > 1 - epsilon
            assign[i] = rng.randrange(len(ps_set))  # Random(ps_set)
            continue
        s_assign = sum(sizes[p] for p in assign)
        on = {r: sum(sizes[c] for c in assign if assign[c] == r) for r in superior}
        omega = math.fsum(fits[r].alpha * on[r] + fits[r].beta for r in superior) / len(superior)
        best = None
        for r in sorted(superior):
            s_r = on[r] + param
            pred = fits[r].alpha * s_r + fits[r].beta
            share = theta1 * s_r / s_assign if s_assign > 0 else 0.0
            if omega > 0 and math.isfinite(theta0 / omega):
                cost = (theta0 / omega * pred + share,)
            else:
                cost = (pred, share)
            if best is None or cost < best[0]:
                best = (cost, r)
        assign[i] = best[1]
    return tuple(assign[i] for i in range(len(sizes)))


fit_values = st.sampled_from([0.0, 1e-9, 0.25, 0.5, 1.0, 2.0, 3.0])


@st.composite
def server_fits(draw, max_servers=6):
    count = draw(st.integers(1, max_servers))
    return [
        ServerFit(
            alpha=draw(fit_values),
            beta=draw(fit_values),
            center=draw(st.sampled_from([0.0, 5.0, 50.0])),
            var_center=draw(st.sampled_from([0.0, 0.01, 1.0, math.inf])),
            var_slope=draw(st.sampled_from([0.0, 1e-4, math.inf])),
        )
        for _ in range(count)
    ]


@st.composite
def instances(draw):
    fits = draw(server_fits())
    sizes = draw(st.lists(st.integers(0, 64), max_size=30))
    superior = draw(
        st.one_of(
            st.none(),
            st.sets(st.integers(0, len(fits) - 1), min_size=1).map(sorted),
        )
    )
    epsilon = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    seed = draw(st.integers(0, 2**32))
    return sizes, fits, superior, epsilon, seed


@settings(max_examples=200, deadline=None, derandomize=True)
@given(instances())
def test_assignment_properties_and_reference(instance):
    sizes, fits, superior, epsilon, seed = instance
    result = assign_blocks(sizes, fits, superior, rng=random.Random(seed), epsilon=epsilon)
    assert len(result.servers) == len(sizes)  # every block placed exactly once
    assert all(0 <= r < len(fits) for r in result.servers)
    explored = set(result.explored)
    assert all(result.servers[i] in result.superior for i in range(len(sizes)) if i not in explored)
    if epsilon == 0:
        assert not explored
    assert sum(result.loads) == sum(sizes)
    for r in range(len(fits)):
        assert result.loads[r] == sum(
            s for s, on in zip(sizes, result.servers, strict=True) if on == r
        )
    assert result.times == predicted_times(sizes, result.servers, fits)
    assert result.makespan == predicted_makespan(sizes, result.servers, fits)
    again = assign_blocks(sizes, fits, superior, rng=random.Random(seed), epsilon=epsilon)
    assert again == result
    expected = reference_assign(sizes, fits, superior, random.Random(seed), epsilon)
    assert result.servers == expected


def separated(chosen, lower, upper):
    outside = [lower[r] for r in range(len(lower)) if r not in chosen]
    return not outside or max(upper[r] for r in chosen) < min(outside)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.sampled_from([1.0, 1.2, 1.5, 2.0, 4.0]), st.sampled_from([0.0, 0.1, 1.0])),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_superior_set_is_the_unique_minimal_separated_set(intervals, unknown_last):
    fits = [interval(mean, sem) for mean, sem in intervals]
    if unknown_last:
        fits[-1] = ServerFit(alpha=1.0, beta=0.0, var_slope=math.inf)  # bounds (-inf, inf)
    result = superior_servers(fits, 3.0 * len(fits))
    lower, upper = result.lower, result.upper
    assert separated(result.servers, lower, upper)
    subsets = [
        set(c)
        for k in range(1, len(fits) + 1)
        for c in itertools.combinations(range(len(fits)), k)
        if separated(c, lower, upper)
    ]
    smallest = min(len(c) for c in subsets)
    assert [c for c in subsets if len(c) == smallest] == [set(result.servers)]
    literal = superior_servers(fits, 3.0 * len(fits), rule="algorithm1")
    assert set(literal.servers) <= set(result.servers)
    best_upper = min(range(len(fits)), key=lambda r: (upper[r], r))
    assert best_upper in literal.servers


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.floats(0, 1e-6),
    st.floats(0, 1e-2),
    st.sets(st.integers(0, 64 * MIB), min_size=3, max_size=12),
)
def test_fit_recovers_noiseless_lines(alpha, beta, sizes):
    xs = sorted(sizes)
    fit = fit_server(xs, [alpha * x + beta for x in xs])
    scale = alpha * max(xs) + beta
    for x in xs:
        assert fit.mean(x) == pytest.approx(alpha * x + beta, rel=1e-9, abs=1e-12 + 1e-9 * scale)
    assert fit.sem(xs[0]) <= 1e-9 * scale + 1e-15


def test_proportional_assignment_gives_bytes_by_speed_largest_block_first():
    # Speeds 3:1: of 8 equal blocks the fast server takes 6, the slow one 2.
    assert sorted(assign_proportional([10] * 8, [3.0, 1.0])) == [0] * 6 + [1] * 2
    # Largest first: the 40-byte block goes to the fastest, the rest even out.
    owner = assign_proportional([5, 40, 5, 5, 5], [2.0, 1.0, 1.0])
    assert owner[1] == 0
    loads = [
        sum(s for s, j in zip([5, 40, 5, 5, 5], owner, strict=True) if j == r) for r in range(3)
    ]
    assert loads == [40, 10, 10]
    # Equal times go to the lowest index.
    assert assign_proportional([1, 1], [1.0, 1.0]) == (0, 1)
    with pytest.raises(InfeasibleError, match="speeds must be"):
        assign_proportional([1], [0.0])
    with pytest.raises(InfeasibleError, match="speeds must be"):
        assign_proportional([1], [])
