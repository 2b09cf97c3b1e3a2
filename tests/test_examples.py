"""The shipped examples run as documented: plain python and under dtlaunch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.jobs import REPO, kind, run, started, summary, wait_for_event, wait_until

pytestmark = pytest.mark.integration

SCORE = str(REPO / "examples" / "score_dds.py")


def scored_ids(out_dir):
    ids = []
    for path in out_dir.glob("*.tsv"):
        ids += [int(line.split("\t")[0]) for line in path.read_text().splitlines()]
    return ids


def test_score_dds_runs_standalone_for_debugging(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTLAUNCH_")}
    result = subprocess.run(
        [sys.executable, SCORE, str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(scored_ids(tmp_path / "out")) == list(range(5000))


def test_score_dds_scores_every_record_when_a_worker_is_killed(tmp_path):
    out, run_dir = tmp_path / "out", tmp_path / "run"
    args = [
        "run", "--workers", "3", "--restart-scope", "process", "--run-dir", str(run_dir),
        "--dataset-size", "30000", "--shard-size", "500", "--global-batch", "30", SCORE, str(out),
    ]  # fmt: skip
    with started(args, env={}, log=tmp_path / "console.log") as job:
        victim = wait_for_event(run_dir, kind("running", rank=2), timeout=60, what="worker 2")
        wait_until(lambda: len(scored_ids(out)) > 3000, timeout=60, what="scoring to start")
        os.kill(victim["pid"], signal.SIGKILL)
        assert job.wait(timeout=180) == 0, job.output()
    assert set(scored_ids(out)) == set(range(30000))
    data = summary(run_dir)
    assert data["shards_done"] == data["shards_total"] == 60
    assert [r["rank"] for r in data["restarts"]] == [2]


def test_train_allreduce_is_a_torchrun_script(tmp_path):
    result = run(
        [
            "run",
            "--workers",
            "2",
            "--run-dir",
            str(tmp_path / "run"),
            str(REPO / "examples" / "train_allreduce.py"),
            "--steps",
            "20",
        ],
        env={},
    )
    assert result.returncode == 0, result.stderr
    assert "done: final loss" in result.stdout


def test_the_demo_compares_bsp_with_nd_and_says_where_to_look(tmp_path):
    # `make demo` at a smaller size: two real jobs, the comparison, the pointers.
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo.py"), "--workers", "2", "--steps", "12",
         "--runs", str(tmp_path / "runs")],
        cwd=tmp_path, env={**os.environ, "COLUMNS": "120"}, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    text = " ".join(re.sub("[│┃]", " ", result.stdout).split())  # table rows as words
    assert text.count("watch it live in another terminal:") == 2
    assert "dtlaunch status runs/demo-bsp-" in text and "dtlaunch status runs/demo-nd-" in text
    for row in ("job time (JCT)", "training time", "records trained 384 384", "actions taken"):
        assert row in text, text
    bsp_dir, nd_dir = sorted((tmp_path / "runs").iterdir())  # bsp sorts before nd
    for run_dir in (bsp_dir, nd_dir):
        assert summary(run_dir)["status"] == "succeeded"
        assert (run_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"
        assert f"plot {run_dir.relative_to(tmp_path)}/timeline.png" in text
    assert summary(bsp_dir)["actions"] == {}
    assert "nd trained the same 384 records" in text
