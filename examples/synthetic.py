"""A synthetic BSP workload for straggler experiments (AntDT §VII, Table III).

Every step each worker "computes" for ``B_i / v_i`` seconds of real sleep (``B_i``
its local batch, ``v_i`` its capacity in samples/s), trains a tiny linear model on
the step's records, and joins a real gloo allreduce of the gradients: the BSP
barrier. Under ``dtlaunch run`` the records come from the Stateful DDS
(``job.bsp_batches()``), gradients are averaged by batch share
(``job.allreduce_gradients``, so ADJUST_BS keeps the global-batch mean), and
``--inject`` stragglers sleep inside ``job.step()``::

    dtlaunch run --workers 8 --policy nd --inject 'persistent:hosts=node3,delay=0.3' \\
        examples/synthetic.py --dataset-size 15360 --global-batch 256 --capacity 120

With ``--ps`` (under ``dtlaunch run --servers M``) the model lives on dtlaunch's
built-in parameter servers instead: each step pulls it, computes, pushes the
gradient (weighted by the step's records), and a BSP server update is the
barrier; workers out of data push empty steps until the data set is done
(``job.batches(wait=...)``). A gloo barrier at the very end makes the reported
time the whole job's, not rank 0's.

With ``--torchrun`` it is a plain torchrun script instead: no DDS and no
supervisor, a static equal partition of the same records, and its own copy of
the same injection (the same ``--inject`` strings, the same seeded per-window
coins), so torchrun can stand beside dtlaunch in a benchmark::

    torchrun --nproc-per-node 8 examples/synthetic.py --torchrun \\
        --dataset-size 15360 --global-batch 256 --capacity 120 \\
        --inject 'persistent:hosts=h3,delay=0.3' --hosts h0,h1,h2,h3,h4,h5,h6,h7

Rank 0 ends with one line ``synthetic: jct_s=... train_s=... steps=... records=...``
(``jct_s`` counts from the job's launch when known, ``train_s`` from the first step;
``records`` is the sum over the ranks running at the end).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from dtlaunch.inject import InjectionSpec, injected_delay, parse_injections

FEATURES = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset-size", type=int, default=15_360, help="records N")
    parser.add_argument("--shard-size", type=int, default=128, help="records per DDS shard")
    parser.add_argument("--global-batch", type=int, default=256, help="global batch B")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="data and injection seed")
    parser.add_argument(
        "--capacity",
        default="120",
        help="samples/s of every worker, or one value per rank: 120,120,60,...",
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--prefetch",
        type=int,
        default=2,
        help="DDS shards kept ready ahead of use (dtlaunch.init's prefetch=); 0 fetches on "
        "demand, so a worker whose batch ADJUST_BS shrank holds no idle shards at the end",
    )
    parser.add_argument(
        "--torchrun", action="store_true", help="plain torchrun: static partition, no dtlaunch"
    )
    parser.add_argument(
        "--ps", action="store_true", help="train through dtlaunch's parameter servers (--servers M)"
    )
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        help="--torchrun only: straggler spec as for dtlaunch run --inject (repeatable)",
    )
    parser.add_argument(
        "--hosts",
        default="",
        help="--torchrun only: host label of each rank (h0,h1,...) for hosts= injections",
    )
    parser.add_argument(
        "--job-start",
        type=float,
        default=0.0,
        help="--torchrun only: wall time the job was launched (transient windows and jct_s "
        "count from it); default: when rank 0 started",
    )
    args = parser.parse_args(argv)
    if min(args.dataset_size, args.shard_size, args.global_batch, args.epochs) < 1:
        parser.error("--dataset-size, --shard-size, --global-batch and --epochs must be >= 1")
    if args.prefetch < 0:
        parser.error("--prefetch must be 0 or more shards")
    try:
        capacities(args.capacity, len(args.capacity.split(",")))
    except ValueError as err:
        parser.error(str(err))
    if args.torchrun and args.ps:
        parser.error("--ps trains through dtlaunch's servers; it cannot run under --torchrun")
    if not args.torchrun and (args.inject or args.hosts or args.job_start):
        parser.error(
            "--inject, --hosts and --job-start are for --torchrun; under dtlaunch pass "
            "--inject to dtlaunch run (hosts come from the hostfile)"
        )
    return args


def capacities(text: str, world: int) -> list[float]:
    """Per-rank capacity in samples/s from ``120`` or ``120,60,...`` (one per rank).

    Raises: ValueError naming the problem.
    """
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--capacity {text!r}: write samples/s like 120 or 120,60,...") from None
    if len(values) == 1:
        values *= world
    if len(values) != world:
        raise ValueError(
            f"--capacity has {len(values)} values for {world} workers; give 1 or {world}"
        )
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"--capacity {text!r}: every value must be > 0 samples/s")
    return values


def features(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression data set: record i is row i."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=gen)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1) + 0.01 * torch.randn(
        n, 1, generator=gen
    )
    return x, y


def compute(
    model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor], batch: list[int], v: float
) -> float:
    """Gradients of the batch, stretched to ``len(batch) / v`` seconds; returns the loss."""
    start = time.monotonic()
    loss = 0.0
    if batch:
        x, y = data[0][batch], data[1][batch]
        value = torch.nn.functional.mse_loss(model(x), y)
        value.backward()
        loss = float(value.item())
    rest = len(batch) / v - (time.monotonic() - start)
    if rest > 0:
        time.sleep(rest)
    return loss


def report(rank: int, *, job_start: float, train_start: float, steps: int, records: int) -> None:
    """Rank 0 prints the final line; ``records`` are summed over the ranks (a collective)."""
    total = torch.tensor([float(records)], dtype=torch.float64)
    dist.all_reduce(total)
    if rank == 0:
        end = time.time()
        jct = end - job_start if job_start > 0 else end - train_start
        print(
            f"synthetic: jct_s={jct:.3f} train_s={end - train_start:.3f} "
            f"steps={steps} records={int(total.item())}",
            flush=True,
        )


# ------------------------------------------------------------------ dtlaunch


def build_model(lr: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same initial model on every rank, and its optimizer.

    Called before ``init_process_group``: the first optimizer imports
    torch._dynamo, which (torch 2.13) keeps references to any process group
    existing at that moment, so ``destroy_process_group()`` cannot free it and
    gloo's threads, still releasing the last collective's tensors, can abort the
    interpreter's exit (SIGABRT).
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def init_process_group() -> None:
    """gloo from torchrun's env vars; a lone ``python synthetic.py`` is rank 0 of 1."""
    if "RANK" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")


def init_job(args: argparse.Namespace) -> Any:
    """``dtlaunch.init()`` with this workload's data set (the DDS serves it)."""
    import dtlaunch

    return dtlaunch.init(
        dataset_size=args.dataset_size,
        shard_size=args.shard_size,
        epochs=args.epochs,
        global_batch=args.global_batch,
        seed=args.seed,
        prefetch=args.prefetch,
    )


def run_dtlaunch(args: argparse.Namespace) -> None:
    job = init_job(args)
    model, optimizer = build_model(args.lr)
    init_process_group()
    v = capacities(args.capacity, job.world_size)[job.rank]
    # A KILL_RESTART then replaces only the straggler: the newcomer gets the model
    # and optimizer state from a survivor, and the survivors keep theirs.
    job.attach(model, optimizer)
    data = features(args.dataset_size, args.seed)
    train_start = time.time()
    records = 0
    for batch in job.bsp_batches():
        optimizer.zero_grad()
        compute(model, data, batch, v)
        job.allreduce_gradients(model, samples=len(batch))
        for group in optimizer.param_groups:
            group["lr"] = args.lr * job.lr_factor
        optimizer.step()
        records += len(batch)
        job.step()
    job_start = float(os.environ.get("DTLAUNCH_JOB_START", "0") or 0)
    report(
        job.rank,
        job_start=job_start,
        train_start=train_start,
        steps=job.step_count,
        records=records,
    )
    job.close()
    dist.destroy_process_group()


# ------------------------------------------------------------------ PS mode


def run_ps(args: argparse.Namespace) -> None:
    import dtlaunch.ps

    job = init_job(args)
    model, _ = build_model(args.lr)
    ps = dtlaunch.ps.Client(model, optimizer="sgd", lr=args.lr)
    v = capacities(args.capacity, job.world_size)[job.rank]
    data = features(args.dataset_size, args.seed)
    train_start = time.time()
    records = 0
    for batch in job.batches(wait=0.05):  # [] while this worker holds no data
        ps.pull()
        model.zero_grad()
        compute(model, data, batch, v)
        ps.push(len(batch))  # 0 records: the BSP step counts this worker, weight 0
        records += len(batch)
        job.step()
    ps.close()
    # Only now a process group: a barrier over the workers that finished (a
    # replaced worker's newcomer included), so the time is the job's.
    init_process_group()
    job_start = float(os.environ.get("DTLAUNCH_JOB_START", "0") or 0)
    report(job.rank, job_start=job_start, train_start=train_start, steps=job.step_count,
           records=records)  # fmt: skip
    job.close()
    dist.destroy_process_group()


# ------------------------------------------------------------------ torchrun


def static_batches(
    n: int, epochs: int, global_batch: int, seed: int, rank: int, world: int
) -> Iterator[list[int]]:
    """torchrun's usual data split: each epoch a seeded permutation, each step the
    next ``global_batch`` records cut into ``world`` equal parts (rank i takes part i)."""
    base, extra = divmod(global_batch, world)
    lo = rank * base + min(rank, extra)
    hi = lo + base + (1 if rank < extra else 0)
    for epoch in range(epochs):
        order = list(range(n))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        for start in range(0, n, global_batch):
            step = order[start : start + global_batch]
            yield step[lo:hi]


def run_torchrun(args: argparse.Namespace) -> None:
    model, optimizer = build_model(args.lr)
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    v = capacities(args.capacity, world)[rank]
    hosts = [h for h in args.hosts.split(",") if h] if args.hosts else []
    if hosts and len(hosts) != world:
        raise ValueError(f"--hosts has {len(hosts)} labels for {world} ranks; give one per rank")
    host = hosts[rank] if hosts else f"rank{rank}"
    specs: tuple[InjectionSpec, ...] = parse_injections(args.inject)
    start = torch.tensor([args.job_start or time.time()], dtype=torch.float64)
    dist.broadcast(start, src=0)  # one clock for the transient windows, as DTLAUNCH_JOB_START
    job_start = float(start.item())
    rng = random.Random(args.seed)  # read only, as the SDK does: the same coins
    data = features(args.dataset_size, args.seed)
    train_start = time.time()
    steps = records = 0
    computed = 0.0  # the previous step's compute: what a slowdown factor scales
    for batch in static_batches(
        args.dataset_size, args.epochs, args.global_batch, args.seed, rank, world
    ):
        # The same place as the SDK: at the start of the step's compute, alongside
        # the other workers' compute, before the barrier.
        delay = injected_delay(
            specs,
            role="worker",
            rank=rank,
            host=host,
            now=time.time() - job_start,
            step_compute_s=computed,
            rng=rng,
        )
        if delay > 0:
            time.sleep(delay)
        began = time.monotonic()
        optimizer.zero_grad()
        compute(model, data, batch, v)
        computed = time.monotonic() - began
        _average_gradients(model, world)
        optimizer.step()
        records += len(batch)
        steps += 1
    report(
        rank,
        job_start=job_start if args.job_start else 0.0,
        train_start=train_start,
        steps=steps,
        records=records,
    )
    dist.destroy_process_group()


def _average_gradients(model: torch.nn.Module, world: int) -> None:
    for p in model.parameters():
        if p.grad is None:  # an empty last batch: join the allreduce with zeros
            p.grad = torch.zeros_like(p)
    grads: list[Any] = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.torchrun:
        run_torchrun(args)
    elif args.ps:
        run_ps(args)
    else:
        run_dtlaunch(args)


if __name__ == "__main__":
    main()
