"""A wide-and-deep click-through model trained with TensorFlow's ParameterServerStrategy.

The same synthetic Criteo-like data as ``train_ps.py`` (``ctr_data.py``): 13 count
features, 26 hashed categorical features, labels from a hidden logistic teacher
whose own AUC is the best a model can reach. The model's variables (an embedding
table per field, the wide weights, the MLP) and Adagrad's accumulators live on
the ``ps`` tasks, spread over them by TensorFlow; the ``worker`` tasks run the
training steps; this script runs only as the ``chief``, which coordinates.

    dtlaunch run --framework tf --workers 3 --servers 2 examples/tf_ps.py
    python examples/tf_ps.py            # no TF_CONFIG: one process trains alone

Under dtlaunch, worker 0 is the chief and workers 1.. are TF's worker tasks that
dtlaunch runs itself (``python -m dtlaunch.tfserver``), as it runs the ps tasks.
The records come from dtlaunch's dynamic data sharding: a ``tf.data`` pipeline
reads ``job.batches()``, the chief schedules one step per batch on whichever
worker is free, and acks a batch (``job.step()``) only once the step that trained
it has run, so a worker killed mid-step loses nothing: TensorFlow's coordinator
runs the step again on another worker, and dtlaunch restarts the killed one on
its own host:port, where the coordinator finds it again.

At the end the chief prints ``AUC test=... teacher=... gap=...`` and the mean
log-loss of the last batches (and writes ``--result FILE`` as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ctr_data, when run by path

from ctr_data import BLOCK, CtrData, CtrSpec, auc

import dtlaunch

EVAL_CHUNK = 8192


class WideAndDeep(tf.Module):
    """Wide: one weight per hashed category and per dense feature. Deep: an
    embedding per field and the dense features through an MLP. Variables made
    under a ParameterServerStrategy's scope are placed on its ps tasks."""

    def __init__(self, spec: CtrSpec, *, dim: int, hidden: Sequence[int] = (64, 32)) -> None:
        super().__init__()
        init = tf.random.stateless_normal  # every run starts from the same model
        self.wide = [
            tf.Variable(tf.zeros([spec.buckets]), name=f"wide{f}") for f in range(spec.fields)
        ]
        self.deep = [
            tf.Variable(init([spec.buckets, dim], seed=(1, f), stddev=0.05), name=f"deep{f}")
            for f in range(spec.fields)
        ]
        self.wide_dense = tf.Variable(tf.zeros([spec.dense]), name="wide_dense")
        self.bias = tf.Variable(0.0, name="bias")
        self.layers: list[tuple[tf.Variable, tf.Variable]] = []
        width = spec.fields * dim + spec.dense
        for i, size in enumerate((*hidden, 1)):
            scale = (2.0 / width) ** 0.5
            kernel = tf.Variable(init([width, size], seed=(2, i), stddev=scale), name=f"w{i}")
            self.layers.append((kernel, tf.Variable(tf.zeros([size]), name=f"b{i}")))
            width = size

    def __call__(self, dense: tf.Tensor, buckets: tf.Tensor) -> tf.Tensor:
        wide = tf.linalg.matvec(dense, self.wide_dense) + self.bias
        embedded = []
        for field in range(len(self.wide)):
            ids = buckets[:, field]
            wide += tf.gather(self.wide[field], ids)
            embedded.append(tf.gather(self.deep[field], ids))
        x = tf.concat([*embedded, dense], axis=1)
        for i, (kernel, bias) in enumerate(self.layers):
            x = tf.matmul(x, kernel) + bias
            if i < len(self.layers) - 1:
                x = tf.nn.relu(x)
        return wide + tf.squeeze(x, axis=1)


class Adagrad:
    """Adagrad (the usual optimizer of CTR models) on the model's variables; the
    accumulators are made in the same scope, so they live beside their variable."""

    def __init__(self, variables: Sequence[tf.Variable], lr: float) -> None:
        self.variables = list(variables)
        self.lr = lr
        self.slots = [
            tf.Variable(tf.fill(v.shape, 0.1), name=f"acc{i}") for i, v in enumerate(variables)
        ]

    def apply(self, grads: Sequence[Any]) -> None:
        for var, acc, grad in zip(self.variables, self.slots, grads, strict=True):
            grad = tf.convert_to_tensor(grad)  # an embedding's IndexedSlices, made dense
            acc.assign_add(grad * grad)
            var.assign_sub(self.lr * grad / tf.sqrt(acc))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train-records", type=int, default=200_000)
    parser.add_argument("--test-records", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256, help="records per step")
    parser.add_argument("--shard-size", type=int, default=4 * BLOCK, help="records per DDS shard")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dim", type=int, default=8, help="embedding size of the deep part")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the data and teacher")
    parser.add_argument("--result", type=Path, default=None, help="write the result here (JSON)")
    args = parser.parse_args(argv)
    for name in ("train_records", "test_records", "epochs", "batch", "shard_size", "dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.lr > 0:
        parser.error("--lr must be more than 0")
    return args


def strategy_and_coordinator() -> tuple[tf.distribute.Strategy, Any, int]:
    """ParameterServerStrategy, its coordinator and the number of TF workers under
    TF_CONFIG, else TF's default strategy (no coordinator)."""
    if "TF_CONFIG" not in os.environ:
        return tf.distribute.get_strategy(), None, 0
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type != "chief":
        sys.exit(
            f"tf_ps.py runs as the chief, not as {resolver.task_type} {resolver.task_id}: "
            "start it with dtlaunch run --framework tf --servers M (PS mode)"
        )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    workers = len(resolver.cluster_spec().as_dict().get("worker", []))
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy), workers


class Inputs:
    """Records -> model inputs; the dense scaling comes from the first train block."""

    def __init__(self, train: CtrData) -> None:
        first = train.range(0, BLOCK).dense
        self.mean, self.std = first.mean(axis=0), first.std(axis=0) + 1e-6

    def __call__(self, data: CtrData, indices: Sequence[int]) -> tuple[np.ndarray, ...]:
        batch = data.batch(indices)
        dense = ((batch.dense - self.mean) / self.std).astype(np.float32)
        return dense, batch.buckets.astype(np.int32), batch.labels.astype(np.float32)


def train(args: argparse.Namespace) -> None:
    started = time.monotonic()
    job = dtlaunch.init(
        dataset_size=args.train_records,
        shard_size=args.shard_size,
        epochs=args.epochs,
        global_batch=args.batch,
    )
    # Batches are read ahead of the steps that train them: ack one per step().
    job.count_one_batch_per_step()
    spec = CtrSpec(seed=args.data_seed)
    train_data, test_data = CtrData(spec, "train"), CtrData(spec, "test")
    inputs = Inputs(train_data)
    strategy, coordinator, workers = strategy_and_coordinator()
    with strategy.scope():
        model = WideAndDeep(spec, dim=args.dim)
        optimizer = Adagrad(model.trainable_variables, args.lr)
        # Summed on the ps tasks by every step: a step's return value would live on
        # the worker that ran it, and is lost if that worker dies before it is read.
        loss_sum = tf.Variable(0.0, name="loss_sum")

    @tf.function
    def train_step(dense: tf.Tensor, buckets: tf.Tensor, labels: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            logits = model(dense, buckets)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        optimizer.apply(tape.gradient(loss, optimizer.variables))
        loss_sum.assign_add(loss)

    # tf.data fed by the DDS. No prefetch: the pipeline then reads job.batches()
    # only while this thread waits for it, never beside a job.step(). wait=: when
    # this process holds no unread record (at the end, the last shard is read but
    # waits for the acks of its steps still in flight), an empty batch comes
    # instead of a wait that those acks could never end.
    def records() -> Iterator[tuple[np.ndarray, ...]]:
        for idx in job.batches(wait=0.05):
            yield inputs(train_data, idx)

    signature = (
        tf.TensorSpec([None, spec.dense], tf.float32),
        tf.TensorSpec([None, spec.fields], tf.int32),
        tf.TensorSpec([None], tf.float32),
    )
    dataset = tf.data.Dataset.from_generator(records, output_signature=signature)
    # Steps scheduled before the coordinator is joined: enough to keep every worker
    # busy. join() returns once each of them has run (a step whose worker died is
    # run again on another); only then are their batches acked.
    window = 4 * workers
    scheduled, steps, last_sum, recent_loss = 0, 0, 0.0, float("nan")

    def finish_scheduled() -> None:
        nonlocal scheduled, last_sum, recent_loss
        if coordinator is not None:
            coordinator.join()
        if scheduled:
            total = float(loss_sum.numpy())
            recent_loss, last_sum = (total - last_sum) / scheduled, total
        for _ in range(scheduled):
            job.step()
        scheduled = 0

    try:
        for dense, buckets, labels in dataset:
            if dense.shape[0] == 0:  # nothing to read now: finish what is scheduled
                finish_scheduled()
                continue
            if coordinator is None:
                train_step(dense, buckets, labels)
            else:
                coordinator.schedule(train_step, args=(dense, buckets, labels))
            scheduled += 1
            steps += 1
            if scheduled >= max(1, window):
                finish_scheduled()
        finish_scheduled()
    finally:
        job.close()
    seconds = time.monotonic() - started
    result = evaluate(model, inputs, test_data, args.test_records)
    result.update(loss=recent_loss, steps=steps)
    print(
        f"chief: {steps} steps in {seconds:.1f}s, recent loss {result['loss']:.4f}; "
        f"AUC test={result['auc']:.4f} teacher={result['teacher_auc']:.4f} "
        f"gap={result['gap']:.4f}",
        flush=True,
    )
    if args.result is not None:
        result.update(seconds=seconds, train_records=args.train_records, epochs=args.epochs)
        tmp = args.result.with_suffix(args.result.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, args.result)


def evaluate(model: WideAndDeep, inputs: Inputs, test: CtrData, size: int) -> dict[str, float]:
    """AUC on the test split, computed here with the variables read from the ps tasks."""
    # One traced function: each eager op on a remote variable is a round trip.
    predict = tf.function(model.__call__)
    scores, labels, teacher = [], [], []
    for start in range(0, size, EVAL_CHUNK):
        indices = range(start, min(size, start + EVAL_CHUNK))
        dense, buckets, y = inputs(test, indices)
        scores.append(predict(tf.constant(dense), tf.constant(buckets)).numpy())
        labels.append(y)
        teacher.append(test.batch(indices).teacher_logits)
    y_all = np.concatenate(labels)
    model_auc = auc(y_all, np.concatenate(scores))
    teacher_auc = auc(y_all, np.concatenate(teacher))
    return {"auc": model_auc, "teacher_auc": teacher_auc, "gap": teacher_auc - model_auc}


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))
    if "TF_CONFIG" in os.environ:
        # Every step is joined and the result written. Leave before the
        # ClusterCoordinator's destructor: while it still reconnects a worker that
        # was restarted, it blocks on that reconnection, which gRPC's backoff can
        # put off for minutes (dtlaunch stops the worker and ps tasks next).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
