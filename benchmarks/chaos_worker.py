"""The training process of ``benchmarks/chaos.py``: a small real job that keeps
a record-level ledger, so a fault that loses or repeats records is counted.

usage: chaos_worker.py MODE LEDGER_DIR STEP_S

MODE is ``dds`` (the DDS loop alone), ``ps`` (the README's parameter-server
loop, linear regression) or ``allreduce`` (``job.bsp_batches()`` with a gloo
group and ``job.allreduce_gradients``). Each attempt of each rank appends the
record ids of every step to LEDGER_DIR/<rank>-<attempt>.txt, flushed before
``job.step()`` acknowledges them, so the ledger survives a SIGKILL.
"""

import os
import sys
import time
from pathlib import Path

import dtlaunch

mode, ledger_dir, step_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

if mode in ("ps", "allreduce"):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
if mode == "allreduce":
    import torch.distributed as dist

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # before the group: see bsp_worker
    dist.init_process_group("gloo")

job = dtlaunch.init()
if mode in ("ps", "allreduce"):
    gen = torch.Generator().manual_seed(7)
    features = torch.randn(job.dataset.dataset_size, 8, generator=gen)
    targets = features @ torch.randn(8, 1, generator=gen) + 0.5

with (ledger_dir / f"{job.rank}-{attempt}.txt").open("a") as ledger:
    if mode == "dds":
        for idx in job.batches():
            time.sleep(step_s)
            ledger.write(" ".join(map(str, idx)) + "\n")
            ledger.flush()
            job.step()
    elif mode == "ps":
        import dtlaunch.ps

        ps = dtlaunch.ps.Client(model, optimizer="adam", lr=1e-2)
        for idx in job.batches():
            ps.pull()
            model.zero_grad()
            torch.nn.functional.mse_loss(model(features[idx]), targets[idx]).backward()
            time.sleep(step_s)
            ps.push()
            ledger.write(" ".join(map(str, idx)) + "\n")
            ledger.flush()
            job.step()
        ps.pull()
        ps.close()
    else:
        for idx in job.bsp_batches():
            optimizer.zero_grad()
            if idx:
                loss = torch.nn.functional.mse_loss(model(features[idx]), targets[idx])
                loss.backward()
            time.sleep(step_s)
            job.allreduce_gradients(model, samples=len(idx))
            optimizer.step()
            ledger.write(" ".join(map(str, idx)) + "\n")
            ledger.flush()
            job.step()
job.close()
if mode == "allreduce":
    dist.destroy_process_group()
