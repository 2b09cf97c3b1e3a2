"""Distributed batch scoring (inference) fed by dtlaunch's Stateful DDS.

Each worker pulls shards of the data set from the supervisor as it goes (a fast
worker scores more), writes its scores, and calls ``job.step()`` once a batch's
scores are safely written, so a shard is DONE only after its output exists. Kill
a worker (its shards are re-read elsewhere) or the supervisor (``dtlaunch run
--resume RUN_DIR``): every record still gets a score.

    dtlaunch run --workers 3 --dataset-size 50000 --shard-size 1000 --global-batch 300 \\
        examples/score_dds.py OUT_DIR
    python examples/score_dds.py OUT_DIR        # one process, no supervisor: for debugging
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import dtlaunch
from dtlaunch.runtime.torch import DDSBatchSampler


def features(n: int, width: int = 32) -> TensorDataset:
    """Records every worker can rebuild identically (stand-in for a real data set)."""
    generator = torch.Generator().manual_seed(7)
    return TensorDataset(torch.arange(n), torch.randn(n, width, generator=generator))


def scorer(width: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)  # the same "trained" model in every worker
    return torch.nn.Sequential(torch.nn.Linear(width, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "scores")
    out_dir.mkdir(parents=True, exist_ok=True)
    if "DTLAUNCH_SUPERVISOR" in os.environ:
        job = dtlaunch.init()
    else:
        job = dtlaunch.init(dataset_size=5_000, shard_size=500, global_batch=100)
    data = features(job.dataset.dataset_size)
    model = scorer().eval()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    scored = 0
    with (out_dir / f"scores-{job.rank}-{attempt}.tsv").open("a") as out, torch.no_grad():
        for ids, x in DataLoader(data, batch_sampler=DDSBatchSampler(job)):
            for record, score in zip(ids.tolist(), model(x).squeeze(1).tolist(), strict=True):
                out.write(f"{record}\t{score:.6f}\n")
            out.flush()
            os.fsync(out.fileno())  # written for good before the shard can be DONE
            job.step()
            scored += len(ids)
    job.close()
    print(f"rank {job.rank}: scored {scored} records in {job.step_count} steps", flush=True)


if __name__ == "__main__":
    main()
