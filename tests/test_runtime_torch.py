"""DDSBatchSampler in a real torch DataLoader, in a worker process fed by the fake supervisor."""

from __future__ import annotations

import pytest

from dtlaunch.sharding import DatasetSpec
from dtlaunch.wire.keys import create_run_keys, write_peer_keys
from tests.test_runtime import (
    assert_each_record_once_per_epoch,
    assert_succeeded,
    last_record_batch,
    run_job,
)

pytest.importorskip("torch")


@pytest.fixture
def keys(tmp_path):
    run_keys = create_run_keys(tmp_path / "run-keys")
    write_peer_keys(tmp_path / "peer-keys", run_keys.peer())
    return run_keys

TORCH_SCRIPT = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
import dtlaunch
from dtlaunch.runtime.torch import DDSBatchSampler

cfg = json.loads(sys.argv[1])

def emit(**kv):
    print(json.dumps(kv), flush=True)

job = dtlaunch.init(**cfg["init"])
n = job.dataset.dataset_size
data = TensorDataset(torch.arange(n) * 10 + 1, torch.arange(n, dtype=torch.float64) / 4)
loader = DataLoader(data, batch_sampler=DDSBatchSampler(job), num_workers=cfg["num_workers"])
emit(local_batch_size=job.local_batch_size)
for x, y in loader:
    emit(x=x.tolist(), y=y.tolist(), dtypes=[str(x.dtype), str(y.dtype)])
    time.sleep(cfg["step_sleep"])
    emit(step_at=time.monotonic())
    job.step()
job.close()
emit(end=job.step_count)
"""


@pytest.mark.integration
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_with_dds_batch_sampler(tmp_path, keys, num_workers):
    spec = DatasetSpec(dataset_size=64, shard_size=8, epochs=2, global_batch=10, seed=5)
    cfg = {"init": {"prefetch": 2}, "num_workers": num_workers, "step_sleep": 0.02}
    fake, run = run_job(tmp_path, keys, spec, cfg, rank=0, world_size=2, script=TORCH_SCRIPT)
    assert_succeeded(run)
    assert run.one("local_batch_size") == 5

    # The tensors are the dataset's rows at the granted records, batch after batch.
    for line in run.lines:
        if "x" in line:
            assert line["dtypes"] == ["torch.int64", "torch.float64"]
            records = [(v - 1) // 10 for v in line["x"]]
            assert [v % 10 for v in line["x"]] == [1] * len(records)
            assert line["y"] == [r / 4 for r in records]
            line["batch"] = records
    batches = run.values("batch")
    assert all(len(b) == 5 for b in batches[:-1])
    assert_each_record_once_per_epoch(fake, run)

    # The DataLoader reads index batches ahead (two workers, two batches each),
    # yet a lease is acked only by the step() after the batch with its last record.
    step_at = run.values("step_at")
    first_ack = {}
    for t, ack in fake.acks:
        for lease_id in ack.lease_ids:
            first_ack.setdefault(lease_id, (t, ack.step))
    leases = [lease for _, lease in fake.grants]
    assert set(first_ack) == {lease.lease_id for lease in leases}
    for lease_id, batch_number in last_record_batch(run, spec, leases).items():
        t, step = first_ack[lease_id]
        assert step == batch_number
        assert t >= step_at[step - 1]
