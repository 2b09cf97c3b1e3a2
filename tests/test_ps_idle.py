"""A worker waiting for data does not hold the parameter servers' BSP step.

Issue 12, defect 9: with the README's PS loop (plain ``job.batches()``), a worker
that finished its shard waited in ``batches()`` for more while the others, each
holding one of the last shards, waited at the servers' BSP barrier for its push:
the job sat there until stopped. The client now steps aside while its worker
waits for data (``PsIdle``) and rejoins every server at one common step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtlaunch.ps.optim import OptimizerConfig
from dtlaunch.ps.store import ParamStore

REPO = Path(__file__).resolve().parents[1]


def store(workers=(0, 1, 2), mode="bsp") -> ParamStore:
    s = ParamStore(mode=mode, workers=workers)
    s.seed(OptimizerConfig(name="sgd", lr=1.0).validate(), {0: torch.zeros(2)})
    return s


def push(s: ParamStore, worker: int, samples: int = 1, value: float = 1.0):
    return s.push(worker, s.version, samples, {0: torch.full((2,), value)})


def test_an_idle_worker_does_not_hold_the_step_and_its_going_idle_completes_one():
    s = store()
    push(s, 0)
    push(s, 1)
    update = s.set_idle(2)  # the step waited only for worker 2
    assert update is not None and update.applied == [0, 1] and s.version == 1
    assert push(s, 0).update is None
    assert push(s, 1).update is not None and s.version == 2  # steps go on without it


def test_an_active_worker_joins_the_current_step_when_no_gradient_is_in_yet():
    s = store()
    s.set_idle(2)
    assert s.activate(2) == 0 and 2 in s.members
    push(s, 0)
    assert push(s, 1).update is None  # waits for worker 2 again
    assert push(s, 2).update is not None


def test_an_active_worker_joins_the_next_step_when_the_current_one_went_on_without_it():
    s = store()
    s.set_idle(2)
    push(s, 0)  # step 0 under way without worker 2
    assert s.activate(2) == 1 and 2 not in s.members
    assert push(s, 1).update is not None  # step 0 does not wait for it
    assert 2 in s.members and s.version == 1
    push(s, 0)
    assert push(s, 1).update is None  # step 1 does
    assert push(s, 2).update is not None


def test_the_supervisors_membership_keeps_idle_and_left_workers_out():
    s = store()
    s.set_idle(2)
    s.leave(1)
    s.set_members([0, 1, 2, 3])
    assert s.members == {0, 3}
    assert s.activate(2) == 0 and s.members == {0, 2, 3}
    assert s.activate(1) == 0 and 1 not in s.members  # it left: never a member again
    assert s.activate(9) == 0 and 9 not in s.members  # not one of the job's workers


def test_a_worker_that_pushed_then_went_idle_rejoins_from_the_next_step():
    s = store()
    push(s, 2)
    s.set_idle(2)
    assert s.activate(2) == 1 and 2 in s.members
    push(s, 0)
    assert push(s, 1).update is not None and s.version == 1


def test_asp_has_no_membership_to_rejoin():
    s = store(mode="asp")
    s.set_idle(1)
    push(s, 0)
    assert s.activate(1) == s.version == 1


def run_readme_loop(tmp_path: Path, dataset_size: int, timeout: float) -> tuple[Path, list[dict]]:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir(parents=True)
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "--workers", "4", "--servers", "4",
        "--run-dir", str(run_dir), "--dataset-size", str(dataset_size), "--shard-size", "256",
        "--global-batch", "256", "--epochs", "1", "--output", "0",
        "--inject", "slowdown:role=server,ranks=1,factor=10",
        str(REPO / "tests/scripts/ps_readme_loop.py"), str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "log", "wb") as log:
        job = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        code = job.wait(timeout)
    except subprocess.TimeoutExpired:
        job.send_signal(2)
        job.wait(30)
        pytest.fail(f"the README's PS loop did not finish in {timeout:.0f}s (it hung before)")
    assert code == 0, (tmp_path / "log").read_text()[-3000:]
    return run_dir, [json.loads((out / f"{r}.json").read_text()) for r in range(4)]


@pytest.mark.integration
def test_the_readmes_ps_loop_finishes_with_a_slow_server(tmp_path):
    """The issue's setup: 4 workers, 4 servers, 32 shards of 256 (the last shorter),
    global batch 256, server 1 ten times slower. Before the fix the run hung at the
    end of the data (3 of 3 runs), a worker waiting for shards held the others' step."""
    run_dir, results = run_readme_loop(tmp_path, 8000, timeout=90)
    trained = sorted(r for result in results for r in result["records"])
    assert trained == list(range(8000))  # every record once: none lost, none twice
    assert all(result["final_loss"] < 30 for result in results)
    logs = "".join((run_dir / "logs" / f"server-{r}.log").read_text() for r in range(4))
    assert "waits for data; steps go on without it" in logs


@pytest.mark.slow
@pytest.mark.integration
def test_the_readmes_ps_loop_finishes_ten_times_in_a_row(tmp_path):
    """The end-of-data race in a loop: whichever worker runs out first, none hangs."""
    for attempt in range(10):
        _, results = run_readme_loop(tmp_path / str(attempt), 8000, timeout=90)
        assert sorted(r for res in results for r in res["records"]) == list(range(8000))
