"""Mirror of torchrun's own launcher checks: every variable present and consistent,
and an allreduce of one-hot rank vectors sums to all-ones. Writes a JSON report to
OUT_DIR/<rank>.json so the test can inspect every rank."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

REQUIRED = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "DTLAUNCH_RUN_ID",
    "DTLAUNCH_ROLE",
    "DTLAUNCH_SUPERVISOR",
    "DTLAUNCH_KEYS",
]

out_dir = Path(sys.argv[1])
missing = [k for k in REQUIRED if k not in os.environ]
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
one_hot = torch.zeros(world)
one_hot[rank] = 1.0
dist.all_reduce(one_hot)
report = {
    "missing": missing,
    "env": {k: os.environ.get(k) for k in [*REQUIRED, "CUDA_VISIBLE_DEVICES"]},
    "dist_rank": rank,
    "dist_world": world,
    "allreduce": one_hot.tolist(),
    "host_pid": os.getpid(),
}
(out_dir / f"{rank}.json").write_text(json.dumps(report))
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} ok", flush=True)
