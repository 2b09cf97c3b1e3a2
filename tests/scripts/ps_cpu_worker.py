"""A BSP worker of the built-in parameter server whose compute costs CPU: each
step with records burns BURN_S seconds of one core (a busy loop, as a model's
forward and backward would), then pulls and pushes a small linear model. Writes
OUT/<rank>.ledger with the records of every applied step (one step a line).
EXTRA (default 0) adds a parameter of that many floats, so that the servers'
updates cost CPU in proportion to the workers' pushes (``benchmarks/auto.py``);
a list such as 1000000,200000 adds one parameter of each size (a skewed model
whose big tensor makes one server hot, ``benchmarks/auto_hot.py``).
usage: ps_cpu_worker.py OUT BURN_S [EXTRA[,EXTRA...]]"""

import sys
import time
from pathlib import Path

import torch

import dtlaunch
import dtlaunch.ps

out, burn_s = Path(sys.argv[1]), float(sys.argv[2])
extra_sizes = [int(n) for n in sys.argv[3].split(",")] if len(sys.argv) > 3 else []
job = dtlaunch.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
extras = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(n)) for n in extra_sizes if n)
model.extras = extras
ps = dtlaunch.ps.Client(model, optimizer="sgd", lr=0.05)
gen = torch.Generator().manual_seed(7)
features = torch.randn(job.dataset.dataset_size, 8, generator=gen)
targets = features @ torch.randn(8, 1, generator=gen) + 0.5
with (out / f"{job.rank}.ledger").open("w") as ledger:
    for idx in job.batches():
        ps.pull()
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(features[idx]), targets[idx])
        for extra in extras:
            loss = loss + 1e-3 * extra.square().mean()
        loss.backward()
        end = time.perf_counter() + burn_s
        while time.perf_counter() < end:  # the compute a real model would do
            pass
        ps.push(len(idx))
        if not ps.dropped:
            ledger.write(" ".join(map(str, idx)) + "\n")
            ledger.flush()
        job.step()
ps.pull()
ps.close()
job.close()
