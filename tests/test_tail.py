"""The end of the data: raising the batch of a worker that would end the job alone
(solvers/tail.py, the Balancer's end-of-data plan, the DDS's held records)."""

from __future__ import annotations

import math
import random

import pytest

from dtlaunch.sharding import DatasetSpec
from dtlaunch.solvers.tail import raise_for_tail, time_to_last_record
from dtlaunch.supervisor.control.actions import AdjustBatchSize
from dtlaunch.supervisor.control.monitor import DataEnd, Monitor
from dtlaunch.supervisor.control.policies import parse_policy
from dtlaunch.supervisor.dds.queue import ShardQueue

FIXED = (0.32, 1 / 120)  # a straggler losing 0.32 s a step (benchmarks/stragglers.py)
HEALTHY = (0.02, 1 / 120)


def simulate(lines, sizes, records):
    """BSP steps one by one: each as long as its slowest worker with records left."""
    left, total = list(records), 0.0
    while any(r > 0 for r in left):
        total += max(f + s * b for (f, s), b, r in zip(lines, sizes, left, strict=True) if r > 0)
        left = [max(0, r - b) for r, b in zip(left, sizes, strict=True)]
    return total


def test_the_time_to_the_last_record_is_the_steps_one_by_one():
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 6)
        lines = [(rng.uniform(0, 0.3), rng.uniform(0.001, 0.02)) for _ in range(n)]
        sizes = [rng.randint(1, 40) for _ in range(n)]
        records = [rng.choice([0, rng.randint(1, 200)]) for _ in range(n)]
        assert time_to_last_record(lines, sizes, records) == pytest.approx(
            simulate(lines, sizes, records)
        )


def test_a_shrunk_fixed_cost_straggler_takes_the_equal_share_for_its_last_records():
    # lb-bsp shrank worker 3 to 2 records a step; it holds a shard and a half at the
    # end, the others a step or two each: 40+ steps of 0.34 s alone, or 3-4 at 32.
    lines = [HEALTHY] * 3 + [FIXED]
    sizes, most, fewest = [40, 40, 40, 2], [80, 40, 64, 96], [16, 0, 0, 32]
    [r] = raise_for_tail(lines, sizes, most, fewest, [32] * 4, margin=0.02)
    assert (r.index, r.old, r.new) == (3, 2, 32)
    assert r.before_s == pytest.approx(simulate(lines, sizes, most))
    assert r.after_s == pytest.approx(simulate(lines, [40, 40, 40, 32], most))
    assert r.after_s < r.before_s / 5
    # ... and at the fewest records too the new plan is no worse
    assert simulate(lines, [40, 40, 40, 32], fewest) <= simulate(lines, sizes, fewest)


def test_two_shrunk_workers_are_both_raised_in_one_plan():
    # benchmarks/rna.py scenario b's end: workers 2 and 3 shrunk to 1 and 2 hold
    # 118 and 108 records. Raising either alone gains only down to the other's
    # steps; the plan raises both, each to the share's size for its records.
    lines = [HEALTHY, HEALTHY, (0.134, 0.0034), (0.158, 0.0034)]
    sizes, most, fewest = [30, 30, 1, 2], [0, 0, 118, 108], [0, 0, 54, 44]
    raises = raise_for_tail(lines, sizes, most, fewest, [16] * 4, margin=0.02)
    plan = list(sizes)
    for r in raises:
        plan[r.index] = r.new
    assert sorted(r.index for r in raises) == [2, 3] and min(plan[2:]) >= 14, raises
    assert {r.old for r in raises} == {1, 2}
    assert raises[-1].after_s == pytest.approx(simulate(lines, plan, most))
    assert simulate(lines, plan, most) < simulate(lines, sizes, most) / 5
    assert simulate(lines, plan, fewest) <= simulate(lines, sizes, fewest)


def test_a_proportional_straggler_is_left_alone():
    # 2.2x slower per record: half the records a step take half the time, so more
    # records a step gain nothing and would slow the others' last steps.
    lines = [(0.0, 1 / 120)] * 3 + [(0.0, 2.2 / 120)]
    assert raise_for_tail(lines, [36, 36, 36, 16], [128] * 4, [64] * 4, [32] * 4, margin=0.02) == []


def test_no_raise_past_the_cap_nor_one_that_is_worse_at_either_bound():
    lines = [HEALTHY] * 3 + [FIXED]
    # at its cap already
    assert raise_for_tail(lines, [40, 40, 40, 2], [80] * 3 + [96], [0] * 4, [32, 32, 32, 2],
                          margin=0.02) == []  # fmt: skip
    # The others hold many steps: a bigger batch for worker 3 would only slow
    # their steps (it ends before them either way).
    assert raise_for_tail(lines, [40, 40, 40, 2], [400, 400, 400, 4], [360, 360, 360, 2],
                          [32] * 4, margin=0.02) == []  # fmt: skip


def test_the_candidates_are_bounded_for_a_batch_of_one_holding_thousands():
    lines = [HEALTHY, FIXED]
    [r] = raise_for_tail(lines, [63, 1], [0, 5000], [0, 4000], [32, 32], margin=0.02)
    assert r.new == 32 and r.after_s == pytest.approx(math.ceil(5000 / 32) * (0.32 + 32 / 120))


def _snapshot(held, *, sizes=None, steps=6):
    """Four workers, worker 3 losing 0.32 s a step and shrunk to batch 2, with
    the windows' lines known (two batch sizes each)."""
    sizes = sizes or {0: 42, 1: 42, 2: 42, 3: 2}
    mon = Monitor(l_trans=5, l_per=5)
    for step in range(1, steps + 1):
        for r, b in sizes.items():
            b = b if step > 3 else 32  # equal sizes first: a line from two sizes
            line = FIXED if r == 3 else HEALTHY
            mon.report_worker(r, now=step * 0.4, step=step, batch_size=b,
                              compute_s=line[0] + line[1] * b, comm_s=0.0, samples=b)  # fmt: skip
    end = None if held is None else DataEnd(global_batch=128, held=held)
    return mon.snapshot(steps * 0.4, data_end=end, batch_plan=dict(sizes))


def test_the_balancer_plans_the_end_of_data_and_nothing_else():
    pol = parse_policy("lb-bsp:l_trans=5,l_per=5,apply_after=2,min_batch=2")
    # Shards still to hand out: the usual balancing (here: nothing to change).
    [before] = pol.decide(_snapshot(None))
    assert not isinstance(before, AdjustBatchSize), before
    # Every shard handed out: worker 3 holds 128 records (64 of them in the lease
    # it reads), the others 64 each.
    held = {0: (64, 64), 1: (64, 64), 2: (64, 64), 3: (128, 64)}
    [plan] = pol.decide(_snapshot(held))
    assert isinstance(plan, AdjustBatchSize), plan
    # 124 records at most: 4 steps at 31 as at 32, and a step of 31 is shorter
    assert plan.sizes == {0: 42, 1: 42, 2: 42, 3: 31}
    assert plan.reason.startswith("end of data") and "worker 3 2 -> 31" in plan.reason
    assert plan.inputs["records_left"][3] == [60, 124]  # 2 steps of 2 read before it applies
    # up to the equal share of the data set's global batch (128 / 4)
    assert plan.inputs["caps"] == dict.fromkeys(range(4), 32)
    # Nothing more once it is in force: what is left is these records.
    held_later = {0: (10, 10), 1: (10, 10), 2: (10, 10), 3: (100, 64)}
    [after] = pol.decide(_snapshot(held_later, sizes={0: 42, 1: 42, 2: 42, 3: 31}, steps=9))
    assert not isinstance(after, AdjustBatchSize) and "end of data" in after.reason


def test_the_queue_tells_the_records_held_once_every_shard_is_handed_out():
    spec = DatasetSpec(dataset_size=95, shard_size=10, epochs=1, global_batch=20, seed=3)
    queue = ShardQueue(spec)
    for worker, count in ((0, 4), (1, 3), (2, 2)):
        queue.fetch(worker, count)  # (the queue changes; the WAL would get the records)
    assert queue.todo_count == 1  # one shard still to hand out
    queue.fetch(2, 1)
    assert queue.todo_count == 0
    held = queue.held_records()
    assert sum(total for total, _ in held.values()) == 95
    assert {w: oldest for w, (_, oldest) in held.items()} == {
        w: queue.leases_of(w)[0].end for w in (0, 1, 2)
    }
    # one of the shards is the short one (95 records in shards of 10)
    lengths = sorted(x.end for w in (0, 1, 2) for x in queue.leases_of(w))
    assert lengths == [5] + [10] * 9


@pytest.mark.integration
def test_a_shrunk_straggler_does_not_end_the_job_alone_on_its_held_records(tmp_path):
    """lb-bsp shrinks a worker that loses 0.1 s a step to 2 records; when the data
    is all handed out it holds up to two shards (80 records): 40 steps alone.
    The end-of-data plan gives it its equal share back for them."""
    from tests.jobs import REPO, events, run, summary
    from tests.test_synthetic import final_line

    run_dir = tmp_path / "run"
    result = run(
        [
            "run", "--workers", "3", "--run-dir", str(run_dir), "--output", "0",
            "--policy", "lb-bsp:l_trans=0.6,l_per=1.2,apply_after=2,min_batch=2",
            "--control-interval", "0.2",
            "--inject", "persistent:role=worker,ranks=2,delay=0.1",
            str(REPO / "examples" / "synthetic.py"), "--dataset-size", "1800",
            "--shard-size", "40", "--global-batch", "30", "--capacity", "1000",
            "--prefetch", "1",
        ],
        env={},
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    _, _, steps, records = final_line((run_dir / "logs" / "worker-0.log").read_text())
    assert records == 1800 and summary(run_dir)["status"] == "succeeded"
    plans = [e for e in events(run_dir) if e.get("action") == "ADJUST_BS"]
    assert any(int(p["sizes"]["2"]) <= 3 for p in plans), plans  # it was shrunk
    # 60 steps of the data at 30 a step; without the end-of-data plan: 88 (a run).
    assert steps <= 70, steps
    # one plan or two (a second when the first, applied, left records that a
    # batch a little larger still reads in fewer steps), never past the equal
    # share of the global batch (30 / 3)
    ends = [p for p in plans if p["reason"].startswith("end of data")]
    assert 1 <= len(ends) <= 2 and int(ends[-1]["sizes"]["2"]) >= 8, ends
    assert all(int(p["sizes"]["2"]) <= 10 for p in ends), ends
