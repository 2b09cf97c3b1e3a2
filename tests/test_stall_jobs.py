"""The stall watchdog on real jobs (issue 12): a job that stops moving is
reported with a diagnosis and its stuck workers restart as a retryable
failure; a job that can never move fails within its restarts instead of
hanging."""

from __future__ import annotations

import json
import time

import pytest

from tests.jobs import SCRIPTS, events, run, summary
from tests.test_dds_jobs import dataset_args

pytestmark = pytest.mark.integration

WORKER = str(SCRIPTS / "stall_worker.py")


def _run(tmp_path, *, hang_attempts: int, max_restarts: int):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = run(
        [
            "run",
            "--workers",
            "1",
            "--stall-timeout",
            "2",
            "--max-restarts",
            str(max_restarts),
            "--run-dir",
            str(run_dir),
            *dataset_args(200, 20, 1, 10),
            WORKER,
            "0",
            "5",
            str(hang_attempts),
        ],
        env={},
        timeout=120,
    )
    return run_dir, result, time.monotonic() - started


def test_a_hung_worker_is_reported_and_restarted_and_the_job_finishes(tmp_path):
    run_dir, result, _ = _run(tmp_path, hang_attempts=1, max_restarts=2)
    assert result.returncode == 0, result.stdout + result.stderr
    [stall] = [e for e in events(run_dir) if e["kind"] == "stall"]
    [proc] = stall["procs"]
    assert proc["proc"] == "worker-0" and proc["attempt"] == 0
    assert proc["last_step"] >= 4 and proc["last_report_ago_s"] >= 1.0
    assert stall["bound_s"] == 2.0 and stall["waited_s"] >= 2.0
    # Where it was stuck, from py-spy through its agent, before it was restarted.
    [stacks] = [e for e in events(run_dir) if e["kind"] == "stall_stacks"]
    frames = stacks["stacks"]["worker-0"]["frames"]
    assert frames[0].startswith("sleep") or frames[0].startswith("wait_forever_for_a_peer")
    assert any(f.startswith("wait_forever_for_a_peer (stall_worker.py:") for f in frames)
    log_text = (run_dir / "logs" / "worker-0.log").read_text()
    assert "stall: Python stacks (py-spy)" in log_text and "wait_forever_for_a_peer" in log_text
    replayed = run(["replay", str(run_dir)], env={}, timeout=60)
    assert "stacks: worker-0 in " in replayed.stdout
    status = run(["status", "--json", str(run_dir)], env={}, timeout=60)
    [stalled] = [a for a in json.loads(status.stdout)["actions"] if a["action"] == "STALL"]
    assert "worker-0 in wait_forever_for_a_peer" in stalled["reason"]
    data = summary(run_dir)
    assert data["status"] == "succeeded"
    assert [f["reason"] for f in data["failures"]] == ["stalled"]
    assert data["shards_done"] == data["shards_total"] == 10


def test_a_job_that_can_never_move_fails_within_its_restarts(tmp_path):
    run_dir, result, took = _run(tmp_path, hang_attempts=99, max_restarts=1)
    assert result.returncode == 1, result.stdout + result.stderr
    data = summary(run_dir)
    assert data["status"] == "failed"
    assert [f["reason"] for f in data["failures"]] == ["stalled", "stalled"]
    assert "used all 1 restarts" in data["reason"]
    assert took < 90  # two bounds of 2 s, two starts: bounded, never a hang
