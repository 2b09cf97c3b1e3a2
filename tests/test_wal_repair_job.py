"""A WAL damaged before its tail: ``--resume`` refuses it naming file and offset,
``dtlaunch wal repair`` cuts it (keeping a backup), and the resumed job restarts
its workers (their shard state is stale) and still trains every record."""

from __future__ import annotations

import signal

import pytest

from tests.jobs import SCRIPTS, Started, run, summary, wait_until
from tests.test_dds_jobs import dataset_args, ledger_counts

pytestmark = pytest.mark.integration


def killed_mid_job(tmp_path):
    """A 2-worker DDS job SIGKILLed (supervisor and all) after some training."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run", "--workers", "2", "--restart-scope", "process", "--run-dir", str(run_dir),
        *dataset_args(2000, 20, 1, 10), str(SCRIPTS / "dds_worker.py"), str(ledger), "0.01",
    ]  # fmt: skip
    job = Started(args, env={}, log=tmp_path / "console.log")
    try:
        wait_until(
            lambda: sum(len(p.read_text().splitlines()) for p in ledger.glob("*.txt")) > 60,
            timeout=60,
            what="some training",
        )
        job.signal(signal.SIGKILL)
        job.wait(timeout=10)
    finally:
        job.cleanup()
    return run_dir, ledger


def resume_completes(run_dir, ledger):
    resumed = run(["run", "--resume", str(run_dir)], env={}, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    result = summary(run_dir)
    assert (result["shards_total"], result["shards_done"]) == (100, 100)
    assert sorted(r["rank"] for r in result["restarts"]) == [0, 1]  # stale workers restarted
    assert set(ledger_counts(ledger)) == set(range(2000))
    assert not (run_dir / "wal" / "REPAIRED").exists()


def test_corrupt_wal_is_refused_then_repaired_and_the_job_completes(tmp_path):
    run_dir, ledger = killed_mid_job(tmp_path)
    segments = sorted((run_dir / "wal").glob("seg-*.wal"))
    damaged = segments[-1]
    data = bytearray(damaged.read_bytes())
    offset = len(data) // 3
    data[offset] ^= 0xFF  # a flipped byte well before the tail
    damaged.write_bytes(bytes(data))

    refused = run(["run", "--resume", str(run_dir)], env={}, timeout=60)
    assert refused.returncode == 2
    assert damaged.name in refused.stderr
    assert "dtlaunch wal repair" in refused.stderr

    repaired = run(["wal", "repair", str(run_dir)], env={}, timeout=60)
    assert repaired.returncode == 0, repaired.stderr
    assert "dropped" in repaired.stdout
    assert list((run_dir / "wal").glob("repair-*"))  # every removed byte kept
    resume_completes(run_dir, ledger)


def test_a_wal_that_lost_its_newest_segment_is_refused_then_repaired(tmp_path):
    """Deleting the newest segment used to resume silently with the queue rolled back."""
    run_dir, ledger = killed_mid_job(tmp_path)
    newest = sorted((run_dir / "wal").glob("seg-*.wal"))[-1]
    newest.unlink()

    refused = run(["run", "--resume", str(run_dir)], env={}, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "once held seq" in refused.stderr  # its only segment here: every record gone
    assert f"dtlaunch wal repair {run_dir}" in refused.stderr.replace("\n", "")

    repaired = run(["wal", "repair", str(run_dir)], env={}, timeout=60)
    assert repaired.returncode == 0, repaired.stderr
    assert "are gone with the missing files" in repaired.stdout.replace("\n", " ")
    resume_completes(run_dir, ledger)
