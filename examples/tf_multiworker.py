"""A click-through model trained with TensorFlow's MultiWorkerMirroredStrategy.

A plain TensorFlow script: it knows nothing of dtlaunch. ``dtlaunch run
--framework tf`` gives every worker ``TF_CONFIG`` (the workers' addresses, which
the agents reserved, and this worker's index), and the strategy does the rest:
each worker holds a full copy of the model, computes the gradient of its part of
every global batch, and the gradients are summed over all workers (collective
allreduce over gRPC) before each identical update.

    dtlaunch run --framework tf --workers 3 examples/tf_multiworker.py --weights-out out/
    python examples/tf_multiworker.py               # no TF_CONFIG: one worker

The data is ``ctr_data.py``'s synthetic click set (as ``tf_ps.py`` and
``train_ps.py``); worker ``i`` of ``n`` reads records ``i, i+n, ...`` of each
global batch (tf.data's own ``shard`` rule), so the update is the mean gradient
of the whole global batch whatever the worker count. Each worker prints its
loss; ``--weights-out DIR`` writes ``DIR/worker-<index>.npz`` with its final
variables, which are identical on every worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ctr_data, when run by path

from ctr_data import BLOCK, CtrData, CtrSpec


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train-records", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dim", type=int, default=8, help="embedding size")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--weights-out", type=Path, default=None, help="folder for the weights")
    args = parser.parse_args(argv)
    for name in ("train_records", "epochs", "global_batch", "dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.lr > 0:
        parser.error("--lr must be more than 0")
    return args


class Model(tf.Module):
    """An embedding per categorical field and the dense features, through an MLP."""

    def __init__(self, spec: CtrSpec, dim: int) -> None:
        super().__init__()
        init = tf.random.stateless_normal  # the same start on every worker
        self.tables = [
            tf.Variable(init([spec.buckets, dim], seed=(1, f), stddev=0.05), name=f"emb{f}")
            for f in range(spec.fields)
        ]
        width = spec.fields * dim + spec.dense
        self.hidden = tf.Variable(init([width, 32], seed=(2, 0), stddev=(2 / width) ** 0.5))
        self.hidden_bias = tf.Variable(tf.zeros([32]))
        self.out = tf.Variable(init([32, 1], seed=(2, 1), stddev=0.25))
        self.out_bias = tf.Variable(tf.zeros([1]))

    def __call__(self, dense: tf.Tensor, buckets: tf.Tensor) -> tf.Tensor:
        embedded = [tf.gather(t, buckets[:, f]) for f, t in enumerate(self.tables)]
        x = tf.nn.relu(tf.matmul(tf.concat([*embedded, dense], 1), self.hidden) + self.hidden_bias)
        return tf.squeeze(tf.matmul(x, self.out) + self.out_bias, 1)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # Reads TF_CONFIG; without it, a cluster of this one worker.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    index = resolver.task_id if resolver and resolver.task_id is not None else 0
    workers = strategy.num_replicas_in_sync
    spec = CtrSpec(seed=args.data_seed)
    data = CtrData(spec, "train")
    first = data.range(0, BLOCK).dense
    mean, std = first.mean(axis=0), first.std(axis=0) + 1e-6
    with strategy.scope():
        model = Model(spec, args.dim)
    variables = list(model.trainable_variables)

    @tf.function
    def train_step(dense: tf.Tensor, buckets: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        def replica_step(dense: tf.Tensor, buckets: tf.Tensor, labels: tf.Tensor) -> Any:
            with tf.GradientTape() as tape:
                logits = model(dense, buckets)
                # Summed over this worker's records, over the global batch: the
                # workers' sum is the global batch's mean loss.
                losses = tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)
                loss = tf.reduce_sum(losses) / args.global_batch
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            # Summed over the workers in one batched collective.
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, (grads, loss))

        # One replica per worker here: its result is this worker's copy of the sums.
        summed = strategy.run(replica_step, args=(dense, buckets, labels))
        grads, loss = strategy.experimental_local_results(summed)[0]
        for var, grad in zip(variables, grads, strict=True):
            var.assign_sub(args.lr * grad)  # the same sum on every worker: same weights
        return loss

    steps_per_epoch = args.train_records // args.global_batch
    started = time.monotonic()
    losses: list[float] = []
    for epoch in range(args.epochs):
        for step in range(steps_per_epoch):
            first_record = step * args.global_batch
            mine = range(first_record + index, first_record + args.global_batch, workers)
            batch = data.batch(mine)
            dense = ((batch.dense - mean) / std).astype(np.float32)
            loss = train_step(
                tf.constant(dense),
                tf.constant(batch.buckets.astype(np.int32)),
                tf.constant(batch.labels),
            )
            losses.append(float(loss))
        print(
            f"worker {index}: epoch {epoch + 1} mean loss {np.mean(losses[-steps_per_epoch:]):.4f}"
        )
    seconds = time.monotonic() - started
    print(
        f"worker {index}: {len(losses)} steps of {workers} workers in {seconds:.1f}s, "
        f"loss {np.mean(losses[:20]):.4f} -> {np.mean(losses[-20:]):.4f}",
        flush=True,
    )
    if args.weights_out is not None:
        args.weights_out.mkdir(parents=True, exist_ok=True)
        arrays = {f"v{i}": v.numpy() for i, v in enumerate(variables)}
        np.savez(args.weights_out / f"worker-{index}.npz", **arrays)
        summary = {
            "loss_first": float(np.mean(losses[:20])),
            "loss_last": float(np.mean(losses[-20:])),
        }
        (args.weights_out / f"worker-{index}.json").write_text(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
