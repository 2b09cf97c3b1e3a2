"""ADJUST_BS under step-time noise: a closed loop of Monitor and policy on a fake clock.

Each simulated BSP step reports every worker's step time to the Monitor, the
policy decides every ``interval`` seconds of simulated time, and a plan takes
effect at its ``apply_at_step``, as in a job. The workers' step times are
drawn from a seeded RNG: random delays alike on every worker (nothing to
balance), or a real straggler under a little noise (something to balance).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from dtlaunch.supervisor.control.actions import Action, AdjustBatchSize
from dtlaunch.supervisor.control.monitor import Monitor, WindowStats
from dtlaunch.supervisor.control.policies import parse_policy
from dtlaunch.supervisor.control.policies.base import pooled_sd

StepTime = Callable[[int, int, random.Random], float]


def closed_loop(
    policy: str,
    step_s: StepTime,
    *,
    share: int,
    workers: int = 8,
    steps: int = 250,
    seed: int = 1,
    decisions: list[Action] | None = None,
) -> tuple[int, int, dict[int, int]]:
    """(plans made, the smallest batch any worker ran, the sizes at the end);
    ``decisions`` collects every decision (plans, and why none was made)."""
    pol = parse_policy(policy)
    mon = Monitor(l_trans=pol.l_trans, l_per=pol.l_per)  # type: ignore[attr-defined]
    rng = random.Random(seed)
    sizes = dict.fromkeys(range(workers), share)
    pending: list[tuple[int, dict[int, int]]] = []
    now, next_decision, plans, smallest = 0.0, 0.5, 0, share
    for step in range(1, steps + 1):
        due = [p for p in pending if step >= p[0]]
        for p in due:
            sizes = dict(p[1])
            pending.remove(p)
        times = {r: step_s(r, b, rng) for r, b in sizes.items()}
        now += max(times.values()) + 0.005  # BSP: every step waits for the slowest
        for r, b in sizes.items():
            mon.report_worker(r, now=now, step=step, batch_size=b, compute_s=times[r],
                              comm_s=0.005, samples=b)  # fmt: skip
        while now >= next_decision:
            next_decision += 0.5
            for action in pol.decide(mon.snapshot(now, remaining_steps=steps - step)):
                if decisions is not None:
                    decisions.append(action)
                if isinstance(action, AdjustBatchSize):
                    plans += 1
                    pending.append((action.apply_at_step, action.sizes))
        smallest = min(smallest, *sizes.values())
    return plans, smallest, sizes


def alike(rank: int, batch: int, rng: random.Random) -> float:
    """benchmarks/rna.py's scenario a: 50 ms plus a uniform 0-50 ms delay on every
    worker, hardly growing with the batch."""
    return 0.05 + 0.0001 * batch + rng.uniform(0.0, 0.05)


@pytest.mark.parametrize("policy", ["nd", "lb-bsp", "nd:l_trans=1,l_per=3,apply_after=2"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_delays_alike_on_every_worker_do_not_drive_the_sizes_apart(policy, seed):
    plans, smallest, sizes = closed_loop(policy, alike, share=16, seed=seed)
    # Without the noise test (noise=0): up to 9 plans, batches of 1 (before the
    # peers' lines took the measured slope: 13 to 39 plans).
    assert smallest >= 4, (plans, sizes)
    assert plans <= 6, (plans, sizes)


def test_without_the_noise_test_the_sizes_drift_apart():
    # The loop above is not vacuous: with noise=0 the plans chase the delays.
    plans, smallest, sizes = closed_loop("nd:noise=0", alike, share=16, seed=4)
    assert plans >= 6 and smallest <= 2, (plans, sizes)


def mixed(rank: int, batch: int, rng: random.Random) -> float:
    """benchmarks/rna.py's scenario b: 50 ms hardly growing with the batch, plus a
    uniform delay of 0-50 ms on ranks 0-3 and of 50-100 ms on ranks 4-7 (a fixed
    cost that shrinking a batch cannot remove)."""
    delay = rng.uniform(0.05, 0.10) if rank >= 4 else rng.uniform(0.0, 0.05)
    return 0.05 + 0.0001 * batch + delay


@pytest.mark.parametrize("policy", ["nd", "lb-bsp"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_fixed_cost_under_heavy_noise_is_not_shrunk_plan_after_plan(policy, seed):
    # The first plan is eq. 3's (one batch size seen: proportional); after it the
    # slow workers' lines take the slope their change measured, ~0.1 ms a record,
    # and what shrinking them further would gain is within its uncertainty.
    plans, smallest, sizes = closed_loop(policy, mixed, share=16, seed=seed)
    assert plans <= 2 and smallest >= 8, (plans, sizes)


def test_a_plan_resting_on_an_uncertain_slope_says_so():
    # Seed 1: the measured slope is ~1 ms a record (the truth: 0.1) and a plan
    # shrinking the slow workers by ten records would promise ~11 ms a step.
    decisions: list[Action] = []
    closed_loop("nd", mixed, share=16, seed=1, decisions=decisions)
    reasons = {d.reason for d in decisions if not isinstance(d, AdjustBatchSize)}
    assert any("the peers' slope moves it by" in r for r in reasons), reasons
    # Every decision after the first plan's changes shows the slope it rests on
    # (s/record, weight): ~1 ms, ten times the truth, and a weight that says so.
    slope, weight = decisions[-1].inputs["measured_slope"]
    assert 0 <= slope < 0.003 and weight > 0


def test_without_the_slope_s_uncertainty_a_fixed_cost_is_shrunk_to_nothing():
    # Not vacuous: with noise=0 the gain a noisy slope promises is taken at its
    # word (and before the measured slope, the peers' compute per record, 40x
    # the truth, did it in every seed).
    plans, smallest, sizes = closed_loop("nd:noise=0", mixed, share=16, seed=1)
    assert plans >= 2 and smallest <= 3, (plans, sizes)


@pytest.mark.parametrize(
    ("step_s", "slow_batch"),
    [
        # a fixed 0.12 s lost each step by worker 3 (contention), 2 % noise
        (lambda r, b, rng: b / 120 * rng.uniform(0.98, 1.02) + (0.12 if r == 3 else 0), 20),
        # worker 3 2.2x slower per record (a slower device)
        (lambda r, b, rng: b / 120 * (2.2 if r == 3 else 1) * rng.uniform(0.98, 1.02), 16),
    ],
    ids=["fixed", "proportional"],
)
def test_a_real_straggler_under_a_little_noise_is_still_balanced(step_s, slow_batch):
    plans, _, sizes = closed_loop("nd", step_s, share=32)
    assert 1 <= plans <= 2
    assert sizes[3] <= slow_batch + 1 and sum(sizes.values()) == 256


def _window(reports: int, sd: float) -> WindowStats:
    return WindowStats(reports=reports, first_s=0.0, last_s=1.0, mean_bpt=0.1, mean_bpt_eq=0.1,
                       throughput=160.0, samples=16 * reports, sd_bpt=sd)  # fmt: skip


def test_the_noise_is_pooled_over_the_windows_by_their_degrees_of_freedom():
    assert pooled_sd([]) == 0.0
    assert pooled_sd([_window(1, 0.0), _window(1, 0.0)]) == 0.0  # one step each: no spread yet
    # (2 - 1) x 0.01² + (5 - 1) x 0.02² over 5 degrees of freedom
    assert pooled_sd([_window(2, 0.01), _window(5, 0.02), _window(1, 0.0)]) == pytest.approx(
        ((0.01**2 + 4 * 0.02**2) / 5) ** 0.5
    )


def test_a_plan_within_the_noise_says_so():
    pol = parse_policy("lb-bsp:l_trans=10,l_per=10,apply_after=2")
    mon = Monitor(l_trans=10, l_per=10)
    rng = random.Random(3)
    for step in range(1, 6):
        for r in range(4):
            # worker 0 is 8 ms slower on average, the steps vary by +-25 ms
            t = 0.1 + (0.008 if r == 0 else 0.0) + rng.uniform(-0.025, 0.025)
            mon.report_worker(r, now=step * 0.2, step=step, batch_size=16, compute_s=t,
                              comm_s=0.0, samples=16)  # fmt: skip
    [action] = pol.decide(mon.snapshot(1.0))
    assert not isinstance(action, AdjustBatchSize)
    assert "within the noise" in action.reason, action.reason
    [plan] = parse_policy("lb-bsp:l_trans=10,l_per=10,apply_after=2,noise=0").decide(
        mon.snapshot(1.0)
    )
    assert isinstance(plan, AdjustBatchSize)
