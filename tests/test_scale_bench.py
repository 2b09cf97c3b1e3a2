"""benchmarks/scale.py --quick (issue 18): a real supervisor against 100 simulated
hosts speaking the real wire, in ``make test-slow``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_scale_benchmark_quick_mode(tmp_path):
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "scale.py"), "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps, dds = json.loads(out.read_text())["results"]
    assert (steps["n"], steps["mode"], dds["mode"]) == (100, "steps", "dds")
    # Every worker reported and was stopped on request; the supervisor answered.
    assert steps["job_status"] == dds["job_status"] == "stopped"
    assert steps["reports_measured"] > 0 and steps["reports_not_arrived"] == 0
    assert steps["report_to_decision_p99_s"] <= 2 * steps["control_interval_s"]
    assert steps["status_live_queries"] == steps["status_queries"] > 0
    assert steps["status_rows"] == 100 and steps["status_cli_ok"]
    assert steps["false_heartbeat_lost"] == steps["false_unresponsive"] == 0
    assert steps["sim"]["plans_applied"] > 0  # nd balanced the slow worker; plans arrived
    assert dds["dds_ops_per_s"] > 0 and dds["sim"]["leases_acked"] > 0
    assert (tmp_path / "scale.md").read_text().startswith("| N |")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_status_snapshot_benchmark_quick_mode():
    """A 1,000-worker status answer against the checkout before its fast paths:
    measured 2x on a quiet machine; the margin here is for a loaded one."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "status_snapshot.py"), "--quick"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["workers"] == 1000 and row["speedup"] >= 1.3, row
