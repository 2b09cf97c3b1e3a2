"""The workload of ``benchmarks/psld.py``: BSP training through the built-in
parameter servers (``dtlaunch.ps.Client``, Adam on the servers) of a model
whose tensors have skewed sizes.

The model is a chain of tanh layers (``LAYERS``); the largest weight holds about
40 % of the ~18.6 MB, the others range from 256 B to 3.7 MB. Every parameter
gets a real gradient every step: a regression loss (MSE toward a fixed
teacher's outputs) plus a small L2 pull toward 0 on the two largest weights.
Each step pulls the model, computes the gradient of this worker's records, sleeps
``--step-s`` seconds more ("compute" of a larger model), pushes and moves on.

Rank 0 writes ``OUT/result.json``: ``train_s`` (its loop's time: from its first
batch to its last push; start-up and the final pull excluded; a restarted rank 0
counts from its first incarnation's first batch), the loop's start
in seconds since the job started (``DTLAUNCH_JOB_START``, the clock of
``--inject after=/until=``), the final loss on a fixed evaluation set (not
training data), its steps, the wall time at the end of each step (for where the
time went) and the map version it ended on. Every rank writes
``OUT/<rank>.json`` with its steps and records.

usage: psld_worker.py OUT [--step-s S] [--lr LR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import torch

import dtlaunch
import dtlaunch.ps

# in -> ... -> out; the 1024 x 1792 weight is the big one
LAYERS = (256, 1024, 1792, 512, 1024, 768, 384, 64, 1)
L2 = 1e-4  # on the two largest weights
EVAL_RECORDS = 512
TEACHER_HIDDEN = 32


def teacher(x: torch.Tensor) -> torch.Tensor:
    """The regression target: a fixed random two-layer tanh net of the features."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(LAYERS[0], TEACHER_HIDDEN, generator=g) / LAYERS[0] ** 0.5
    b = torch.randn(TEACHER_HIDDEN, 1, generator=g) / TEACHER_HIDDEN**0.5
    out: torch.Tensor = torch.tanh(x @ a) @ b
    return out


def data(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, LAYERS[0], generator=g)
    return x, teacher(x)


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(LAYERS)):
        layers.append(torch.nn.Linear(n_in, n_out))
        if i < len(LAYERS) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def loss_of(net: torch.nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(net(x), y)


def regularized(net: torch.nn.Sequential) -> list[torch.nn.Parameter]:
    """The two largest weights, pulled toward 0 by the L2 term."""
    weights = [p for p in net.parameters() if p.dim() == 2]
    return sorted(weights, key=lambda p: -p.numel())[:2]


def first_loop_start(out: Path, rank: int, job_start: float) -> tuple[float, float, float | None]:
    """(monotonic, wall, seconds since the job started) of this rank's first
    training loop: a restarted rank 0 (nd's KILL_RESTART) takes its first
    incarnation's from ``OUT/loop_start_<rank>.json``, so its ``train_s`` covers
    the whole job, not only its last process's part (loopback hosts: one machine,
    whose CLOCK_MONOTONIC is one clock for all its processes)."""
    path = out / f"loop_start_{rank}.json"
    if path.exists():
        first = json.loads(path.read_text())
        return first["monotonic"], first["wall"], first["job_s"]
    started, wall = time.monotonic(), time.time()
    job_s = wall - job_start if job_start else None
    path.write_text(json.dumps({"monotonic": started, "wall": wall, "job_s": job_s}))
    return started, wall, job_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--step-s", type=float, default=0.02)
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    net = model()
    job = dtlaunch.init()
    x, y = data(job.dataset.dataset_size, seed=7)
    eval_x, eval_y = data(EVAL_RECORDS, seed=8)
    ps = dtlaunch.ps.Client(net, optimizer="adam", lr=args.lr)
    big = regularized(net)
    started: float | None = None
    job_start = float(os.environ.get("DTLAUNCH_JOB_START") or 0.0)
    started_job_s: float | None = None
    started_wall: float | None = None
    step_ends: list[float] = []
    records = 0
    for idx in job.batches(wait=0.05):
        if started is None:
            started, started_wall, started_job_s = first_loop_start(args.out, job.rank, job_start)
        ps.pull()
        net.zero_grad()
        loss = L2 * torch.stack([p.square().mean() for p in big]).sum()
        if idx:
            loss = loss + loss_of(net, x[idx], y[idx])
        loss.backward()
        time.sleep(args.step_s)
        ps.push(len(idx))
        records += len(idx)
        job.step()
        step_ends.append(round(time.time(), 4))
    train_s = time.monotonic() - (started or time.monotonic())
    ps.pull()
    with torch.no_grad():
        final = float(loss_of(net, eval_x, eval_y))
    record = {"rank": job.rank, "steps": job.step_count, "records": records, "train_s": train_s}
    (args.out / f"{job.rank}.json").write_text(json.dumps(record))
    if job.rank == 0:
        result = record | {
            "final_loss": final,
            "loop_start_job_s": started_job_s,
            "loop_start_wall": started_wall,
            "step_ends": step_ends,
            "map_version": ps.placement.version,
            "model_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
        }
        (args.out / "result.json").write_text(json.dumps(result))
    ps.close()
    job.close()


if __name__ == "__main__":
    main()
