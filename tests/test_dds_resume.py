"""The supervisor survives kill -9: ``dtlaunch run --resume`` replays the WAL, the
running agents and workers reconnect (their processes never stop), and the job
completes with every shard DONE exactly once and every record trained."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from dtlaunch.sharding import DatasetSpec
from dtlaunch.supervisor.dds.queue import ShardQueue
from dtlaunch.supervisor.wal.log import Wal
from tests.jobs import SCRIPTS, Started, events, run, summary, wait_until
from tests.test_dds_jobs import dataset_args, ledger_counts

pytestmark = pytest.mark.integration

WORKER = str(SCRIPTS / "dds_worker.py")
COMMON = [
    "--workers",
    "3",
    "--restart-scope",
    "process",
    "--heartbeat-interval",
    "0.5",
    "--agent-timeout",
    "20",
]


def replay_wal(run_dir: Path, spec: DatasetSpec) -> ShardQueue:
    wal, recovered = Wal.open(run_dir / "wal")
    try:
        queue = (
            ShardQueue.restore(spec, recovered.snapshot) if recovered.snapshot else ShardQueue(spec)
        )
        queue.replay(recovered.records)
        return queue
    finally:
        wal.close()


def _worker_pids(run_dir):
    return {(e["rank"], e["pid"]) for e in events(run_dir) if e["kind"] == "running"}


def kill_loop(tmp_path: Path, *, kills: int, n: int, seed: int) -> None:
    rng = random.Random(seed)
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    step_file = tmp_path / "step"
    step_file.write_text("0.02")
    run_dir = tmp_path / "run"
    spec = DatasetSpec(dataset_size=n, shard_size=100, epochs=2, global_batch=30, seed=seed)
    first = [
        "run",
        *COMMON,
        "--run-dir",
        str(run_dir),
        *dataset_args(n, 100, 2, 30, seed),
        WORKER,
        str(ledger),
        f"@{step_file}",
    ]
    job = Started(first, env={}, log=tmp_path / "console-0.log")
    killed = 0
    try:
        wait_until(lambda: (run_dir / "job.json").exists(), timeout=30, what="the run dir")
        while killed < kills:
            time.sleep(rng.uniform(0.2, 2.0))
            assert job.proc.poll() is None, (
                f"the job ended early after {killed} kills:\n{job.output()}"
            )
            job.signal(signal.SIGKILL)
            job.wait(timeout=10)
            killed += 1
            job = Started(
                ["run", "--resume", str(run_dir)], env={}, log=tmp_path / f"console-{killed}.log"
            )
        step_file.write_text("0")  # let the rest run at full speed
        assert job.wait(timeout=240) == 0, job.output()
    finally:
        job.cleanup()
    data = summary(run_dir)
    assert data["status"] == "succeeded"
    assert (data["shards_total"], data["shards_done"]) == (spec.total_shards, spec.total_shards)
    # The WAL's ledger: every shard of every epoch DONE exactly once.
    queue = replay_wal(run_dir, spec)
    done = [(epoch, shard) for epoch, shard, _lease, _worker in queue.done_ledger]
    assert len(done) == len(set(done)) == spec.total_shards
    # The workers' record ledger: every record at least once per epoch; re-runs only
    # of what was in flight (granted, not yet acknowledged) at the kills.
    counts = ledger_counts(ledger)
    assert set(counts) == set(range(n))
    assert min(counts.values()) >= 2
    extra = sum(counts.values()) - 2 * n
    assert extra <= killed * 3 * 3 * 100, extra  # workers x (current + 2 prefetched) x S
    # The workers never stopped: one attempt each, no restarts.
    assert data["restarts"] == []
    assert {rank for rank, _pid in _worker_pids(run_dir)} == {0, 1, 2}
    assert len(_worker_pids(run_dir)) == 3
    assert killed == kills
    # The log was compacted along the way (snapshots), and recovery used them.
    assert list((run_dir / "wal").glob("snap-*"))
    # Some supervisors die before they get to resume (killed while starting up).
    assert 1 <= sum(1 for e in events(run_dir) if e["kind"] == "resume") <= kills


def test_supervisor_killed_6_times_and_resumed_loses_nothing(tmp_path):
    # make test's share of the loop; test-slow runs 300 kills below
    kill_loop(tmp_path, kills=6, n=20000, seed=11)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_supervisor_killed_300_times_and_resumed_loses_nothing(tmp_path):
    kill_loop(tmp_path, kills=300, n=200000, seed=12)


def test_a_second_supervisor_on_the_same_run_is_refused(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    step_file = tmp_path / "step"
    step_file.write_text("0.02")
    run_dir = tmp_path / "run"
    args = [
        "run",
        *COMMON,
        "--run-dir",
        str(run_dir),
        *dataset_args(6000, 100, 1, 30),
        WORKER,
        str(ledger),
        f"@{step_file}",
    ]
    job = Started(args, env={}, log=tmp_path / "console.log")
    try:
        wait_until(lambda: bool(_worker_pids(run_dir)), timeout=30, what="workers")
        second = run(["run", "--resume", str(run_dir)], env={}, timeout=30)
        assert second.returncode != 0
        assert "is locked by pid" in second.stderr
        step_file.write_text("0")
        assert job.wait(timeout=120) == 0
    finally:
        job.cleanup()
    assert (
        run(["run", "--resume", str(run_dir)], env={}).returncode != 0
    )  # ended: nothing to resume


def test_a_worker_that_dies_while_the_supervisor_is_down_has_its_shards_rerun(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    step_file = tmp_path / "step"
    step_file.write_text("0.02")
    run_dir = tmp_path / "run"
    args = [
        "run",
        *COMMON,
        "--run-dir",
        str(run_dir),
        *dataset_args(6000, 100, 1, 30),
        WORKER,
        str(ledger),
        f"@{step_file}",
    ]
    job = Started(args, env={}, log=tmp_path / "console.log")
    try:
        wait_until(lambda: len(_worker_pids(run_dir)) == 3, timeout=30, what="workers")
        wait_until(
            lambda: (ledger / "1-0.txt").exists() and (ledger / "1-0.txt").stat().st_size > 500,
            timeout=30,
            what="progress",
        )
        job.signal(signal.SIGKILL)
        job.wait(timeout=10)
        victim = next(pid for rank, pid in _worker_pids(run_dir) if rank == 1)
        os.kill(victim, signal.SIGKILL)  # dies while nobody supervises
        time.sleep(0.5)
        step_file.write_text("0.002")
        job = Started(["run", "--resume", str(run_dir)], env={}, log=tmp_path / "console-2.log")
        assert job.wait(timeout=120) == 0, job.output()
    finally:
        job.cleanup()
    data = summary(run_dir)
    assert (data["shards_total"], data["shards_done"]) == (60, 60)
    # Its agent queued the Exited while the supervisor was down and sent it before
    # its Hello: the resumed supervisor knows how it ended, as if it had been up.
    assert [(r["rank"], r["reason"]) for r in data["restarts"]] == [(1, "killed by SIGKILL")]
    counts = ledger_counts(ledger)
    assert set(counts) == set(range(6000))
    assert (ledger / "1-1.txt").exists()  # rank 1 came back as attempt 1
