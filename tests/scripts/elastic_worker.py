"""A BSP allreduce worker that can be replaced without restarting its peers: it
attaches its model and optimizer, so a newcomer gets them from a survivor.

A linear regression to a noisy linear target (the loss ends near the noise,
0.01, and how near depends on the training). Writes LEDGER/<rank>-<pid>.txt
(trained records, one batch a line) and, at the end, LEDGER/<rank>.json: pid,
first and last step, host, the final parameters (all ranks must agree) and the
final loss over the whole data set. usage: elastic_worker.py LEDGER STEP_S"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import dtlaunch

ledger, step_s = Path(sys.argv[1]), float(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
# Build the optimizer before the process group: the first optimizer imports
# torch._dynamo, which (torch 2.13) keeps references to any process group that
# exists then, so destroy_process_group() cannot free it and gloo's threads can
# abort the interpreter's exit (SIGABRT) while releasing the last collective.
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
job = dtlaunch.init()
dist.init_process_group("gloo")
job.attach(model, optimizer)
first_step = job.step_count
features = torch.randn(job.dataset.dataset_size, 4, generator=torch.Generator().manual_seed(1))
noise = torch.randn(job.dataset.dataset_size, 1, generator=torch.Generator().manual_seed(2))
targets = features @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.7 + 0.1 * noise
with (ledger / f"{job.rank}-{os.getpid()}.txt").open("w") as out:
    for batch in job.bsp_batches():
        optimizer.zero_grad()
        if batch:
            (model(features[batch]) - targets[batch]).pow(2).mean().backward()
        time.sleep(step_s * len(batch) / max(1, job.dataset.global_batch // job.world_size))
        job.allreduce_gradients(model, samples=len(batch))
        optimizer.step()
        out.write(" ".join(map(str, batch)) + "\n")
        out.flush()
        job.step()
final = {
    "pid": os.getpid(),
    "host": os.environ.get("DTLAUNCH_HOST", ""),
    "first_step": first_step,
    "last_step": job.step_count,
    "params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
    "final_loss": float((model(features) - targets).pow(2).mean()),
}
(ledger / f"{job.rank}.json").write_text(json.dumps(final))
job.close()
dist.destroy_process_group()
