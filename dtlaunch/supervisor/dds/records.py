"""The durable forms of the shard queue: transitions and snapshot images (pure).

A *transition* is one state change of ``dds.ShardQueue`` (a shard granted, done,
or released), made durable in the write-ahead log before any worker hears of it.
Each carries every field its replay needs plus enough to check that the log and
the queue agree (a log of another data set, or a corrupt one, is refused rather
than silently producing a different queue).

A *snapshot image* is the whole queue as plain arrays. It stays small for large
jobs: DONE is a per-epoch bitmask over the shards in reading order, and the lease
ids of the DONE shards are stored as deltas in that same order (grants follow
the order, so the deltas are mostly 1 and compress to almost nothing).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import numpy as np
import numpy.typing as npt

from dtlaunch.errors import DdsStateError
from dtlaunch.wire.messages import Lease

__all__ = [
    "DdsStateError",
    "Done",
    "EpochImage",
    "Grant",
    "QueueImage",
    "Release",
    "Transition",
    "check_image",
    "decode_image",
    "decode_transition",
    "encode_image",
    "encode_transition",
]

IntArray = npt.NDArray[np.int64]


# ----------------------------------------------------------------- transitions


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One state change of one lease; see the subclasses."""

    TAG: ClassVar[int] = 0
    lease_id: int
    worker: int  # rank of the worker that holds (or held) the lease
    epoch: int
    shard: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant(Transition):
    """TODO -> DOING: the head of the TODO queue is leased to ``worker``."""

    TAG: ClassVar[int] = 1
    start: int  # records of the shard in reading order, start..end (whole shard: 0..len)
    end: int

    def lease(self) -> Lease:
        """The lease as the worker receives it in a ``ShardGrant``."""
        return Lease(
            lease_id=self.lease_id,
            epoch=self.epoch,
            shard=self.shard,
            start=self.start,
            end=self.end,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Done(Transition):
    """DOING -> DONE: the worker holding the lease acknowledged it."""

    TAG: ClassVar[int] = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Release(Transition):
    """DOING -> end of TODO: the lease's worker died or its batch was dropped."""

    TAG: ClassVar[int] = 3


_BY_TAG: dict[int, type[Transition]] = {cls.TAG: cls for cls in (Grant, Done, Release)}


def encode_transition(t: Transition) -> bytes:
    """A msgpack array ``[tag, lease_id, worker, epoch, shard(, start, end)]``.

    About 10 bytes for small ids, under 30 for the largest realistic ones.
    """
    row = [t.TAG, t.lease_id, t.worker, t.epoch, t.shard]
    if isinstance(t, Grant):
        row += [t.start, t.end]
    packed = msgpack.packb(row)
    assert isinstance(packed, bytes)
    return packed


def decode_transition(data: bytes) -> Transition:
    """The transition ``encode_transition`` made.

    Raises:
        DdsStateError: the bytes are not a transition record.
    """
    try:
        row = msgpack.unpackb(data, use_list=True)
    except (ValueError, msgpack.UnpackException) as err:
        raise DdsStateError(
            f"shard-queue log record is not valid msgpack ({err}); the write-ahead log "
            "is corrupt or was written by another program"
        ) from err
    if not isinstance(row, list) or not row or not _is_count(row[0]):
        raise DdsStateError(f"shard-queue log record has an unknown shape: {row!r:.80}")
    cls = _BY_TAG.get(row[0])
    if cls is None:
        raise DdsStateError(f"shard-queue log record has unknown tag {row[0]}")
    names = ["lease_id", "worker", "epoch", "shard"] + (["start", "end"] if cls is Grant else [])
    values = row[1:]
    if len(values) != len(names) or not all(_is_count(v) for v in values):
        raise DdsStateError(
            f"shard-queue {cls.__name__} record needs {len(names)} non-negative integers "
            f"({', '.join(names)}), got {values!r:.80}"
        )
    return cls(**dict(zip(names, values, strict=True)))


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


# -------------------------------------------------------------------- snapshots

_MAGIC = b"DDSQ\x01"


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochImage:
    """The DONE shards of one started epoch, by position in the epoch's order."""

    done: npt.NDArray[np.bool_]  # K flags: done[p] for the shard at position p
    lease_ids: IntArray  # lease of each DONE shard, in position order
    workers: IntArray  # worker of each DONE shard, in position order


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueImage:
    """A whole shard queue as plain values (see ``dds.ShardQueue`` for meaning)."""

    spec_key: tuple[int, int, int, int]  # dataset_size, shard_size, epochs, seed
    next_lease_id: int
    epochs_started: int  # epochs whose shards were appended to TODO
    fresh_pos: int  # position in the last started epoch's order of the next fresh shard
    returned: IntArray  # released shards queued after the fresh ones, as epoch * K + shard
    doing: IntArray  # rows (lease_id, worker, epoch, shard), by lease id
    fetched: dict[int, int] = field(default_factory=dict)  # grants per worker
    epochs: list[EpochImage] = field(default_factory=list)  # one per started epoch


def encode_image(image: QueueImage) -> bytes:
    """``DDSQ\\x01`` + zlib-compressed msgpack; deterministic for equal images."""
    body = {
        "spec": list(image.spec_key),
        "next": image.next_lease_id,
        "started": image.epochs_started,
        "pos": image.fresh_pos,
        "returned": _pack_ints(image.returned),
        "doing": _pack_ints(image.doing.reshape(-1)),
        "fetched": sorted(image.fetched.items()),
        "epochs": [
            [
                np.packbits(e.done).tobytes(),
                _pack_ints(np.diff(e.lease_ids, prepend=np.int64(0))),
                _pack_ints(e.workers),
            ]
            for e in image.epochs
        ],
    }
    packed = msgpack.packb(body)
    assert isinstance(packed, bytes)
    return _MAGIC + zlib.compress(packed, 6)


def decode_image(data: bytes, num_shards: int) -> QueueImage:
    """The image ``encode_image`` made, checked for shape (not for meaning).

    Raises:
        DdsStateError: the bytes are not a shard-queue snapshot.
    """
    if not data.startswith(_MAGIC):
        raise DdsStateError(
            "not a shard-queue snapshot (bad magic or unsupported version); the WAL "
            "snapshot is corrupt or from another dtlaunch version"
        )
    try:
        body = msgpack.unpackb(zlib.decompress(data[len(_MAGIC) :]), use_list=True)
        return _image_from_body(body, num_shards)
    except DdsStateError:
        raise
    except (
        zlib.error,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        msgpack.UnpackException,
    ) as err:
        raise DdsStateError(f"shard-queue snapshot is corrupt: {err}") from err


def _image_from_body(body: Any, num_shards: int) -> QueueImage:
    if not isinstance(body, dict):
        raise DdsStateError("shard-queue snapshot is corrupt: top level is not a map")
    spec = body["spec"]
    if not (isinstance(spec, list) and len(spec) == 4 and all(_is_count(v) for v in spec)):
        raise DdsStateError(f"shard-queue snapshot is corrupt: bad data-set key {spec!r:.80}")
    scalars = [body["next"], body["started"], body["pos"]]
    if not all(_is_count(v) for v in scalars):
        raise DdsStateError(f"shard-queue snapshot is corrupt: bad counters {scalars!r:.80}")
    doing = _unpack_ints(body["doing"])
    if doing.size % 4:
        raise DdsStateError("shard-queue snapshot is corrupt: DOING rows are not whole")
    fetched = body["fetched"]
    if not (
        isinstance(fetched, list)
        and all(isinstance(r, list) and len(r) == 2 and all(map(_is_count, r)) for r in fetched)
    ):
        raise DdsStateError("shard-queue snapshot is corrupt: bad per-worker grant counts")
    epochs = []
    for packed_done, deltas, workers in body["epochs"]:
        if not isinstance(packed_done, bytes) or len(packed_done) != (num_shards + 7) // 8:
            raise DdsStateError("shard-queue snapshot is corrupt: DONE mask has the wrong size")
        done = np.unpackbits(np.frombuffer(packed_done, np.uint8), count=num_shards).astype(bool)
        lease_ids = np.cumsum(_unpack_ints(deltas), dtype=np.int64)
        epoch = EpochImage(done=done, lease_ids=lease_ids, workers=_unpack_ints(workers))
        if not (int(done.sum()) == lease_ids.size == epoch.workers.size):
            raise DdsStateError("shard-queue snapshot is corrupt: DONE rows do not match mask")
        epochs.append(epoch)
    return QueueImage(
        spec_key=(spec[0], spec[1], spec[2], spec[3]),
        next_lease_id=scalars[0],
        epochs_started=scalars[1],
        fresh_pos=scalars[2],
        returned=_unpack_ints(body["returned"]),
        doing=doing.reshape(-1, 4),
        fetched={w: n for w, n in fetched},
        epochs=epochs,
    )


_INT_DTYPES = ("<i1", "<i2", "<i4", "<i8")


def _pack_ints(values: IntArray) -> list[Any]:
    """``[dtype, raw bytes]`` in the narrowest little-endian signed type that fits."""
    if values.size == 0:
        return [_INT_DTYPES[0], b""]
    lo, hi = int(values.min()), int(values.max())
    for name in _INT_DTYPES:
        info = np.iinfo(np.dtype(name))
        if info.min <= lo and hi <= info.max:
            return [name, values.astype(name).tobytes()]
    raise AssertionError("int64 values always fit int64")


def _unpack_ints(packed: Any) -> IntArray:
    if not (isinstance(packed, list) and len(packed) == 2):
        raise DdsStateError("shard-queue snapshot is corrupt: bad integer array")
    name, raw = packed
    if name not in _INT_DTYPES or not isinstance(raw, bytes):
        raise DdsStateError("shard-queue snapshot is corrupt: bad integer array type")
    dtype = np.dtype(name)
    if len(raw) % dtype.itemsize:
        raise DdsStateError("shard-queue snapshot is corrupt: truncated integer array")
    return np.frombuffer(raw, dtype).astype(np.int64)


def check_image(
    image: QueueImage, spec_key: tuple[int, int, int, int], k: int, orders: list[IntArray]
) -> None:
    """Refuses an image of another data set, or one whose parts contradict each other.

    ``orders[e]`` is epoch ``e``'s shard order, for every started epoch.

    Raises:
        DdsStateError: naming the first problem found.
    """
    if image.spec_key != spec_key:
        raise DdsStateError(
            "shard-queue snapshot is for another data set: (dataset_size, shard_size, "
            f"epochs, seed) = {image.spec_key}, this job has {spec_key}; resume with the "
            "same data set options or start a new run directory"
        )
    started = image.epochs_started
    if started > spec_key[2] or len(image.epochs) != started or len(orders) != started:
        raise DdsStateError(f"shard-queue snapshot is corrupt: {started} epochs started")
    if image.fresh_pos > (k if started else 0):
        raise DdsStateError(f"shard-queue snapshot is corrupt: position {image.fresh_pos}")
    doing, returned = image.doing, image.returned
    if doing.size and (doing.min() < 0 or doing[:, 2].max() >= started or doing[:, 3].max() >= k):
        raise DdsStateError("shard-queue snapshot is corrupt: a DOING lease is out of range")
    if returned.size and (returned.min() < 0 or returned.max() >= started * k):
        raise DdsStateError("shard-queue snapshot is corrupt: a TODO shard is out of range")
    # Every shard of every started epoch must be in exactly one state: queued fresh,
    # queued after a release, DOING or DONE.
    places = [returned, doing[:, 2] * k + doing[:, 3]]
    leases = [doing[:, 0]]
    for epoch, (saved, order) in enumerate(zip(image.epochs, orders, strict=True)):
        if saved.workers.size and saved.workers.min() < 0:
            raise DdsStateError("shard-queue snapshot is corrupt: a negative worker rank")
        places.append(epoch * k + order[saved.done])
        leases.append(saved.lease_ids)
    if started:
        places.append((started - 1) * k + orders[-1][image.fresh_pos :])
    counts = np.bincount(np.concatenate(places), minlength=started * k)
    if (counts != 1).any():
        bad = int(np.flatnonzero(counts != 1)[0])
        raise DdsStateError(
            f"shard-queue snapshot is corrupt: epoch {bad // k} shard {bad % k} is in "
            f"{counts[bad]} states instead of one"
        )
    all_leases = np.concatenate(leases)
    if all_leases.size and (
        all_leases.min() < 0
        or all_leases.max() >= image.next_lease_id
        or np.bincount(all_leases).max() > 1
    ):
        raise DdsStateError("shard-queue snapshot is corrupt: lease ids repeat or run ahead")
