"""A single-process simulation of ``benchmarks/rna.py``'s rounds, for choosing
how RNA's final model is made (``--policy rna:average=``).

The benchmark's data, model, learning rate and momentum (``rna_train.py``);
eight simulated workers with scenario b's per-iteration times (50 ms of compute
plus 0-50 ms on ranks 0-3, 50-100 ms on ranks 4-7, from a seeded RNG); a
round every ``--round-ms`` (the benchmark's rna runs ~23 rounds/s). A worker
computes each gradient on the global model of the round its iteration began
at, and joins a round with the staleness-weighted mean of the gradients it
finished since its last one (``solvers.rna.staleness_weights``); the round
applies the contributors' mean at the rate times ``contributors / 8`` with the
momentum rule ``--rule`` (``auto``: ``solvers.rna.momentum_for_staleness``, the
default; ``keep``; ``scaled``: auto's step divided by ``1 + staleness``). Every
worker reads the 32,000 training records once, 16 a batch.

It prints BSP's test accuracy (250 steps of 128, heavy-ball), then per seed the
accuracy of the last round's model and of the exponential moving average of the
global model over its updates (``--average``). No processes, no network: it
isolates the arithmetic of the rounds from their timing on a real cluster.

    python benchmarks/rna_sim.py --average 0.9 --seeds 3
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402
from rna_train import build_model, evaluate, flat, load_flat, make_data  # noqa: E402

from dtlaunch.solvers.rna import momentum_for_staleness, staleness_weights  # noqa: E402

WORKERS = 8
BATCH = 16  # the benchmark's global batch of 128 over eight workers
RECORDS, TEST_RECORDS = 32_000, 16_000
LR, MOMENTUM = 0.02, 0.9
STALENESS_BOUND = 8
SLOW = {4, 5, 6, 7}


def gradient(model: torch.nn.Module, at: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    load_flat(model, at)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()


def bsp(data) -> float:
    x, y, x_test, y_test = data
    model, optimizer = build_model(LR, MOMENTUM)
    for step in range(RECORDS // (BATCH * WORKERS)):
        rows = slice(step * BATCH * WORKERS, (step + 1) * BATCH * WORKERS)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
    return evaluate(model, x_test, y_test)[1]


def rounds(data, seed: int, *, rule: str, average: float, round_ms: float):
    """(rounds, accuracy of the last model, accuracy of the average)."""
    x, y, x_test, y_test = data
    rng = random.Random(seed)
    model, _ = build_model(LR, MOMENTUM)
    weights = flat(model)
    models = {0: weights.clone()}  # version -> the global model (gradients' base)
    velocity = torch.zeros_like(weights)
    averaged = weights.clone()

    def iteration(rank: int) -> float:
        return 0.05 + (rng.uniform(0.05, 0.1) if rank in SLOW else rng.uniform(0.0, 0.05))

    finish = [iteration(r) for r in range(WORKERS)]
    began_at = [0] * WORKERS  # the version each worker's iteration began on
    pending: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(WORKERS)]
    cursor = version = 0
    now = 0.0
    while cursor < RECORDS or any(pending):
        now += round_ms / 1000
        for rank in range(WORKERS):
            while finish[rank] <= now and cursor < RECORDS:
                rows = slice(cursor, cursor + BATCH)
                cursor += BATCH
                base = models[began_at[rank]]
                pending[rank].append((began_at[rank], gradient(model, base, x[rows], y[rows])))
                began_at[rank] = version
                finish[rank] += iteration(rank)
        contributions, staleness = [], []
        for rank in range(WORKERS):
            if not pending[rank]:
                continue
            versions = [v for v, _ in pending[rank]]
            coeffs = staleness_weights(versions, current=version, bound=STALENESS_BOUND)
            if sum(coeffs) > 0:
                kept = [(c, v, g) for c, (v, g) in zip(coeffs, pending[rank], strict=True) if c > 0]
                contributions.append(sum(c * g for c, _, g in kept))
                staleness.append(sum(c * (version - v) for c, v, _ in kept))
            pending[rank] = []
        if not contributions:
            continue
        mean = sum(contributions) / len(contributions)
        tau = sum(staleness) / len(staleness)
        if rule == "keep":
            mu, factor = MOMENTUM, 1.0
        else:
            mu, factor = momentum_for_staleness(MOMENTUM, tau)
            if rule == "scaled":
                factor /= 1 + tau
        velocity = mu * velocity + mean
        weights = weights - LR * len(contributions) / WORKERS * factor * velocity
        version += 1
        models[version] = weights.clone()
        averaged = average * averaged + (1 - average) * weights
    load_flat(model, weights)
    last = evaluate(model, x_test, y_test)[1]
    load_flat(model, averaged)
    return version, last, evaluate(model, x_test, y_test)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rule", choices=("auto", "keep", "scaled"), default="auto")
    parser.add_argument("--average", type=float, default=0.9, help="the average's weight")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--round-ms", type=float, default=43.0)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = make_data(RECORDS, TEST_RECORDS, 1)
    print(f"BSP: test accuracy {bsp(data):.2%}", flush=True)
    for seed in range(opts.seeds):
        count, last, averaged = rounds(
            data, seed, rule=opts.rule, average=opts.average, round_ms=opts.round_ms
        )
        print(
            f"seed {seed}: {count} rounds ({opts.rule}); test accuracy of the last model "
            f"{last:.2%}, of the average ({opts.average:g}) {averaged:.2%}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
