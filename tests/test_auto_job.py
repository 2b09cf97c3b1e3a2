"""``--policy auto`` on a live PS job over sshd: started with one worker, it
measures the CPU the worker and the server use, sizes the job by DLRover's
eq. 10 for the cores the hostfile declares, and scales the workers up while the
job trains; every record is trained once."""

from __future__ import annotations

import pytest

from tests.jobs import REPO, SCRIPTS, events, hostfile, run, summary

pytest.importorskip("torch")

DATASET = 4000


@pytest.mark.integration
def test_auto_sizes_a_ps_job_from_one_worker(sshd, tmp_path):
    a0, a1, _ = sshd.addresses
    hosts = hostfile(
        sshd,
        tmp_path / "hosts",
        [f"{a0} slots=3 servers=1 cpus=3", f"{a1} slots=2 cpus=2"],
    )
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run", "-H", str(hosts), "--workers", "1", "--servers", "1", "--run-dir", str(run_dir),
        "--dataset-size", str(DATASET), "--shard-size", "50", "--global-batch", "10",
        "--output", "0", "--control-interval", "0.5",
        "--policy", "auto:sample_s=3,interval_s=4,l_trans=2,l_per=4",
        str(SCRIPTS / "ps_cpu_worker.py"), str(out), "0.02",
    ]  # fmt: skip
    result = run(args, env=sshd.env(), timeout=300.0, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    log = events(run_dir)
    decisions = [e for e in log if e["kind"] == "decision" and e.get("action") == "SCALE_WORKERS"]
    assert decisions, [e for e in log if e["kind"] == "decision"][-5:]
    first = decisions[0]
    # Measured: one worker busy most of the time, the server far less.
    assert first["inputs"]["w_hat"] > 0.2
    assert first["inputs"]["s_hat"] < first["inputs"]["w_hat"]
    assert first["inputs"]["total_cores"] == 5.0
    assert first["count"] > 1  # more workers than the one it started with
    assert "predicted_rate" in first["inputs"] and "measured_rate" in first["inputs"]
    scales = [e for e in log if e["kind"] == "scale"]
    assert scales and scales[0]["workers"] == first["count"]
    # New ranks ran and trained; every record exactly once.
    trained = [
        int(r)
        for ledger in out.glob("*.ledger")
        for line in ledger.read_text().splitlines()
        for r in line.split()
    ]
    assert sorted(trained) == list(range(DATASET))
    assert len(list(out.glob("*.ledger"))) == scales[-1]["workers"]
    assert summary(run_dir)["status"] == "succeeded"
