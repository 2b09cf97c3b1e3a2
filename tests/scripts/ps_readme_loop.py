"""The README's parameter-server loop, exactly as written there (linear
regression over DDS records). Writes OUT/<rank>.json with the records it
trained and the final loss. usage: ps_readme_loop.py OUT"""

import json
import sys
from pathlib import Path

import torch

import dtlaunch
import dtlaunch.ps

out = Path(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
gen = torch.Generator().manual_seed(7)

job = dtlaunch.init()
features = torch.randn(job.dataset.dataset_size, 8, generator=gen)
targets = features @ torch.randn(8, 1, generator=gen) + 0.5
trained = []

# --- the README's loop ---
ps = dtlaunch.ps.Client(model, optimizer="adam", lr=1e-3)
for idx in job.batches():
    ps.pull()                      # the model's parameters, from every server at once
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(features[idx]), targets[idx])
    loss.backward()
    ps.push()                      # p.grad, weighted by this worker's share of the step
    job.step()
    trained.extend(idx)
ps.pull()                          # the trained model: waits for the last records' step
# ---

with torch.no_grad():
    final = torch.nn.functional.mse_loss(model(features), targets).item()
result = {"records": trained, "steps": job.step_count, "final_loss": final}
(out / f"{job.rank}.json").write_text(json.dumps(result))
ps.close()
job.close()
