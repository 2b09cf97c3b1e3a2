"""The training script of ``benchmarks/rna.py`` (RNA §8.1): one MLP, one data set,
the same code under every column.

An MLP (32 -> 64 -> 64 -> 8 classes, ReLU) learns a synthetic classification
task generated from ``--seed``: Gaussian inputs labelled by the arg-max of a
random teacher network (32 -> 128 -> 128 -> 8, tanh), a held-out test split
beside the training records. SGD with momentum, the same initial model on every
rank; training goes through ``dtlaunch.rna.Trainer``:

- ``dtlaunch run --policy rna``: RNA (the trainer's communication thread);
  batches from ``job.batches()``, each worker at its own pace.
- ``dtlaunch run`` with any other policy: the trainer's synchronous step
  (gradients averaged by records, ``init_process_group`` done by the trainer);
  batches from ``job.bsp_batches()`` (the DDS too, but every worker closes the same
  steps: a plain ``batches()`` loop can hang at the end, when one worker is out
  of shards while the others wait for it in a collective). ``job.lr_factor`` is
  applied, as in examples/synthetic.py (AdjustLR under nd).
- ``--torchrun`` (real torchrun): the same synchronous step; a static equal
  partition of each global batch by RANK (``examples/synthetic.py``'s
  ``static_batches``).

Every iteration's forward and backward pass is stretched to ``--compute-ms`` by a
sleep (the device time of a real model, the same on every worker), then sleeps an
injected delay (§8.1: "system delay randomly ... on each process"): uniform in
``--delay-ms LO,HI``, or in ``--slow-delay-ms`` on ``--slow-ranks``, drawn from a
per-rank seeded RNG.

Rank 0 keeps a copy of its model (under RNA: the newest global model it has)
every ``--snapshot-s`` seconds with the wall time, and evaluates them after
training on a fixed evaluation subset of the training set (the first
``--eval-records``), so that the loss curve costs the loop nothing. Every rank
writes ``OUT/rank-<r>.json``: its final loss on that subset, its test accuracy,
its iterations, records, mean iteration time and (RNA) rounds; rank 0's also has
the curve ``[[wall time, model version, loss], ...]`` and the clock origins
(``job_start``: launch; ``loop_start``: rank 0's loop; ``first_update``: the first
global update in rank 0's model; ``end``: training over on every rank).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dtlaunch  # noqa: E402
import dtlaunch.rna  # noqa: E402
from examples.synthetic import static_batches  # noqa: E402

INPUTS, HIDDEN, CLASSES = 32, 64, 8
TEACHER_HIDDEN = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for rank-<r>.json")
    parser.add_argument("--records", type=int, default=32_000, help="training records")
    parser.add_argument("--test-records", type=int, default=16_000)
    parser.add_argument("--eval-records", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--shard-size", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        help="each iteration's compute, stretched to this many ms by a sleep (the device time "
        "a real model's forward and backward take; the same on every worker)",
    )
    parser.add_argument("--delay-ms", default="0,50", help="LO,HI: uniform delay per iteration")
    parser.add_argument("--slow-ranks", default="", help="ranks with --slow-delay-ms: 4,5,6,7")
    parser.add_argument("--slow-delay-ms", default="50,100")
    parser.add_argument("--snapshot-s", type=float, default=0.05)
    parser.add_argument("--torchrun", action="store_true", help="plain torchrun, static split")
    parser.add_argument(
        "--job-start", type=float, default=0.0, help="--torchrun: wall time of the launch"
    )
    args = parser.parse_args(argv)
    if args.records % args.global_batch:
        parser.error("--records must be a multiple of --global-batch (equal torchrun steps)")
    args.delay = _pair(parser, "--delay-ms", args.delay_ms)
    args.slow_delay = _pair(parser, "--slow-delay-ms", args.slow_delay_ms)
    args.slow = {int(r) for r in args.slow_ranks.split(",") if r.strip()}
    return args


def _pair(parser: argparse.ArgumentParser, name: str, text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) / 1000.0 for v in text.split(","))
    except ValueError:
        parser.error(f"{name} {text!r}: give LO,HI in ms")
    if not 0 <= lo <= hi:
        parser.error(f"{name} {text!r}: need 0 <= LO <= HI")
    return lo, hi


def make_data(records: int, test: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Training and test records: Gaussian inputs, the teacher's arg-max as label."""
    gen = torch.Generator().manual_seed(seed)
    w1 = torch.randn(INPUTS, TEACHER_HIDDEN, generator=gen) / INPUTS**0.5
    w2 = torch.randn(TEACHER_HIDDEN, TEACHER_HIDDEN, generator=gen) / TEACHER_HIDDEN**0.5
    w3 = torch.randn(TEACHER_HIDDEN, CLASSES, generator=gen) / TEACHER_HIDDEN**0.5
    x = torch.randn(records + test, INPUTS, generator=gen)
    y = (torch.tanh(torch.tanh(x @ w1) @ w2) @ w3).argmax(dim=1)
    return x[:records], y[:records], x[records:], y[records:]


def build_model(lr: float, momentum: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same initial model on every rank and in every column
    model = torch.nn.Sequential(
        torch.nn.Linear(INPUTS, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def load_flat(model: torch.nn.Module, values: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(values[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on ``x, y``."""
    with torch.no_grad():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y).item()
        acc = (logits.argmax(dim=1) == y).float().mean().item()
    return float(loss), float(acc)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = make_data(args.records, args.test_records, args.seed)
    model, optimizer = build_model(args.lr, args.momentum)  # before any process group
    job: Any = None
    if args.torchrun:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        job_start = args.job_start
    else:
        job = dtlaunch.init(
            dataset_size=args.records,
            shard_size=args.shard_size,
            epochs=args.epochs,
            global_batch=args.global_batch,
            seed=args.seed,
            prefetch=args.prefetch,
        )
        rank, world = job.rank, job.world_size
        job_start = float(os.environ.get("DTLAUNCH_JOB_START", "0") or 0)
    trainer = dtlaunch.rna.Trainer(model, optimizer)  # sync mode: init_process_group here
    if args.torchrun:
        batches = static_batches(
            args.records, args.epochs, args.global_batch, args.seed, rank, world
        )
    elif trainer.mode == "sync":
        batches = job.bsp_batches()
    else:
        batches = job.batches()
    lo, hi = args.slow_delay if rank in args.slow else args.delay
    delays = random.Random(f"{args.seed}:delay:{rank}")
    loss_fn = torch.nn.functional.cross_entropy

    snapshots: list[tuple[float, int, torch.Tensor]] = []
    loop_start = time.time()
    first_update: float | None = None
    last_snap = 0.0
    steps = records = 0
    slept = 0.0
    compute_s = args.compute_ms / 1000.0
    for idx in batches:
        began = time.monotonic()
        if idx:
            loss_fn(model(x_train[idx]), y_train[idx]).backward()
        pause = delays.uniform(lo, hi) + max(0.0, compute_s - (time.monotonic() - began))
        if pause > 0:
            time.sleep(pause)
            slept += pause
        if job is not None and trainer.mode == "sync":
            for group in optimizer.param_groups:
                group["lr"] = args.lr * job.lr_factor
        trainer.step()
        if job is not None:
            job.step()
        steps += 1
        records += len(idx)
        if rank == 0:
            now = time.time()
            if first_update is None and trainer.version > 0:
                first_update = now
            if now - last_snap >= args.snapshot_s:
                last_snap = now
                snapshots.append((now, trainer.version, flat(model)))
    loop_end = time.time()
    trainer.close()  # RNA: waits for every worker, one last round; the model is final
    end = time.time()
    if rank == 0:
        snapshots.append((end, trainer.version, flat(model)))
    if job is not None:
        job.close()
    eval_x, eval_y = x_train[: args.eval_records], y_train[: args.eval_records]
    final_loss, train_acc = evaluate(model, eval_x, eval_y)
    test_loss, test_acc = evaluate(model, x_test, y_test)
    result: dict[str, Any] = {
        "rank": rank,
        "world": world,
        "mode": "torchrun" if args.torchrun else trainer.mode,
        "version": trainer.version,
        "rounds": trainer.rounds,
        "steps": steps,
        "records": records,
        "iteration_s": (loop_end - loop_start) / steps if steps else None,
        "slept_s": round(slept, 3),
        "loop_s": round(loop_end - loop_start, 3),
        "final_loss": final_loss,
        "train_acc": train_acc,
        "test_loss": test_loss,
        "test_acc": test_acc,
    }
    if rank == 0:
        probe, _ = build_model(args.lr, args.momentum)
        curve = []
        for when, version, values in snapshots:
            load_flat(probe, values)
            curve.append([round(when, 4), version, round(evaluate(probe, eval_x, eval_y)[0], 5)])
        result.update(
            job_start=job_start or None,
            loop_start=loop_start,
            first_update=first_update,
            loop_end=loop_end,
            end=end,
            curve=curve,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{rank}.json").write_text(json.dumps(result))
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
