"""A synthetic Criteo-like click data set drawn from a hidden logistic "teacher".

Every record is a pure function of (seed, split, index): records come in blocks
of ``BLOCK`` and block ``b`` of a split is drawn by its own generator, seeded by
``SeedSequence([seed, split, b])``, so any worker materialises any record without
a file and without reading the records before it. Like Criteo's display-ads
data, a record has 13 integer "count" features (heavy-tailed, some missing) and
26 categorical features whose raw values follow a power law and reach the model
only as hashed bucket ids (``buckets`` per field, so rare values collide).

The teacher is logistic in what generated the record: a bias, one weight per raw
category value of every field, weights on ``log1p`` of the counts, and a few
pairwise field interactions (dot products of per-value factors, which the deep
part of a wide-and-deep model can learn but a linear model cannot). A label is
``Bernoulli(sigmoid(teacher logit))``, so the teacher's own AUC on the test split
is what a perfect model could reach there (``teacher_auc``).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["BLOCK", "CtrBatch", "CtrData", "CtrSpec", "auc", "teacher_auc"]

BLOCK = 2048  # records drawn together; a DDS shard of a multiple of this reads whole blocks
SPLITS = {"train": 0, "test": 1}
_CACHE_BLOCKS = 64
_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads consecutive values


@dataclass(frozen=True, slots=True, kw_only=True)
class CtrSpec:
    """The data set's shape; the same spec gives the same records everywhere."""

    seed: int = 0
    dense: int = 13
    fields: int = 26
    buckets: int = 1024  # hashed ids per categorical field
    min_vocab: int = 2  # raw values per field, log-uniform in [min_vocab, max_vocab]
    max_vocab: int = 200
    interactions: int = 4  # field pairs with a factor interaction in the teacher
    factor_dim: int = 4
    factor_scale: float = 0.3
    min_skew: float = 2.5  # popularity: value = floor(vocab * u**skew), skew per field
    max_skew: float = 5.0
    click_rate: float = 0.25  # roughly: the teacher's bias is set for this mean

    def validate(self) -> CtrSpec:
        if self.dense < 1 or self.fields < 2 or self.buckets < 2:
            raise ValueError(
                f"CtrSpec needs dense >= 1, fields >= 2, buckets >= 2, got {self.dense}, "
                f"{self.fields}, {self.buckets}"
            )
        if not 1 <= self.min_vocab <= self.max_vocab:
            raise ValueError(
                f"CtrSpec needs 1 <= min_vocab <= max_vocab, got {self.min_vocab}, {self.max_vocab}"
            )
        if not 0.0 < self.click_rate < 1.0:
            raise ValueError(f"click_rate must be in (0, 1), got {self.click_rate}")
        return self


@dataclass(frozen=True, slots=True)
class CtrBatch:
    dense: np.ndarray  # float32 [n, dense]: log1p(count), 0 where missing
    buckets: np.ndarray  # int64 [n, fields]: hashed category id per field, in [0, buckets)
    labels: np.ndarray  # float32 [n]: 0 or 1
    teacher_logits: np.ndarray  # float32 [n]: what the labels were drawn from


class _Teacher:
    """The hidden model; drawn from the spec's seed alone."""

    def __init__(self, spec: CtrSpec) -> None:
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7919]))
        log_lo, log_hi = np.log(spec.min_vocab), np.log(spec.max_vocab)
        self.vocab = np.exp(rng.uniform(log_lo, log_hi, spec.fields)).astype(np.int64)
        # Power-law popularity: value = floor(vocab * u**skew), a few values are most
        # of the traffic, as with Criteo's advertisers and sites.
        self.skew = rng.uniform(spec.min_skew, spec.max_skew, spec.fields)
        scale = rng.uniform(0.1, 0.4, spec.fields)
        self.cat_weights = [
            _centred(rng.normal(0.0, s, v), self.popularity(f))
            for f, (s, v) in enumerate(zip(scale, self.vocab, strict=True))
        ]
        # Counts: log-normal with a field-specific location and spread, missing at times.
        self.count_mu = rng.uniform(0.0, 4.0, spec.dense)
        self.count_sigma = rng.uniform(0.5, 1.5, spec.dense)
        self.missing = rng.uniform(0.0, 0.3, spec.dense)
        self.dense_weights = rng.normal(0.0, 0.25, spec.dense) / self.count_sigma
        # Interactions between fields of modest vocabulary (as in "site x ad size"),
        # so that a wide-and-deep model can learn them from a few epochs of data.
        small = np.argsort(self.vocab, kind="stable")[: max(2, spec.fields // 2)]
        self.pairs = [
            (int(a), int(b))
            for a, b in (rng.choice(small, size=2, replace=False) for _ in range(spec.interactions))
        ]
        # Per-value factors (only fields in a pair use theirs), centred like the weights.
        self.factors = [
            _centred(rng.normal(0.0, spec.factor_scale, (v, spec.factor_dim)), self.popularity(f))
            for f, v in enumerate(self.vocab)
        ]
        self.salt = np.uint64(rng.integers(1, 2**62))
        self.bias = float(np.log(spec.click_rate / (1 - spec.click_rate)))

    def popularity(self, field: int) -> np.ndarray:
        """P(value) of a field: value = floor(vocab * u**skew), u uniform on [0, 1)."""
        edges = (np.arange(self.vocab[field] + 1) / self.vocab[field]) ** (1.0 / self.skew[field])
        return np.asarray(np.diff(edges), dtype=np.float64)


def _centred(weights: np.ndarray, popularity: np.ndarray) -> np.ndarray:
    """Weights with a traffic-weighted mean of zero (the bias alone sets the click rate)."""
    return weights - np.tensordot(popularity, weights, axes=(0, 0))


class CtrData:
    """Records of one split, drawn block by block (blocks are cached, LRU)."""

    def __init__(self, spec: CtrSpec, split: str = "train") -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.spec = spec.validate()
        self.split = split
        self.teacher = _Teacher(spec)
        self._cache: OrderedDict[int, CtrBatch] = OrderedDict()

    def batch(self, indices: Sequence[int] | np.ndarray) -> CtrBatch:
        """The records at ``indices`` (any order, repeats allowed)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and idx.min() < 0:
            raise ValueError(f"record indices must be >= 0, got {int(idx.min())}")
        blocks, offsets = np.divmod(idx, BLOCK)
        parts = []
        order = np.argsort(blocks, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(blocks[order]) != 0]) if idx.size else []
        bounds = [*list(starts), idx.size]
        for a, b in itertools.pairwise(bounds):
            rows = order[a:b]
            block = self._block(int(blocks[rows[0]]))
            parts.append((rows, offsets[rows], block))
        out = CtrBatch(
            dense=np.empty((idx.size, self.spec.dense), np.float32),
            buckets=np.empty((idx.size, self.spec.fields), np.int64),
            labels=np.empty(idx.size, np.float32),
            teacher_logits=np.empty(idx.size, np.float32),
        )
        for rows, offs, block in parts:
            out.dense[rows] = block.dense[offs]
            out.buckets[rows] = block.buckets[offs]
            out.labels[rows] = block.labels[offs]
            out.teacher_logits[rows] = block.teacher_logits[offs]
        return out

    def range(self, start: int, stop: int) -> CtrBatch:
        return self.batch(np.arange(start, stop))

    def _block(self, number: int) -> CtrBatch:
        cached = self._cache.get(number)
        if cached is not None:
            self._cache.move_to_end(number)
            return cached
        block = draw_block(self.spec, self.teacher, SPLITS[self.split], number)
        self._cache[number] = block
        if len(self._cache) > _CACHE_BLOCKS:
            self._cache.popitem(last=False)
        return block


def draw_block(spec: CtrSpec, teacher: _Teacher, split: int, number: int) -> CtrBatch:
    """Block ``number`` of a split: ``BLOCK`` records from their own generator."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, split, number]))
    n = BLOCK
    z = rng.standard_normal((n, spec.dense))
    counts = np.floor(np.exp(teacher.count_mu + teacher.count_sigma * z))
    present = rng.random((n, spec.dense)) >= teacher.missing
    dense = np.where(present, np.log1p(counts), 0.0)
    u = rng.random((n, spec.fields))
    values = np.minimum(
        np.floor(teacher.vocab * u**teacher.skew).astype(np.int64), teacher.vocab - 1
    )
    logits = np.full(n, teacher.bias)
    logits += (dense - dense_center(spec, teacher)) @ teacher.dense_weights
    for f in range(spec.fields):
        logits += teacher.cat_weights[f][values[:, f]]
    for a, b in teacher.pairs:
        logits += np.einsum(
            "nk,nk->n", teacher.factors[a][values[:, a]], teacher.factors[b][values[:, b]]
        )
    labels = rng.random(n) < 1.0 / (1.0 + np.exp(-logits))
    return CtrBatch(
        dense=dense.astype(np.float32),
        buckets=hash_buckets(spec, teacher, values),
        labels=labels.astype(np.float32),
        teacher_logits=logits.astype(np.float32),
    )


def dense_center(spec: CtrSpec, teacher: _Teacher) -> np.ndarray:
    """Expected log1p(count) of each dense feature, roughly (centres the teacher)."""
    return np.asarray((1.0 - teacher.missing) * teacher.count_mu, dtype=np.float64)


def hash_buckets(spec: CtrSpec, teacher: _Teacher, values: np.ndarray) -> np.ndarray:
    """Raw category values -> per-field bucket ids, as Criteo pipelines hash strings."""
    fields = np.arange(spec.fields, dtype=np.uint64)
    keys = values.astype(np.uint64) * np.uint64(1_000_003) + fields * np.uint64(7_368_787)
    with np.errstate(over="ignore"):
        mixed = (keys ^ teacher.salt) * _HASH_MULT
    return ((mixed >> np.uint64(20)) % np.uint64(spec.buckets)).astype(np.int64)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank statistic (Mann-Whitney U); ties count half.

    Raises:
        ValueError: no positive or no negative label.
    """
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average rank (1-based) of each run of tied scores.
    run_starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    run_ends = np.r_[run_starts[1:], scores.size]
    run_rank = (run_starts + run_ends + 1) / 2.0
    ranks = np.empty(scores.size)
    ranks[order] = np.repeat(run_rank, run_ends - run_starts)
    u = ranks[labels].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))


def teacher_auc(data: CtrData, size: int) -> float:
    """The teacher's AUC on the first ``size`` records of ``data``'s split."""
    batch = data.range(0, size)
    return auc(batch.labels, batch.teacher_logits)
