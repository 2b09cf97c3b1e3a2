"""Heartbeats over real SSH hosts: a SIGKILLed agent is reported dead within
3 x heartbeat interval and its processes restart; a SIGSTOPped agent or worker is
reported unresponsive, not dead, and recovers on SIGCONT."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.jobs import SCRIPTS, alive, events, hostfile, kind, started, wait_for_event, wait_until

pytestmark = pytest.mark.integration

INTERVAL = 0.5


def _start(sshd, tmp_path, *extra):
    hosts = hostfile(sshd, tmp_path / "hosts")
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run", "-H", str(hosts), "--workers", "3", "--kill-grace", "2", "--run-dir", str(run_dir),
        "--heartbeat-interval", str(INTERVAL), "--restart-scope", "process", *extra,
        str(SCRIPTS / "sleeper.py"), str(out), "600",
    ]  # fmt: skip
    return started(args, env=sshd.env(), log=tmp_path / "console.log"), run_dir, out


def _agent_up(run_dir, host):
    return wait_for_event(run_dir, kind("agent_up", host=host), timeout=60, what=f"agent on {host}")


def test_sigkilled_agent_is_dead_within_three_intervals_and_its_rank_restarts(sshd, tmp_path):
    job_ctx, run_dir, out = _start(sshd, tmp_path)
    with job_ctx:
        wait_until(lambda: len(list(out.glob("*.json"))) == 3, timeout=60, what="3 workers")
        agent = _agent_up(run_dir, "127.0.0.2")
        started_at = wall_before = time.time()
        os.kill(agent["pid"], signal.SIGKILL)
        lost = wait_for_event(
            run_dir, kind("agent_lost", host="127.0.0.2"), timeout=10, what="agent_lost"
        )
        assert lost["wall"] - wall_before <= 3 * INTERVAL + 0.5
        # The agent comes back and the lost rank restarts on it, same rank.
        wait_for_event(
            run_dir,
            lambda e: e["kind"] == "running" and e["rank"] == 1 and e["attempt"] == 1,
            timeout=60,
            what="rank 1 restarted",
        )
        wait_until(lambda: (out / "worker-1-1.json").exists(), timeout=30, what="rank 1 attempt 1")
        assert time.time() - started_at < 60
        restarts = [e for e in events(run_dir) if e["kind"] == "restart"]
        assert [(e["rank"], e["host"]) for e in restarts] == [(1, "127.0.0.2")]
        # The dead agent's worker and its grandchild did not survive it.
        old = json.loads((out / "worker-1-0.json").read_text())["pids"]
        wait_until(lambda: not any(alive(*p) for p in old), timeout=10, what="old rank 1 gone")


def test_sigstopped_agent_is_unresponsive_not_dead(sshd, tmp_path):
    job_ctx, run_dir, out = _start(sshd, tmp_path)
    with job_ctx:
        wait_until(lambda: len(list(out.glob("*.json"))) == 3, timeout=60, what="3 workers")
        agent = _agent_up(run_dir, "127.0.0.3")
        os.kill(agent["pid"], signal.SIGSTOP)
        try:
            wait_for_event(
                run_dir, kind("heartbeat_lost", host="127.0.0.3"), timeout=10, what="heartbeat_lost"
            )
            time.sleep(3 * INTERVAL * 2)
            assert not [
                e for e in events(run_dir) if e["kind"] in ("agent_lost", "restart", "failure")
            ]
        finally:
            os.kill(agent["pid"], signal.SIGCONT)
        wait_for_event(
            run_dir, kind("heartbeat_recovered", host="127.0.0.3"), timeout=10, what="recovery"
        )


def test_sigstopped_worker_is_reported_unresponsive_then_responsive(sshd, tmp_path):
    job_ctx, run_dir, _out = _start(sshd, tmp_path)
    with job_ctx:
        running = wait_for_event(run_dir, kind("running", rank=2), timeout=60, what="worker 2")
        os.kill(running["pid"], signal.SIGSTOP)
        try:
            event = wait_for_event(
                run_dir, kind("unresponsive", rank=2), timeout=10, what="unresponsive"
            )
            assert event["host"] == "127.0.0.3" and event["role"] == "worker"
        finally:
            os.kill(running["pid"], signal.SIGCONT)
        wait_for_event(run_dir, kind("responsive", rank=2), timeout=10, what="responsive")
        assert not [e for e in events(run_dir) if e["kind"] in ("exit", "failure")]
