"""An fsync error on the WAL stops the supervisor at once (never retried); the run
stays resumable (no summary, agents keep the job running), and a resume completes
the job with every record trained."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.jobs import REPO, SCRIPTS, job_env, run, summary
from tests.test_dds_jobs import dataset_args, ledger_counts

pytestmark = pytest.mark.integration


def test_fsync_failure_stops_the_supervisor_and_resume_completes(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    run_dir = tmp_path / "run"
    count_file = tmp_path / "fsyncs"
    args = [
        "run", "--workers", "2", "--restart-scope", "process", "--run-dir", str(run_dir),
        *dataset_args(4000, 50, 1, 20), str(SCRIPTS / "dds_worker.py"), str(ledger), "0.005",
    ]  # fmt: skip
    failing = subprocess.run(
        [sys.executable, str(SCRIPTS / "dtlaunch_failing_fsync.py"), "20", str(count_file), *args],
        env=job_env({}),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failing.returncode == 2, failing.stderr
    assert "--resume" in failing.stderr
    assert "Input/output error" in failing.stderr
    assert count_file.read_text() == "21"  # the failed fsync was the last: no blind retry
    assert not (run_dir / "summary.json").exists()  # not ended: resumable

    resumed = run(["run", "--resume", str(run_dir)], env={}, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    data = summary(run_dir)
    assert (data["shards_total"], data["shards_done"]) == (80, 80)
    assert data["restarts"] == []  # the workers ran through the supervisor failure
    assert set(ledger_counts(ledger)) == set(range(4000))
