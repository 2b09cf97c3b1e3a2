"""job.allreduce_gradients: with unequal batches the averaged gradient equals the
full-batch mean gradient of one process (AntDT ADJUST_BS keeps the update exact)."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.jobs import SCRIPTS, run

pytestmark = pytest.mark.integration


def _run_grad_script(tmp_path, script: str, workers: int):
    """Run ``script`` as a real job; returns the full-batch reference gradient and
    each rank's averaged gradient as the script saved it."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from weighted_grad import data, model
    finally:
        sys.path.remove(str(SCRIPTS))
    result = run(
        ["run", "--workers", str(workers), "--run-dir", str(tmp_path / "run"),
         "--dataset-size", "30", "--shard-size", "10", str(SCRIPTS / script), str(tmp_path)],
        env={},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    x, y = data()
    reference = model()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    got = [torch.load(tmp_path / f"{rank}.pt", weights_only=True) for rank in range(workers)]
    return [p.grad for p in reference.parameters()], got, (x, y, model)


def test_weighted_average_equals_the_full_batch_gradient(tmp_path):
    expected, got, (x, y, model) = _run_grad_script(tmp_path, "weighted_grad.py", 3)
    for rank, grads in enumerate(got):
        for g, e in zip(grads, expected, strict=True):
            assert torch.allclose(g, e, rtol=0, atol=1e-6), (rank, g, e)
    # A plain (unweighted) mean of the three slice gradients would differ.
    slices = [(0, 5), (5, 17), (17, 30)]
    plain = []
    for lo, hi in slices:
        m = model()
        torch.nn.functional.mse_loss(m(x[lo:hi]), y[lo:hi]).backward()
        plain.append(next(iter(m.parameters())).grad)
    assert not torch.allclose(sum(plain) / 3, expected[0], atol=1e-6)


def test_bsp_batches_keep_allreduce_workers_paired_to_the_end_of_dds_data(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    run_dir = tmp_path / "run"
    result = run(
        [
            "run", "--workers", "3", "--run-dir", str(run_dir), "--dataset-size", "1500",
            "--shard-size", "50", "--epochs", "2", "--global-batch", "21",
            str(SCRIPTS / "bsp_worker.py"), str(ledger), "2", "0.01",
        ],
        env={},
        timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    steps = {(ledger / f"{r}.steps").read_text() for r in range(3)}
    assert len(steps) == 1  # the same number of collective steps on every worker
    counts: dict[int, int] = {}
    for r in range(3):
        for line in (ledger / f"{r}.txt").read_text().splitlines():
            for record in map(int, line.split()):
                counts[record] = counts.get(record, 0) + 1
    assert set(counts) == set(range(1500))
    assert set(counts.values()) == {2}  # every record once per epoch


def test_a_worker_with_an_empty_batch_contributes_exact_zeros(tmp_path):
    """Issue 12, defect 11: the empty batch's NaN gradient times weight 0 stayed
    NaN and poisoned every worker's model."""
    expected, got, _ = _run_grad_script(tmp_path, "empty_batch_grad.py", 2)
    for rank, grads in enumerate(got):
        for g, e in zip(grads, expected, strict=True):
            assert not torch.isnan(g).any(), rank
            assert torch.allclose(g, e, rtol=0, atol=1e-9), (rank, g, e)


def test_allreduce_gradients_before_init_process_group_says_what_to_call():
    from dtlaunch.runtime.collective import allreduce_gradients

    with pytest.raises(RuntimeError, match=r"init_process_group\(backend='gloo'\)"):
        allreduce_gradients(torch.nn.Linear(2, 1), 3)


def test_dd_accumulation_steps_are_the_exact_global_batch_mean(tmp_path):
    """AntDT-DD through the real Controller, wire and SDK: after the plan rank 0
    makes 3 passes of 5 records and rank 1 one pass of 9 per step, and every
    step's allreduced gradient equals one process's mean gradient over all of
    that step's records (1e-6), although the two ranks hold 15 and 9 records
    in micro-batches of different sizes."""
    import json

    sys.path.insert(0, str(SCRIPTS))
    try:
        from dd_grad_worker import data, model
    finally:
        sys.path.remove(str(SCRIPTS))
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    result = run(
        ["run", "--workers", "2", "--run-dir", str(tmp_path / "run"), "--dataset-size", "1200",
         "--shard-size", "40", "--global-batch", "24", "--control-interval", "0.2",
         "--policy", "tests.scripts.dd_plan_policy:FixedPlan",
         str(SCRIPTS / "dd_grad_worker.py"), str(ledger), "0.05"],
        env={},
        timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [
        {r["step"]: r for r in map(json.loads, (ledger / f"{rank}.jsonl").read_text().splitlines())}
        for rank in range(2)
    ]
    assert steps[0].keys() == steps[1].keys()  # the same steps on both ranks
    x, y = data(1200)
    planned = 0
    for step in sorted(steps[0]):
        mine, theirs = steps[0][step], steps[1][step]
        records = [i for r in (mine, theirs) for b in r["micro"] for i in b]
        if [len(b) for b in mine["micro"]] == [5, 5, 5] and [
            len(b) for b in theirs["micro"]
        ] == [9]:
            planned += 1
        if not records:
            continue
        reference = model()
        torch.nn.functional.mse_loss(reference(x[records]), y[records]).backward()
        expected = [p.grad.reshape(-1) for p in reference.parameters()]
        for got in (mine["grad"], theirs["grad"]):
            for g, e in zip(got, expected, strict=True):
                assert torch.allclose(torch.tensor(g, dtype=torch.float64), e, rtol=0, atol=1e-6)
    assert planned >= 10, f"only {planned} steps ran the 3x5 + 1x9 plan"
    # every record once: accumulation loses and repeats nothing
    trained = sorted(i for s in steps for r in s.values() for b in r["micro"] for i in b)
    assert trained == list(range(1200))


def test_bsp_batches_yields_the_planned_passes_with_their_weights(tmp_path):
    """In one process (a gloo group of one): after an ADJUST_BS of 3 passes of 4
    records, each step yields three micro-batches weighted by their share of the
    step's records (the data's last step is short), step() in the middle of a
    step's passes is refused, and the DataLoader ack mode is refused with dd."""
    import torch.distributed as dist

    from dtlaunch.runtime.context import Job
    from dtlaunch.runtime.standalone import StandaloneSource
    from dtlaunch.sharding import DatasetSpec
    from dtlaunch.wire.messages import AdjustBatchSize, RankBatch

    class Planned(StandaloneSource):
        def __init__(self, spec):
            super().__init__(spec)
            share = RankBatch(rank=0, batch_size=4, accumulation=3)
            self.plan = [AdjustBatchSize(sizes=[share], apply_at_step=0)]

        def actions(self):
            out, self.plan = self.plan, []
            return out

    spec = DatasetSpec(dataset_size=23, shard_size=5, global_batch=6)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        job = Job(rank=0, world_size=1, restart_count=0, dataset=spec, source=Planned(spec))
        steps: list[list[tuple[int, float, bool]]] = [[]]
        for batch in job.bsp_batches():
            steps[-1].append((len(batch), job.micro_batch_weight, job.is_accumulation_boundary))
            if not job.is_accumulation_boundary:
                with pytest.raises(RuntimeError, match="is_accumulation_boundary is True"):
                    job.step()
                continue
            job.step()
            steps.append([])
        assert steps[0] == [(6, 1.0, True)]  # the plan applies from the next step
        assert job.accumulation == 3 and job.global_batch == 12
        third = pytest.approx(1 / 3)
        assert steps[1] == [(4, third, False), (4, third, False), (4, third, True)]
        assert sum(n for step in steps for n, _, _ in step) == 23  # every record, once
        last = [s for s in steps if s][-1]
        records = sum(n for n, _, _ in last)
        assert [w for _, w, _ in last] == pytest.approx([n / records for n, _, _ in last])
        job.close()
        guarded = Job(rank=0, world_size=1, restart_count=0, dataset=spec, source=Planned(spec))
        guarded.count_one_batch_per_step()
        batches = guarded.bsp_batches()
        next(batches)
        guarded.step()  # the dd plan applies from here
        with pytest.raises(RuntimeError, match="count_one_batch_per_step"):
            next(batches)
        guarded.close()
    finally:
        dist.destroy_process_group()
