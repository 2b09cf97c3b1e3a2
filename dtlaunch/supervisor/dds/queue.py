"""Stateful Dynamic Data Sharding: the supervisor's shard queue, I/O-free (AntDT §V-C).

Every shard of every epoch (``sharding.py``: ``K = ceil(N / S)`` shards, ``E``
epochs) is in exactly one state: TODO, DOING (leased to one worker) or DONE.

* TODO is a FIFO. Epoch ``e``'s shards are appended in ``epoch_order(spec, e)``
  when TODO runs empty (checked lazily, when the next shard is wanted) and every
  earlier epoch was appended, so fast workers start the next epoch while
  stragglers finish the previous one.
* ``fetch`` leases the head of TODO to a worker (a whole shard, ``0..len``); fast
  workers fetch more, slow ones fewer (AntDT Fig. 16).
* ``ack`` by the worker holding the lease makes it DONE; any other ack is refused.
* A lease released (its worker died or was killed, BACKUP_WORKERS dropped its
  batch, a resumed worker no longer holds it) goes back to the END of TODO, so
  the job is "at least once". Nothing else ever removes a shard.

Every state change is a ``Transition`` (see ``dds_records``) returned to the
caller, who makes it durable in the write-ahead log *before* replying to a worker.
Recovery is ``restore(snapshot)`` (or a fresh queue) plus ``apply`` of every later
transition; ``apply`` makes exactly the change that produced the transition, and
refuses a transition the queue would not have produced (another data set's log,
or a corrupt one). Lease ids only grow and are never reused, also across recovery.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator

import msgpack
import numpy as np

from dtlaunch.sharding import DatasetSpec, epoch_order_array
from dtlaunch.supervisor.dds.records import (
    DdsStateError,
    Done,
    EpochImage,
    Grant,
    IntArray,
    QueueImage,
    Release,
    Transition,
    check_image,
    decode_image,
    decode_transition,
    encode_image,
    encode_transition,
)
from dtlaunch.wire.messages import Lease

__all__ = [
    "DdsStateError",
    "Done",
    "Grant",
    "Release",
    "ShardQueue",
    "Transition",
    "decode_transition",
    "encode_transition",
]

_NOT_DONE = -1
_LOG_HINT = (
    "the write-ahead log belongs to another data set (different --dataset-size, "
    "--shard-size, --epochs or --seed) or is corrupt"
)


class ShardQueue:
    """TODO -> DOING(worker, lease) -> DONE for every shard of every epoch."""

    def __init__(self, spec: DatasetSpec) -> None:
        self.spec = spec.validate()
        self._k = spec.num_shards
        # Shard lengths without a call per grant: all full but maybe the last.
        self._shard_size = spec.shard_size
        self._last_shard = spec.num_shards - 1
        self._last_length = spec.shard_length(spec.num_shards - 1)
        self._next_lease_id = 0
        self._epochs_started = 0
        # TODO = the fresh tail of the last started epoch's order, then the released
        # shards in release order. A new epoch starts only when both are empty, so
        # this pair is always the whole FIFO.
        # Order of the last started epoch, as an array: 8 bytes a shard, and a
        # snapshot indexes it without converting millions of Python ints.
        self._order: IntArray = np.empty(0, dtype=np.int64)
        self._fresh_pos = 0
        self._returned: deque[tuple[int, int]] = deque()
        self._doing: dict[int, tuple[int, int, int]] = {}  # lease -> (worker, epoch, shard)
        self._held: dict[int, set[int]] = {}  # worker -> its DOING lease ids
        # Per started epoch, by position in the epoch's order: the lease / worker
        # that made that shard DONE, or -1. By position, not by shard, because a
        # snapshot stores them in that order: reading them is then one sequential
        # pass, where a gather through a permutation of millions of shards took
        # seconds of the event loop (scale benchmark, 10M shards: 2.9 s -> ms).
        self._done_lease: list[IntArray] = []
        self._done_worker: list[IntArray] = []
        # Per started epoch, shard -> its position in the order (dropped, None,
        # once every shard of the epoch is DONE: nothing will look it up again).
        self._position: list[IntArray | None] = []
        self._done_per_epoch = [0] * spec.epochs
        self._fetched: dict[int, int] = {}
        self._next_order: tuple[int, IntArray] | None = None  # cache for _head

    # ------------------------------------------------------------ stimuli

    def fetch(self, worker: int, count: int = 1) -> list[Transition]:
        """Lease up to ``count`` shards from the head of TODO to ``worker``.

        Returns the Grant transitions (already applied); fewer than ``count``, or
        none, when TODO has no more (the rest are DOING elsewhere or DONE).
        """
        _check_worker(worker)
        if count < 0:
            raise ValueError(f"fetch count must be 0 or more, got {count}")
        grants: list[Transition] = []
        while len(grants) < count:
            head = self._head()
            if head is None:
                break
            epoch, shard = head
            grant = Grant(
                lease_id=self._next_lease_id,
                worker=worker,
                epoch=epoch,
                shard=shard,
                start=0,
                end=self.spec.shard_length(shard),
            )
            self.apply(grant)
            grants.append(grant)
        return grants

    def ack(self, worker: int, lease_ids: list[int]) -> tuple[list[Transition], list[int]]:
        """DONE for each lease ``worker`` holds; the other ids are refused.

        Returns (Done transitions, refused lease ids). An id is refused when it is
        unknown, DONE already (also: twice in ``lease_ids``), released, or held by
        another worker; ``refusal_reason`` says which, for the log.
        """
        _check_worker(worker)
        done: list[Transition] = []
        refused: list[int] = []
        for lease_id in lease_ids:
            held = self._doing.get(lease_id)
            if held is None or held[0] != worker:
                refused.append(lease_id)
                continue
            transition = Done(lease_id=lease_id, worker=worker, epoch=held[1], shard=held[2])
            self.apply(transition)
            done.append(transition)
        return done, refused

    def release_worker(self, worker: int) -> list[Transition]:
        """Every DOING lease of ``worker`` back to the end of TODO, oldest first."""
        return self.release_leases(sorted(self._held.get(worker, ())))

    def release_leases(self, lease_ids: list[int]) -> list[Transition]:
        """These DOING leases back to the end of TODO, in the given order.

        Ids that are not DOING (DONE, released, unknown) are skipped.
        """
        released: list[Transition] = []
        for lease_id in lease_ids:
            held = self._doing.get(lease_id)
            if held is None:
                continue
            worker, epoch, shard = held
            transition = Release(lease_id=lease_id, worker=worker, epoch=epoch, shard=shard)
            self.apply(transition)
            released.append(transition)
        return released

    def reclaim(self, worker: int, held: list[int]) -> list[Transition]:
        """On resume: ``worker`` says it still holds ``held``.

        Its DOING leases named in ``held`` stay; its other DOING leases are
        released. Ids in ``held`` that are not DOING for this worker are ignored
        (``leases_of`` afterwards tells the caller what the worker may keep).
        """
        _check_worker(worker)
        keep = set(held)
        return self.release_leases(
            [lease_id for lease_id in sorted(self._held.get(worker, ())) if lease_id not in keep]
        )

    def apply(self, t: Transition) -> None:
        """Make the state change ``t`` stands for (recovery replays the log with this).

        Raises:
            DdsStateError: ``t`` is not what this queue would have produced next.
        """
        if isinstance(t, Grant):
            self._apply_grant(t.lease_id, t.worker, t.epoch, t.shard, t.start, t.end)
        elif isinstance(t, Done | Release):
            self._apply_end(t.TAG, t.lease_id, t.worker, t.epoch, t.shard)
        else:
            raise DdsStateError(f"not a shard-queue transition: {t!r}")

    def replay(self, payloads: list[bytes]) -> None:
        """Apply a whole log of ``encode_transition`` records, fast.

        The same checks and state changes as ``apply`` for each record, without
        building a Transition per record: one msgpack stream over all of them.
        Recovery of a million transitions stays within a couple of seconds.

        Raises:
            DdsStateError: a record is malformed or disagrees with the queue.
        """
        unpacker = msgpack.Unpacker(use_list=False)
        unpacker.feed(b"".join(payloads))
        grant, done, release = Grant.TAG, Done.TAG, Release.TAG
        count = 0
        try:
            for row in unpacker:
                count += 1
                # Every field but a grant's worker is checked by equality with the
                # queue's own state in _apply_grant/_apply_end (a wrong type or a
                # negative never matches); the worker is checked there explicitly.
                if type(row) is not tuple:
                    raise DdsStateError(f"shard-queue log record has a bad shape: {row!r:.80}")
                if row[0] == grant and len(row) == 7:
                    self._apply_grant(*row[1:])
                elif (row[0] == done or row[0] == release) and len(row) == 5:
                    self._apply_end(*row)
                else:
                    raise DdsStateError(f"shard-queue log record has a bad shape: {row!r:.80}")
        except (ValueError, TypeError, msgpack.UnpackException) as err:
            raise DdsStateError(
                f"shard-queue log record is malformed ({err}); {_LOG_HINT}"
            ) from err
        if count != len(payloads):
            raise DdsStateError(
                f"shard-queue log holds {count} records in {len(payloads)} payloads; {_LOG_HINT}"
            )

    def _apply_end(self, tag: int, lease_id: int, worker: int, epoch: int, shard: int) -> None:
        """A Done (tag 2) or Release (tag 3) of a DOING lease."""
        held = self._doing.get(lease_id)
        if held != (worker, epoch, shard):
            kind = "Done" if tag == Done.TAG else "Release"
            now = "not DOING" if held is None else f"DOING for worker {held[0]} as {held[1:]}"
            raise DdsStateError(
                f"shard-queue log disagrees with the queue: {kind} of lease "
                f"{lease_id} (worker {worker}, epoch {epoch}, shard {shard}) but "
                f"that lease is {now}; {_LOG_HINT}"
            )
        del self._doing[lease_id]
        mine = self._held[worker]
        mine.discard(lease_id)
        if not mine:
            del self._held[worker]
        if tag == Done.TAG:
            position = self._position[epoch]
            assert position is not None  # only a finished epoch has none
            pos = position[shard]
            self._done_lease[epoch][pos] = lease_id
            self._done_worker[epoch][pos] = worker
            self._done_per_epoch[epoch] += 1
            if self._done_per_epoch[epoch] == self._k:
                self._position[epoch] = None
        else:
            self._returned.append((epoch, shard))

    def _apply_grant(
        self, lease_id: int, worker: int, epoch: int, shard: int, start: int, end: int
    ) -> None:
        fresh = self._fresh_pos < len(self._order)
        # The common case (a fresh shard of the current epoch) without building tuples.
        head = (
            (self._epochs_started - 1, int(self._order[self._fresh_pos])) if fresh else self._head()
        )
        if (
            lease_id != self._next_lease_id
            or head is None
            or epoch != head[0]
            or shard != head[1]
            or start != 0
            or end != (self._last_length if shard == self._last_shard else self._shard_size)
            or type(worker) is not int
            or worker < 0
        ):
            would = (
                "has nothing to grant (TODO is empty)"
                if head is None
                else f"would grant lease {self._next_lease_id} of epoch {head[0]} shard {head[1]}"
            )
            raise DdsStateError(
                f"shard-queue log disagrees with the queue: lease {lease_id} grants epoch "
                f"{epoch} shard {shard} records {start}..{end}, but the queue {would}; "
                f"{_LOG_HINT}"
            )
        if fresh:
            self._fresh_pos += 1
        elif self._returned:
            self._returned.popleft()
        else:
            self._start_epoch()
            self._fresh_pos = 1
        self._doing[lease_id] = (worker, epoch, shard)
        held = self._held.get(worker)
        if held is None:
            self._held[worker] = {lease_id}
        else:
            held.add(lease_id)
        self._next_lease_id += 1
        self._fetched[worker] = self._fetched.get(worker, 0) + 1

    def _head(self) -> tuple[int, int] | None:
        """The (epoch, shard) the next grant hands out, without changing the state."""
        if self._fresh_pos < len(self._order):
            return self._epochs_started - 1, int(self._order[self._fresh_pos])
        if self._returned:
            return self._returned[0]
        if self._epochs_started < self.spec.epochs:
            return self._epochs_started, int(self._order_of_next()[0])
        return None

    def _order_of_next(self) -> IntArray:
        epoch = self._epochs_started
        if self._next_order is None or self._next_order[0] != epoch:
            self._next_order = (epoch, epoch_order_array(self.spec, epoch))
        return self._next_order[1]

    def _start_epoch(self) -> None:
        self._order = self._order_of_next()
        self._next_order = None
        self._epochs_started += 1
        self._fresh_pos = 0
        self._done_lease.append(np.full(self._k, _NOT_DONE, dtype=np.int64))
        self._done_worker.append(np.full(self._k, _NOT_DONE, dtype=np.int64))
        self._position.append(_positions(self._order))

    # -------------------------------------------------------------- views

    def leases_of(self, worker: int) -> list[Lease]:
        """The DOING leases of ``worker``, oldest first."""
        return [lease for i in sorted(self._held.get(worker, ())) if (lease := self.lease(i))]

    def held_records(self) -> dict[int, tuple[int, int]]:
        """Worker -> (the records of its DOING leases, those of its oldest one);
        workers holding none are left out."""
        length = self.spec.shard_length
        return {
            worker: (
                sum(length(self._doing[lease_id][2]) for lease_id in ids),
                length(self._doing[min(ids)][2]),
            )
            for worker, ids in sorted(self._held.items())
            if ids
        }

    def held_count(self, worker: int) -> int:
        """How many DOING leases ``worker`` holds (``len(leases_of(worker))``
        without building them: every fetch asks)."""
        return len(self._held.get(worker, ()))

    def lease(self, lease_id: int) -> Lease | None:
        """The lease if it is DOING, else None."""
        held = self._doing.get(lease_id)
        if held is None:
            return None
        _, epoch, shard = held
        length = self.spec.shard_length(shard)
        return Lease(lease_id=lease_id, epoch=epoch, shard=shard, start=0, end=length)

    def holder(self, lease_id: int) -> int | None:
        """The worker holding the lease if it is DOING, else None."""
        held = self._doing.get(lease_id)
        return None if held is None else held[0]

    def refusal_reason(self, worker: int, lease_id: int) -> str:
        """Why an ack of ``lease_id`` by ``worker`` is (or would be) refused."""
        held = self._doing.get(lease_id)
        if held is not None:
            if held[0] == worker:
                return f"lease {lease_id} is DOING for worker {worker}; its ack is accepted"
            return f"lease {lease_id} is held by worker {held[0]}, not worker {worker}"
        if not 0 <= lease_id < self._next_lease_id:
            return f"lease {lease_id} was never granted"
        for epoch, by_pos in enumerate(self._done_lease):
            hits = np.flatnonzero(by_pos == lease_id)
            if hits.size:
                shard = int(self._order_for(epoch)[hits[0]])
                by = int(self._done_worker[epoch][hits[0]])
                return f"lease {lease_id} (epoch {epoch} shard {shard}) is DONE already, by {by}"
        return f"lease {lease_id} was released; its shard went back to TODO"

    @property
    def total(self) -> int:
        """K x E."""
        return self.spec.total_shards

    @property
    def done_count(self) -> int:
        return sum(self._done_per_epoch)

    @property
    def doing_count(self) -> int:
        return len(self._doing)

    @property
    def todo_count(self) -> int:
        """Shards neither DOING nor DONE, including epochs not appended yet."""
        return self.total - self.done_count - self.doing_count

    @property
    def queued_count(self) -> int:
        """Shards in the TODO FIFO now (excludes epochs not appended yet)."""
        return len(self._order) - self._fresh_pos + len(self._returned)

    @property
    def epochs_started(self) -> int:
        """Epochs whose shards were appended to TODO."""
        return self._epochs_started

    @property
    def can_grant(self) -> bool:
        """A fetch would get a shard now (False: the rest are DOING elsewhere or DONE)."""
        return self._head() is not None

    @property
    def finished(self) -> bool:
        """Every shard of every epoch is DONE."""
        return self.done_count == self.total

    @property
    def next_lease_id(self) -> int:
        return self._next_lease_id

    @property
    def epoch_progress(self) -> list[tuple[int, int]]:
        """(DONE, K) per epoch."""
        return [(done, self._k) for done in self._done_per_epoch]

    @property
    def fetched_by_worker(self) -> dict[int, int]:
        """Grants per worker rank, re-grants of released shards included."""
        return dict(self._fetched)

    def queued(self) -> list[tuple[int, int]]:
        """The TODO FIFO as (epoch, shard), head first; O(queue length)."""
        epoch = self._epochs_started - 1
        fresh = [(epoch, shard) for shard in self._order[self._fresh_pos :].tolist()]
        return fresh + list(self._returned)

    @property
    def done_ledger(self) -> Iterator[tuple[int, int, int, int]]:
        """(epoch, shard, lease_id, worker) once per DONE shard, by epoch then shard."""
        for epoch, by_pos in enumerate(self._done_lease):
            done = np.flatnonzero(by_pos != _NOT_DONE)
            shards = self._order_for(epoch)[done]
            by_shard = np.argsort(shards, kind="stable")
            leases, workers = by_pos[done][by_shard], self._done_worker[epoch][done][by_shard]
            for shard, lease, worker in zip(
                shards[by_shard].tolist(), leases.tolist(), workers.tolist(), strict=True
            ):
                yield epoch, shard, lease, worker

    # ---------------------------------------------------------- snapshots

    def snapshot(self) -> bytes:
        """The whole state, compact (~ a few bytes per DONE shard at most)."""
        spec = self.spec
        epochs = []
        for lease_by_pos, worker_by_pos in zip(self._done_lease, self._done_worker, strict=True):
            done = lease_by_pos != _NOT_DONE
            epochs.append(
                EpochImage(done=done, lease_ids=lease_by_pos[done], workers=worker_by_pos[done])
            )
        doing = [(lease, *held) for lease, held in sorted(self._doing.items())]
        image = QueueImage(
            spec_key=(spec.dataset_size, spec.shard_size, spec.epochs, spec.seed),
            next_lease_id=self._next_lease_id,
            epochs_started=self._epochs_started,
            fresh_pos=self._fresh_pos,
            returned=np.array([e * self._k + s for e, s in self._returned], dtype=np.int64),
            doing=np.array(doing, dtype=np.int64).reshape(-1, 4),
            fetched=dict(self._fetched),
            epochs=epochs,
        )
        return encode_image(image)

    @classmethod
    def restore(cls, spec: DatasetSpec, data: bytes) -> ShardQueue:
        """The queue ``snapshot`` saved; ``spec`` must be the data set it was made for.

        Raises:
            DdsStateError: the snapshot is corrupt or belongs to another data set.
        """
        queue = cls(spec)
        image = decode_image(data, queue._k)
        orders = [
            epoch_order_array(spec, epoch)
            for epoch in range(min(image.epochs_started, spec.epochs))
        ]
        key = (spec.dataset_size, spec.shard_size, spec.epochs, spec.seed)
        check_image(image, key, queue._k, orders)
        queue._load(image, orders)
        return queue

    def _load(self, image: QueueImage, orders: list[IntArray]) -> None:
        k = self._k
        for epoch, (saved, order) in enumerate(zip(image.epochs, orders, strict=True)):
            leases = np.full(k, _NOT_DONE, dtype=np.int64)
            workers = np.full(k, _NOT_DONE, dtype=np.int64)
            leases[saved.done] = saved.lease_ids
            workers[saved.done] = saved.workers
            self._done_lease.append(leases)
            self._done_worker.append(workers)
            self._done_per_epoch[epoch] = int(saved.lease_ids.size)
            self._position.append(None if saved.lease_ids.size == k else _positions(order))
        self._order = orders[-1] if orders else np.empty(0, dtype=np.int64)
        self._next_lease_id = image.next_lease_id
        self._epochs_started = image.epochs_started
        self._fresh_pos = image.fresh_pos
        self._returned = deque((key // k, key % k) for key in image.returned.tolist())
        for lease, worker, epoch, shard in image.doing.tolist():
            self._doing[lease] = (worker, epoch, shard)
            self._held.setdefault(worker, set()).add(lease)
        self._fetched = dict(image.fetched)

    def _order_for(self, epoch: int) -> IntArray:
        if epoch == self._epochs_started - 1 and len(self._order):
            return self._order
        return epoch_order_array(self.spec, epoch)

    # ------------------------------------------------------------ equality

    def state_digest(self) -> str:
        """SHA-256 of the snapshot: equal states have equal digests."""
        return hashlib.sha256(self.snapshot()).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardQueue):
            return NotImplemented
        return (
            self.spec == other.spec
            and self._next_lease_id == other._next_lease_id
            and self._epochs_started == other._epochs_started
            and self._fresh_pos == other._fresh_pos
            and self._returned == other._returned
            and self._doing == other._doing
            and self._held == other._held
            and self._fetched == other._fetched
            and self._done_per_epoch == other._done_per_epoch
            and all(map(np.array_equal, self._done_lease, other._done_lease))
            and all(map(np.array_equal, self._done_worker, other._done_worker))
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"ShardQueue(done={self.done_count}/{self.total}, doing={self.doing_count}, "
            f"queued={self.queued_count}, epochs_started={self._epochs_started}, "
            f"next_lease_id={self._next_lease_id})"
        )


def _positions(order: IntArray) -> IntArray:
    """The inverse of a permutation: shard -> its position in ``order``."""
    position = np.empty_like(order)
    position[order] = np.arange(order.size, dtype=order.dtype)
    return position


def _check_worker(worker: int) -> None:
    if worker < 0:
        raise ValueError(f"worker rank must be 0 or more, got {worker}")
