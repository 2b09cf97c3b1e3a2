"""The workload of ``benchmarks/dd.py``: BSP training on emulated mixed devices.

Each host is a device of a class with a throughput ``v`` (records/s above its
saturation batch) and a memory bound ``bmax``. A pass over a micro-batch of
``b`` records "computes" for ``PASS_OVERHEAD_S + max(b, sat) / v`` seconds of
real sleep (a device below its saturation batch is no faster), and a micro-batch
above ``bmax`` fails as the device would: out of memory. Then it trains a linear
least-squares model (float64) on those records for real, and at each step's
boundary joins a real gloo allreduce (``job.allreduce_gradients``) and steps SGD.

Every rank writes the records of each step to ``LEDGER/<rank>.steps`` (one line
per step: ``step record record ...``); rank 0 writes the final weights and the
training time to ``LEDGER/result.json``, so the benchmark can replay the same
global batches in one process and compare.

usage: dd_worker.py LEDGER --device HOST=V:SAT:BMAX ... [--lr LR]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import dtlaunch

FEATURES = 4
PASS_OVERHEAD_S = 0.004  # launching a pass costs something on a real device too


def data(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data set: ``size`` records of a noisy linear target (seeded)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(size, FEATURES, generator=g, dtype=torch.float64)
    w = torch.arange(1, FEATURES + 1, dtype=torch.float64).reshape(-1, 1) / FEATURES
    return x, x @ w + 0.05 * torch.randn(size, 1, generator=g, dtype=torch.float64)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def loss_of(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(net(x), y)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger", type=Path)
    parser.add_argument("--device", action="append", default=[], help="HOST=V:SAT:BMAX")
    parser.add_argument("--lr", type=float, default=0.05)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    devices = {}
    for item in args.device:
        host, _, spec = item.partition("=")
        speed, sat, bmax = spec.split(":")
        devices[host] = (float(speed), int(sat), int(bmax))
    host = os.environ["DTLAUNCH_HOST"]
    speed, sat, bmax = devices[host]
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)  # before the group: see bsp_worker
    dist.init_process_group("gloo")
    job = dtlaunch.init()
    x, y = data(job.dataset.dataset_size)
    records: list[int] = []
    started: float | None = None
    with (args.ledger / f"{job.rank}.steps").open("w") as ledger:
        for batch in job.bsp_batches():
            if started is None:
                started = time.monotonic()
            if len(batch) > bmax:
                raise MemoryError(
                    f"{host}: a micro-batch of {len(batch)} records does not fit this "
                    f"device's memory (bmax={bmax})"
                )
            if batch:
                time.sleep(PASS_OVERHEAD_S + max(len(batch), sat) / speed)
                (loss_of(net, x[batch], y[batch]) * job.micro_batch_weight).backward()
            records += batch
            if not job.is_accumulation_boundary:
                continue
            job.allreduce_gradients(net)
            optimizer.step()
            optimizer.zero_grad()
            ledger.write(" ".join(map(str, [job.step_count, *records])) + "\n")
            records = []
            job.step()
    train_s = time.monotonic() - (started or time.monotonic())
    if job.rank == 0:
        weights = [p.detach().reshape(-1).tolist() for p in net.parameters()]
        result = {"train_s": train_s, "steps": job.step_count, "weights": weights}
        (args.ledger / "result.json").write_text(json.dumps(result))
    job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
