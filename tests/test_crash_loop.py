"""Deterministic start-up crashes stop the job instead of burning its restarts
(issue 12, defect 8), on real jobs."""

from __future__ import annotations

import pytest

from tests.jobs import SCRIPTS, run, summary

pytestmark = pytest.mark.integration


def test_python_m_of_a_missing_module_stops_at_once(tmp_path):
    run_dir = tmp_path / "run"
    result = run(
        ["run", "--workers", "2", "--run-dir", str(run_dir), "-m", "no_such_module_xyz"],
        env={},
    )
    assert result.returncode == 1
    data = summary(run_dir)
    assert data["restarts"] == []
    assert data["failures"][0]["reason"] == "module not found"
    assert "No module named no_such_module_xyz" in result.stderr


def test_the_same_start_up_crash_twice_is_a_crash_loop(tmp_path):
    run_dir = tmp_path / "run"
    result = run(
        [
            "run",
            "--workers",
            "2",
            "--max-restarts",
            "5",
            "--run-dir",
            str(run_dir),
            str(SCRIPTS / "needs_env.py"),
        ],
        env={},
    )
    assert result.returncode == 1
    data = summary(run_dir)
    reasons = [f["reason"] for f in data["failures"]]
    assert reasons[-1] == "crash loop", reasons
    assert "needs_env.py:5" in data["failures"][-1]["error"]
    assert len(reasons) <= 4  # not 2 workers x 6 attempts
    assert "KeyError: 'DTLAUNCH_TEST_NEVER_SET'" in result.stderr
    assert "^^^" not in result.stderr
