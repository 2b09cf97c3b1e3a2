"""A PS-mode worker of the built-in parameter server: linear regression over
DDS records, pull/push every step. Writes OUT/<rank>.json with the final loss
and parameters. usage: ps_worker.py OUT OPTIMIZER LR"""

import json
import sys
from pathlib import Path

import torch

import dtlaunch
import dtlaunch.ps

out, optimizer, lr = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
job = dtlaunch.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ps = dtlaunch.ps.Client(model, optimizer=optimizer, lr=lr)
gen = torch.Generator().manual_seed(7)
true_w = torch.randn(8, 1, generator=gen)
features = torch.randn(job.dataset.dataset_size, 8, generator=gen)
targets = features @ true_w + 0.5
losses = []
for idx in job.batches():
    ps.pull()
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(features[idx]), targets[idx])
    loss.backward()
    ps.push()
    losses.append(loss.item())
    job.step()
ps.pull()
with torch.no_grad():
    final = torch.nn.functional.mse_loss(model(features), targets).item()
record = {
    "first_loss": losses[0] if losses else None,
    "final_loss": final,
    "steps": job.step_count,
    "params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
    "placement": {"version": ps.placement.version, "owner": list(ps.placement.owner)},
}
(out / f"{job.rank}.json").write_text(json.dumps(record))
ps.close()
job.close()
