"""A small real training job, written for torchrun, that runs unmodified under dtlaunch.

Data-parallel linear regression with torch.distributed (gloo): every rank reads
its shard of a synthetic data set, computes gradients, and averages them with an
allreduce. Rank 0 checkpoints every few steps; a restarted group resumes from the
checkpoint (TORCHELASTIC_RESTART_COUNT > 0), as torchrun jobs do.

    torchrun --nproc-per-node 2 examples/train_allreduce.py --steps 60
    dtlaunch run --workers 2 examples/train_allreduce.py --steps 60
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file")
    args = parser.parse_args()

    torch.manual_seed(0)
    true_w = torch.randn(16, 1)
    model = torch.nn.Linear(16, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    # Build the optimizer before the process group: the first optimizer imports
    # torch._dynamo, which (torch 2.13) keeps references to any process group that
    # exists then, so destroy_process_group() cannot free it and gloo's threads can
    # abort the interpreter's exit (SIGABRT) while releasing the last collective.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    dist.init_process_group("gloo")  # env:// — MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    start_step = 0
    if args.checkpoint is not None and args.checkpoint.exists():
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        start_step = int(state["step"])
    if rank == 0:
        print(f"world={world} restart={restarts} resuming at step {start_step}", flush=True)

    generator = torch.Generator().manual_seed(1000 + rank)
    loss = torch.tensor(0.0)
    for step in range(start_step, args.steps):
        x = torch.randn(args.batch, 16, generator=generator)
        y = x @ true_w + 0.01 * torch.randn(args.batch, 1, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world
        optimizer.step()
        if args.step_time:
            time.sleep(args.step_time)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d} loss {loss.item():.5f}", flush=True)
        if rank == 0 and args.checkpoint is not None and step % 5 == 4:
            tmp = args.checkpoint.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, args.checkpoint)

    error = (model.weight.detach().T - true_w).norm().item()
    if rank == 0:
        print(f"done: final loss {loss.item():.5f}, weight error {error:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
