"""No false "dead" verdicts under CPU starvation (issue 12): with two busy loops
per core for five minutes, a job's agent and workers, slowed but alive, are
never declared unresponsive or lost, and nothing is restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.jobs import SCRIPTS, events, run, summary
from tests.test_dds_jobs import dataset_args

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUSY = "while True: pass"


@pytest.mark.timeout(900)
def test_two_busy_loops_per_core_for_five_minutes_give_no_false_dead_verdict(tmp_path):
    seconds = float(os.environ.get("DTLAUNCH_OVERSUBSCRIBE_S", "300"))
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    loops = [
        subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        # 2 workers x 1 record per step of 0.1 s: about `seconds` of training.
        records = max(40, int(seconds / 0.1) * 2)
        started = time.monotonic()
        argv = [
            "run", "--workers", "2", "--run-dir", str(tmp_path / "run"),
            *dataset_args(records, 20, 1, 2), str(SCRIPTS / "dds_worker.py"), str(ledger), "0.1",
        ]  # fmt: skip
        result = run(argv, env={}, timeout=seconds * 3 + 120)
        took = time.monotonic() - started
    finally:
        for loop in loops:
            os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert took >= seconds * 0.8  # the load was there for the whole run
    verdicts = [
        e
        for e in events(tmp_path / "run")
        if e["kind"] in ("heartbeat_lost", "agent_lost", "unresponsive", "failure", "stall")
    ]
    assert verdicts == []
    assert summary(tmp_path / "run")["restarts"] == []
