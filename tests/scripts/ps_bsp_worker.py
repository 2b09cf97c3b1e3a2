"""A BSP worker of the built-in parameter server that keeps going to the end:
linear regression over DDS records, pull/push every step, an empty push (0
records) while it holds no data, STEP_S of "compute" a step. Writes
OUT/<rank>.json with the final loss and parameters, its steps, and where its
servers ended up, and OUT/<rank>.ledger with the records of every step whose
gradient was applied (one step a line; a step BACKUP_WORKERS dropped is left
out). EXTRA (default 0) adds a parameter of that many floats with a small L2
pull toward 0, so the servers' updates cost time in proportion to the bytes they
hold (``--inject slowdown:role=server`` then slows a server by its share).
STEP_S may be @FILE holding the seconds instead (re-read every step, so a test
can hold the job back while it scales and kills supervisors, and let it run
to its end after).
usage: ps_bsp_worker.py OUT STEP_S [EXTRA]"""

import hashlib
import json
import sys
import time
from pathlib import Path

import torch

import dtlaunch
import dtlaunch.ps

out, step_arg = Path(sys.argv[1]), sys.argv[2]


def step_seconds() -> float:
    if not step_arg.startswith("@"):
        return float(step_arg)
    try:
        return float(Path(step_arg[1:]).read_text())
    except (OSError, ValueError):
        return 0.0


extra_floats = int(sys.argv[3]) if len(sys.argv) > 3 else 0
job = dtlaunch.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
if extra_floats:
    model.extra = torch.nn.Parameter(torch.ones(extra_floats))
ps = dtlaunch.ps.Client(model, optimizer="sgd", lr=0.05)
gen = torch.Generator().manual_seed(7)
true_w = torch.randn(8, 1, generator=gen)
features = torch.randn(job.dataset.dataset_size, 8, generator=gen)
targets = features @ true_w + 0.5
trained = dropped = 0
ledger = (out / f"{job.rank}.ledger").open("w")
for idx in job.batches(wait=0.05):
    ps.pull()
    model.zero_grad()
    if idx:
        loss = torch.nn.functional.mse_loss(model(features[idx]), targets[idx])
        if extra_floats:
            loss = loss + 1e-3 * model.extra.square().mean()
        loss.backward()
        time.sleep(step_seconds())
    ps.push(len(idx))
    trained += len(idx)
    if ps.dropped and idx:
        dropped += 1
    elif idx:
        ledger.write(" ".join(map(str, idx)) + "\n")
        ledger.flush()
    job.step()
ledger.close()
ps.pull()
with torch.no_grad():
    final = torch.nn.functional.mse_loss(model(features), targets).item()
record = {
    "final_loss": final,
    "steps": job.step_count,
    "records": trained,
    "dropped_steps": dropped,
    "endpoints": ps.endpoints,
    "moves": ps.moves,
    "versions": ps.versions,
    "params": [p.detach().reshape(-1).tolist() for p in (model.weight, model.bias)],
    "extra_digest": (
        hashlib.sha256(model.extra.detach().numpy().tobytes()).hexdigest() if extra_floats else ""
    ),
    "placement": {"version": ps.placement.version, "owner": list(ps.placement.owner)},
}
(out / f"{job.rank}.json").write_text(json.dumps(record))
ps.close()
job.close()
