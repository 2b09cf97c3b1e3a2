"""A wide-and-deep click-through model trained through dtlaunch's parameter servers.

The data (``ctr_data.py``) is a synthetic Criteo-like set, 13 count features and
26 hashed categorical features, with labels drawn from a hidden logistic teacher,
so the best AUC a model can reach is known: the teacher's own AUC on the test
split. Records are indices served by the Stateful DDS; every worker materialises
the records it is handed from their index alone. The model's parameters live on
the servers: each step pulls them, computes the gradient of a local batch and
pushes it, weighted by the batch's records. At the end rank 0 pulls the final
parameters and prints ``AUC test=... teacher=... gap=...`` (and writes
``--result FILE`` as JSON).

    dtlaunch run --workers 4 --servers 2 examples/train_ps.py --result auc.json
    python examples/train_ps.py --local-servers 2     # one worker and its own servers

``job.batches(wait=...)`` yields an empty batch when this worker holds no data
(the last shards are with others): it still pushes, with 0 records, so a BSP
step never waits for a worker that waits for data.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ctr_data, when run by path

from ctr_data import BLOCK, CtrData, CtrSpec, auc

import dtlaunch
import dtlaunch.ps

EVAL_CHUNK = 8192


class WideAndDeep(nn.Module):
    """Wide: one weight per hashed category and per dense feature (a logistic
    regression). Deep: an embedding per field, concatenated with the dense
    features, through an MLP. One embedding table per field, as CTR models keep
    them, which also lets the PS spread them over the servers by size."""

    def __init__(self, spec: CtrSpec, *, dim: int = 8, hidden: Sequence[int] = (64, 32)) -> None:
        super().__init__()
        self.wide = nn.ModuleList(nn.Embedding(spec.buckets, 1) for _ in range(spec.fields))
        self.deep = nn.ModuleList(nn.Embedding(spec.buckets, dim) for _ in range(spec.fields))
        for table in self.wide:
            nn.init.zeros_(table.weight)
        for table in self.deep:
            nn.init.normal_(table.weight, 0.0, 0.05)
        self.wide_dense = nn.Linear(spec.dense, 1)
        layers: list[nn.Module] = []
        width = spec.fields * dim + spec.dense
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, dense: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
        wide = self.wide_dense(dense)
        for field, table in enumerate(self.wide):
            wide = wide + table(buckets[:, field])
        embedded = [table(buckets[:, field]) for field, table in enumerate(self.deep)]
        deep = self.mlp(torch.cat([*embedded, dense], dim=1))
        return (wide + deep).squeeze(1)


class Features:
    """Records -> model inputs; the dense scaling comes from the first train block,
    so every worker computes the same constants without talking to the others."""

    def __init__(self, train: CtrData) -> None:
        first = train.range(0, BLOCK).dense
        self.mean = torch.from_numpy(first.mean(axis=0))
        self.std = torch.from_numpy(first.std(axis=0) + 1e-6)

    def __call__(self, data: CtrData, indices: Sequence[int]) -> tuple[torch.Tensor, ...]:
        batch = data.batch(indices)
        dense = (torch.from_numpy(batch.dense) - self.mean) / self.std
        return dense, torch.from_numpy(batch.buckets), torch.from_numpy(batch.labels)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train-records", type=int, default=200_000)
    parser.add_argument("--test-records", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--shard-size", type=int, default=4 * BLOCK, help="records per DDS shard")
    parser.add_argument("--optimizer", default="adam", choices=("adam", "adagrad", "sgd"))
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--dim", type=int, default=8, help="embedding size of the deep part")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the data and teacher")
    parser.add_argument("--result", type=Path, default=None, help="write the result here (JSON)")
    parser.add_argument(
        "--local-servers",
        type=int,
        default=0,
        metavar="M",
        help="without dtlaunch run: start M parameter servers here (one worker, for debugging)",
    )
    parser.add_argument(
        "--ps-consistency",
        default="bsp",
        choices=("bsp", "asp"),
        help="with --local-servers: how the servers apply gradients",
    )
    args = parser.parse_args(argv)
    for name in ("train_records", "test_records", "epochs", "global_batch", "shard_size", "dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.lr > 0:
        parser.error("--lr must be more than 0")
    if args.local_servers < 0:
        parser.error("--local-servers must be 0 or more")
    if args.local_servers and "DTLAUNCH_SUPERVISOR" in os.environ:
        parser.error(
            "--local-servers is for standalone runs; under dtlaunch run use --servers M instead"
        )
    return args


@contextlib.contextmanager
def local_servers(count: int, consistency: str) -> Iterator[dict[str, object]]:
    """Start ``count`` servers with fresh keys; yields the Client's servers= and keys=."""
    from dtlaunch.ps.local import LocalServer
    from dtlaunch.wire.keys import create_run_keys, load_peer_keys, write_peer_keys

    with tempfile.TemporaryDirectory(prefix="train-ps-") as tmp:
        folder = Path(tmp)
        write_peer_keys(folder / "keys", create_run_keys(folder / "run-keys").peer())
        env = {"DTLAUNCH_PS_WORKERS": "0", "DTLAUNCH_PS_MODE": consistency}
        servers = [
            LocalServer(rank=i, keys_dir=folder / "keys", state_dir=folder / "ps", env=env)
            for i in range(count)
        ]
        try:
            endpoints = [s.wait_ready() for s in servers]
            yield {"servers": endpoints, "keys": load_peer_keys(folder / "keys")}
        finally:
            for server in servers:
                server.stop()


def evaluate(model: nn.Module, features: Features, test: CtrData, size: int) -> dict[str, float]:
    scores, labels, teacher = [], [], []
    with torch.no_grad():
        for start in range(0, size, EVAL_CHUNK):
            indices = range(start, min(size, start + EVAL_CHUNK))
            dense, buckets, y = features(test, indices)
            scores.append(model(dense, buckets).numpy())
            labels.append(y.numpy())
            teacher.append(test.batch(indices).teacher_logits)
    y_all, logits = np.concatenate(labels), np.concatenate(scores)
    model_auc = auc(y_all, logits)
    teacher_auc = auc(y_all, np.concatenate(teacher))
    # The test set's mean log loss (binary cross-entropy of the logits).
    logloss = float(np.mean(np.logaddexp(0.0, logits) - y_all * logits))
    return {
        "auc": model_auc,
        "teacher_auc": teacher_auc,
        "gap": teacher_auc - model_auc,
        "logloss": logloss,
    }


def train(args: argparse.Namespace, ps_options: dict[str, object]) -> None:
    started = time.monotonic()
    job = dtlaunch.init(
        dataset_size=args.train_records,
        shard_size=args.shard_size,
        epochs=args.epochs,
        global_batch=args.global_batch,
    )
    spec = CtrSpec(seed=args.data_seed)
    train_data, test_data = CtrData(spec, "train"), CtrData(spec, "test")
    features = Features(train_data)
    torch.manual_seed(0)  # every worker builds the same initial model
    model = WideAndDeep(spec, dim=args.dim)
    ps = dtlaunch.ps.Client(model, optimizer=args.optimizer, lr=args.lr, job=job, **ps_options)
    records, loss_sum = 0, 0.0
    try:
        for idx in job.batches(wait=0.05):  # [] when this worker holds no data now
            ps.pull()
            model.zero_grad()
            if idx:
                dense, buckets, labels = features(train_data, idx)
                loss = nn.functional.binary_cross_entropy_with_logits(model(dense, buckets), labels)
                loss.backward()
                records += len(idx)
                loss_sum += loss.item() * len(idx)
            ps.push(len(idx))  # 0 records: the BSP step counts this worker, weight 0
            job.step()
        if job.rank == 0:
            ps.pull()  # every record of the job is trained: these are the final parameters
    finally:
        ps.close()
        job.close()
    seconds = time.monotonic() - started
    print(
        f"rank {job.rank}: trained {records} records in {job.step_count} steps, "
        f"mean loss {loss_sum / max(records, 1):.4f}, {seconds:.1f}s",
        flush=True,
    )
    if job.rank != 0:
        return
    result = evaluate(model, features, test_data, args.test_records)
    print(
        f"AUC test={result['auc']:.4f} teacher={result['teacher_auc']:.4f} gap={result['gap']:.4f}",
        flush=True,
    )
    if args.result is not None:
        result.update(
            seconds=seconds,
            workers=job.world_size,
            servers=len(ps.endpoints),
            train_records=args.train_records,
            test_records=args.test_records,
            epochs=args.epochs,
            global_batch=args.global_batch,
            optimizer=args.optimizer,
            lr=args.lr,
            rank0_records=records,
            rank0_steps=job.step_count,
        )
        tmp = args.result.with_suffix(args.result.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, args.result)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.local_servers:
        with local_servers(args.local_servers, args.ps_consistency) as options:
            train(args, options)
    else:
        train(args, {})


if __name__ == "__main__":
    main()
