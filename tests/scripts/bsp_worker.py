"""A BSP allreduce worker fed by the DDS: job.bsp_batches() keeps the collectives
paired to the end. Ledger of trained records in LEDGER/<rank>.txt, and the step
count in LEDGER/<rank>.steps. usage: bsp_worker.py LEDGER SLOW_RANK SLOW_S [HOLD]

HOLD: from step 10 on, every step waits while the file HOLD exists (a test
that must act while the job still trains removes it once it has acted); a hold
longer than HOLD_LIMIT_S fails the worker, saying so, instead of hanging."""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import dtlaunch

ledger, slow_rank, slow_s = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
hold = Path(sys.argv[4]) if len(sys.argv) > 4 else None
HOLD_FROM_STEP = 10
HOLD_LIMIT_S = 120.0
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
# Build the optimizer before the process group: the first optimizer imports
# torch._dynamo, which (torch 2.13) keeps references to any process group that
# exists then, so destroy_process_group() cannot free it and gloo's threads can
# abort the interpreter's exit (SIGABRT) while releasing the last collective.
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
dist.init_process_group("gloo")
job = dtlaunch.init()
features = torch.randn(job.dataset.dataset_size, 4, generator=torch.Generator().manual_seed(1))
# Appended: a restarted attempt (a group restart) adds to what its rank trained before.
with (ledger / f"{job.rank}.txt").open("a") as out:
    for batch in job.bsp_batches():
        optimizer.zero_grad()
        if batch:
            x = features[batch]
            model(x).pow(2).mean().backward()
        if job.rank == slow_rank:
            time.sleep(slow_s)
        held_since = time.monotonic()
        while hold is not None and job.step_count >= HOLD_FROM_STEP and hold.exists():
            if time.monotonic() - held_since > HOLD_LIMIT_S:
                sys.exit(f"bsp_worker: {hold} still exists after {HOLD_LIMIT_S:.0f} s")
            time.sleep(0.01)
        job.allreduce_gradients(model, samples=len(batch))
        optimizer.step()
        out.write(" ".join(map(str, batch)) + "\n")
        out.flush()
        job.step()
(ledger / f"{job.rank}.steps").write_text(str(job.step_count))
job.close()
dist.destroy_process_group()
