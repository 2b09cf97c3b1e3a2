"""The Controller end to end (AntDT §V-D/E, §VI-A): workers report their steps,
the policy decides every interval, and ADJUST_BS reaches every worker for the
same step, so a slow worker gets a smaller batch and the global batch holds."""

from __future__ import annotations

import pytest

from tests.jobs import SCRIPTS, events, run, summary
from tests.test_dds_jobs import dataset_args, ledger_counts

pytestmark = pytest.mark.integration

WORKER = str(SCRIPTS / "dds_worker.py")


def batch_sizes(ledger, rank):
    return [len(line.split()) for line in (ledger / f"{rank}-0.txt").read_text().splitlines()]


@pytest.mark.parametrize(
    "slowness",
    [
        ["", "0:1,1:1,2:4"],  # a slow worker (its own sleep per step)
        # An injected straggler (12 s; make test-slow: injection is covered by the
        # straggler and regroup jobs of make test).
        pytest.param(
            ["--inject", "persistent:role=worker,ranks=2,delay=0.06", ""],
            marks=pytest.mark.slow,
        ),
    ],
    ids=["slow-worker", "injected"],
)
def test_lb_bsp_shrinks_the_slow_workers_batch_and_keeps_the_global_batch(tmp_path, slowness):
    inject_args, slow_arg = slowness[:-1], slowness[-1]
    inject_args = [a for a in inject_args if a]
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    run_dir = tmp_path / "run"
    policy = "lb-bsp:l_trans=1.5,l_per=5,apply_after=25"
    result = run(
        [
            "run", "--workers", "3", "--restart-scope", "process", "--run-dir", str(run_dir),
            "--policy", policy, "--control-interval", "0.5", *inject_args,
            *dataset_args(4500, 100, 1, 30), WORKER, str(ledger), "0.02", slow_arg,
        ],
        env={},
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    decisions = [
        e for e in events(run_dir) if e["kind"] == "decision" and e.get("action") == "ADJUST_BS"
    ]
    assert decisions, [e["kind"] for e in events(run_dir)]
    first = decisions[0]
    sizes = {int(k): v for k, v in first["sizes"].items()}
    assert sum(sizes.values()) == 30  # the global batch is unchanged
    assert sizes[2] < 10 < max(sizes[0], sizes[1])  # the straggler gets less
    assert first["inputs"]  # what the decision saw is recorded with it
    # Every worker switched at the same step: before it 10 records a batch, after it the new size.
    step = first["apply_at_step"]
    for rank in range(3):
        seen = batch_sizes(ledger, rank)
        assert set(seen[: step - 1]) <= {10}
        # A worker whose data ended before the switch has no batch at that step:
        # the straggler reads fewer shards, and a late decision (a loaded machine)
        # may switch after its last step.
        assert len(seen) < step or seen[step - 1] == sizes[rank]
    data = summary(run_dir)
    assert data["actions"]["ADJUST_BS"] >= 1
    assert set(ledger_counts(ledger)) == set(range(4500))  # no record lost on the way
    if inject_args:
        injected = [e for e in events(run_dir) if e["kind"] == "injected"]
        assert injected and all(e["rank"] == 2 for e in injected)
