"""Stopping jobs: SIGINT/SIGTERM to ``dtlaunch run`` leaves nothing behind on any host
and does not touch another job; agents outlive a SIGKILLed supervisor for
``--orphan-timeout`` and then stop everything."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.jobs import SCRIPTS, alive, events, hostfile, started, summary, wait_until

pytestmark = pytest.mark.integration


def _sleeper_args(hosts, run_dir, out, *extra):
    return [
        "run", "-H", str(hosts), "--workers", "3", "--kill-grace", "2", "--run-dir", str(run_dir),
        *extra, str(SCRIPTS / "sleeper.py"), str(out),
    ]  # fmt: skip


def _job_pids(out):
    return [tuple(p) for f in sorted(out.glob("*.json")) for p in json.loads(f.read_text())["pids"]]


def _agent_pids(run_dir):
    return {e["host"]: e["pid"] for e in events(run_dir) if e["kind"] == "agent_up"}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_process_on_every_host_but_not_another_job(sshd, tmp_path, signum):
    hosts = hostfile(sshd, tmp_path / "hosts")
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    out_a.mkdir()
    out_b.mkdir()
    env = sshd.env()
    with (
        started(
            _sleeper_args(hosts, tmp_path / "run-b", out_b), env=env, log=tmp_path / "b.log"
        ) as job_b,
        started(
            _sleeper_args(hosts, tmp_path / "run-a", out_a), env=env, log=tmp_path / "a.log"
        ) as job_a,
    ):
        wait_until(
            lambda: len(_job_pids(out_a)) == 6 and len(_job_pids(out_b)) == 6,
            timeout=90,
            what="both jobs running",
        )
        pids_a, pids_b = _job_pids(out_a), _job_pids(out_b)
        agents_a = _agent_pids(tmp_path / "run-a")
        assert len(agents_a) == 3
        t0 = time.monotonic()
        job_a.signal(signum)
        assert job_a.wait(timeout=15) == 1
        wait_until(
            lambda: not any(alive(*p) for p in pids_a),
            timeout=max(0.1, 15 - (time.monotonic() - t0)),
            what="job A's processes to be gone",
        )
        assert time.monotonic() - t0 < 15
        assert all(alive(*p) for p in pids_b), "job B was touched"
        assert job_b.proc.poll() is None
        assert summary(tmp_path / "run-a")["status"] == "stopped"
        stopped = [e for e in events(tmp_path / "run-a") if e["kind"] == "exit"]
        assert len(stopped) == 3 and all(e["requested"] for e in stopped)
        job_b.signal(signal.SIGTERM)
        assert job_b.wait(timeout=15) == 1
        wait_until(lambda: not any(alive(*p) for p in pids_b), timeout=15, what="job B gone")


def test_agents_outlive_a_killed_supervisor_until_the_orphan_timeout(sshd, tmp_path):
    hosts = hostfile(sshd, tmp_path / "hosts")
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    args = _sleeper_args(
        hosts, run_dir, out, "--orphan-timeout", "6", "--heartbeat-interval", "0.5"
    )
    with started(args, env=sshd.env(), log=tmp_path / "console.log") as job:
        wait_until(lambda: len(_job_pids(out)) == 6, timeout=60, what="3 workers")
        pids = _job_pids(out)
        agent_pids = list(_agent_pids(run_dir).values())
        job.signal(signal.SIGKILL)
        job.wait(timeout=5)
        killed_at = time.monotonic()
        time.sleep(3)  # half the orphan timeout: everything must still run
        assert all(alive(*p) for p in pids), "the job died with its supervisor"
        assert all(_pid_alive(p) for p in agent_pids)
        # Past the timeout (6 s) plus the kill grace (2 s), nothing is left.
        wait_until(
            lambda: not any(alive(*p) for p in pids) and not any(_pid_alive(p) for p in agent_pids),
            timeout=6 + 2 + 6 - (time.monotonic() - killed_at),
            what="agents to stop the orphaned job and exit",
        )


def _pid_alive(pid):
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
