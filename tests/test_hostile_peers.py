"""A peer holding the job's key but speaking nonsense never takes the supervisor
down (issue 12): bad routing identities and requests are dropped at the
boundary, and the job still trains every record once per epoch."""

from __future__ import annotations

import asyncio
import json

import pytest
import zmq.asyncio

from dtlaunch.wire.keys import load_run_keys
from dtlaunch.wire.messages import AckShards, FetchShards, Hello, ReleaseShards
from dtlaunch.wire.sockets import Dealer
from tests.jobs import SCRIPTS, kind, started, summary, wait_for_event
from tests.test_dds_jobs import dataset_args, ledger_counts

pytestmark = pytest.mark.integration

WORKER = str(SCRIPTS / "dds_worker.py")

# Identities that are no worker of a 2-worker job: negative, too large for the
# WAL's integers, not canonical, out of range, not a number.
BAD_WORKER_IDS = [
    b"worker:-1",
    b"worker:99999999999999999999",
    b"worker:007",
    b"worker: 1",
    b"worker:+1",
    b"worker:2",
    b"worker:x",
]


async def _bombard(run_dir, run_id: str) -> None:
    endpoint = json.loads((run_dir / "supervisor.json").read_text())["endpoint"]
    keys = load_run_keys(run_dir / "keys").peer()
    ctx = zmq.asyncio.Context()
    try:
        for identity in BAD_WORKER_IDS:
            async with Dealer(ctx, endpoint, keys, identity) as dealer:
                await dealer.send(
                    Hello(role="worker", run_id=run_id, host="x", pid=1, version="0", rank=0)
                )
                await dealer.send(FetchShards(request_id=1, count=3))
                await dealer.send(AckShards(lease_ids=[1, 2], step=1))
                await dealer.send(ReleaseShards(lease_ids=[1], step=1))
                await asyncio.sleep(0.05)
    finally:
        ctx.destroy(linger=0)


def test_bad_worker_identities_are_dropped_and_the_job_trains_every_record(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run",
        "--workers",
        "2",
        "--run-dir",
        str(run_dir),
        *dataset_args(400, 20, 1, 20),
        WORKER,
        str(ledger),
        "0.02",
    ]
    with started(args, env={}, log=tmp_path / "out.log") as job:
        start = wait_for_event(run_dir, kind("job_start"), timeout=60)
        asyncio.run(_bombard(run_dir, start["run_id"]))
        assert job.wait(timeout=120) == 0, job.output()
    data = summary(run_dir)
    assert data["status"] == "succeeded", data
    counts = ledger_counts(ledger)
    assert set(counts) == set(range(400)) and set(counts.values()) == {1}
    assert "dropped a message from" in job.output()
