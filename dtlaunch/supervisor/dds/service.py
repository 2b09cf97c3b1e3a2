"""The supervisor's data-sharding service: ShardQueue + write-ahead log + replies.

Every reply that hands out a shard or confirms a DONE is sent only after the
transition's record is durable in the WAL (group commit), so a supervisor killed
at any instant and resumed loses nothing it ever told a worker.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dtlaunch.errors import ConfigError, RunDirError
from dtlaunch.events import EventRecorder
from dtlaunch.sharding import DatasetSpec, dataset_info, dataset_spec
from dtlaunch.supervisor.dds.queue import ShardQueue
from dtlaunch.supervisor.dds.records import (
    Grant,
    Release,
    Transition,
    encode_transition,
)
from dtlaunch.supervisor.rundir import write_json_atomic
from dtlaunch.supervisor.wal.log import FsyncObserver, GroupCommitter, Wal
from dtlaunch.wire.messages import (
    AckDone,
    AckShards,
    DatasetReady,
    FetchShards,
    Message,
    RegisterDataset,
    ReleaseShards,
    ShardGrant,
)

log = logging.getLogger(__name__)

Send = Callable[[bytes, Message], Awaitable[None]]
RETRY_AFTER_S = 0.2  # nothing to hand out now: ask again this much later
# The most shards one worker may hold at once. The SDK asks for its prefetch
# window (init(prefetch=2) by default, one more when its loop waits); the cap
# leaves room for a large prefetch while one peer, honest or not, can never
# lease the whole queue and leave the others with nothing (issue 12, defect 4).
MAX_HELD_LEASES = 16
# Compaction: snapshot once the log since the last snapshot outgrows both this
# floor and a multiple of the snapshot's own size, so recovery stays short and
# snapshot writes stay a small share of the I/O.
SNAPSHOT_MIN_LOG_BYTES = 16 << 10
SNAPSHOT_LOG_RATIO = 8
# Building a snapshot holds the event loop for a pass over every shard, and a
# snapshot of a huge, mostly untouched data set compresses to a few bytes, so the
# size rule alone would take one every 16 KiB of log. Spacing snapshots by their
# own cost keeps them under this share of the loop's time at millions of shards.
SNAPSHOT_MAX_LOOP_SHARE = 0.02


@dataclass(slots=True)
class _Taken:
    """A fetch or ack whose queue change is made and whose reply waits until its
    WAL records are durable (``DdsService.take``)."""

    peer: bytes
    reply: Message
    seq: int = 0  # its last WAL record (0: it staged none)
    served_rank: int | None = None  # the worker served (None: refused or no data set yet)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # after durable


async def _nothing() -> None:
    """The awaitable of a change that changed nothing."""


class DdsService:
    def __init__(
        self,
        *,
        run_dir: Path,
        options: DatasetSpec | None,
        send: Send,
        recorder: EventRecorder,
        on_wal_fsync: FsyncObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_wal_fsync = on_wal_fsync  # the job's metrics, when it serves them
        self._clock = clock  # spaces snapshots by their cost (SNAPSHOT_MAX_LOOP_SHARE)
        self._dataset_path = run_dir / "dataset.json"
        self._over_fetched: set[int] = set()  # workers warned about asking for too much
        self._wal_dir = run_dir / "wal"
        self._options = options
        self._send = send
        self._recorder = recorder
        self.queue: ShardQueue | None = None
        self.spec: DatasetSpec | None = None
        self._wal: Wal | None = None
        self._committer: GroupCommitter | None = None
        self._rerun_records = 0  # upper bound of records trained twice
        self._serving = False  # the first answered request is an event (resume latency)
        self._snapshot_bytes = 0
        self._snapshotting = False
        self._next_snapshot_at = -math.inf  # on self._clock
        self.snapshots = 0
        self._taken: list[_Taken] = []  # requests taken, their replies not yet sent

    # ------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Take the WAL's lock and rebuild the queue from snapshot + records.

        Raises:
            RunDirError: another supervisor holds the WAL, or it is corrupt.
            ConfigError: the WAL belongs to another data set.
        """
        stored = self._load_dataset()
        if self._options is not None and stored is not None and stored != self._options:
            raise ConfigError(
                f"the run's data set {stored} differs from the options {self._options}; "
                "drop the dataset options when resuming"
            )
        self.spec = stored or self._options
        self._wal_dir.mkdir(mode=0o700, exist_ok=True)
        wal, recovered = Wal.open(self._wal_dir, on_fsync=self._on_wal_fsync)
        self._wal = wal
        self._committer = GroupCommitter(wal)
        if recovered.torn_tail is not None:
            self._recorder.emit("wal_torn_tail", detail=str(recovered.torn_tail))
        if self.spec is None:
            if recovered.snapshot is not None or recovered.records:
                raise RunDirError(
                    f"{self._wal_dir} holds shard records but the run has no dataset.json"
                )
            return
        if stored is None:
            self._store_dataset(self.spec)
        queue = (
            ShardQueue.restore(self.spec, recovered.snapshot)
            if recovered.snapshot is not None
            else ShardQueue(self.spec)
        )
        queue.replay(recovered.records)
        self.queue = queue
        if recovered.snapshot is not None or recovered.records:
            self._recorder.emit(
                "dds_recovered",
                records=len(recovered.records),
                done=queue.done_count,
                doing=queue.doing_count,
                total=queue.total,
            )

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.close()
            self._committer = None
        if self._wal is not None:
            self._wal.close()
            self._wal = None

    # -------------------------------------------------------------- requests

    async def handle(self, peer: bytes, rank: int, msg: Message) -> None:
        """Serve one request; its reply is sent once its records are durable."""
        if isinstance(msg, (FetchShards, AckShards)):
            self.take(peer, rank, msg)
            await self.answer_taken()
        elif isinstance(msg, RegisterDataset):
            await self._register(peer, msg)
        elif isinstance(msg, ReleaseShards):
            await self.release(rank, msg)

    def take(self, peer: bytes, rank: int, msg: FetchShards | AckShards) -> None:
        """The queue's part of a fetch or an ack, now and in arrival order: the
        queue changes, its WAL records are appended (not yet durable) and its reply
        waits for :meth:`answer_taken`. The supervisor takes every request of a
        received batch, then answers them in one task that waits for one fsync:
        a task and a future per request cost more than the request itself."""
        if isinstance(msg, FetchShards):
            self._taken.append(self._take_fetch(peer, rank, msg))
        else:
            self._taken.append(self._take_ack(peer, rank, msg))

    @property
    def has_taken(self) -> bool:
        """Requests are taken and not yet being answered."""
        return bool(self._taken)

    async def answer_taken(self) -> None:
        """Wait until every request taken so far is durable, then reply to each.

        Raises:
            WalFsyncError: the records could not be made durable; nothing is sent.
        """
        taken, self._taken = self._taken, []
        staged = max((t.seq for t in taken), default=0)
        if staged > 0:
            assert self._committer is not None
            await self._committer.until_durable(staged)
        for request in taken:
            for kind, fields in request.events:
                self._recorder.emit(kind, **fields)
            if request.served_rank is not None:
                self._first_served(request.served_rank)
            await self._send(request.peer, request.reply)
        if self.queue is not None:
            await self._maybe_snapshot()

    def worker_hello(self, rank: int, attempt: int, leases: list[int]) -> Coroutine[Any, Any, None]:
        """A worker (re)connected holding ``leases``: keep those, release its others.
        The queue changes now, in arrival order; await the result for durability."""
        if self.queue is None:
            return _nothing()
        return self._commit(self.queue.reclaim(rank, list(leases)), rank, "reclaim")

    def worker_gone(self, rank: int) -> Coroutine[Any, Any, None]:
        """The worker died, was killed or ended: its DOING shards go back to TODO
        (now; await the result for durability)."""
        if self.queue is None:
            return _nothing()
        return self._commit(self.queue.release_worker(rank), rank, "worker gone")

    async def _register(self, peer: bytes, msg: RegisterDataset) -> None:
        try:
            wanted = dataset_spec(msg.dataset).validate()
        except ConfigError as err:
            await self._send(peer, DatasetReady(dataset=None, error=str(err)))
            return
        if self.spec is None:
            self._store_dataset(wanted)
            self.spec = wanted
            self.queue = ShardQueue(wanted)
            self._recorder.emit("dataset", source="worker", **asdict(wanted))
        elif self.spec != wanted:
            await self._send(
                peer,
                DatasetReady(
                    dataset=dataset_info(self.spec),
                    error=f"the job's data set is {self.spec}, but this worker registered "
                    f"{wanted}; make dtlaunch.init() and the run options agree",
                ),
            )
            return
        await self._send(peer, DatasetReady(dataset=dataset_info(self.spec)))

    async def send_dataset(self, peer: bytes) -> None:
        info = dataset_info(self.spec) if self.spec is not None else None
        await self._send(peer, DatasetReady(dataset=info))

    def _take_fetch(self, peer: bytes, rank: int, msg: FetchShards) -> _Taken:
        if self.queue is None:
            return _Taken(peer, ShardGrant(request_id=msg.request_id, retry_after=1.0))
        room = MAX_HELD_LEASES - self.queue.held_count(rank)
        if room <= 0:
            if rank not in self._over_fetched:  # once per worker: a flood stays one line
                self._over_fetched.add(rank)
                log.warning(
                    "worker %d asks for %d more shards holding %d already; refused until "
                    "it acknowledges some",
                    rank,
                    msg.count,
                    MAX_HELD_LEASES,
                )
            return _Taken(peer, ShardGrant(request_id=msg.request_id, retry_after=1.0))
        grants = self.queue.fetch(rank, min(max(1, msg.count), room))
        seq = self._stage(grants)
        granted = [t.lease() for t in grants if isinstance(t, Grant)]
        finished = self.queue.finished
        retry = 0.0 if granted or finished else RETRY_AFTER_S
        reply = ShardGrant(
            request_id=msg.request_id, leases=granted, finished=finished, retry_after=retry
        )
        return _Taken(peer, reply, seq=seq, served_rank=rank)

    def _take_ack(self, peer: bytes, rank: int, msg: AckShards) -> _Taken:
        # Refused ids are dropped by the worker too: they are either DONE already
        # (a repeated ack after a resume) or no longer its shards.
        reply = AckDone(lease_ids=list(msg.lease_ids))
        if self.queue is None:
            return _Taken(peer, reply)
        done, refused = self.queue.ack(rank, list(msg.lease_ids))
        taken = _Taken(peer, reply, seq=self._stage(done), served_rank=rank)
        if done:
            # Shards per worker over time and the work left (replay plots it, and
            # replay --policy gives it to the policy as the supervisor did).
            taken.events.append(
                (
                    "shards_done",
                    {
                        "role": "worker",
                        "rank": rank,
                        "count": len(done),
                        "done": self.queue.done_count,
                        "total": self.queue.total,
                        "remaining_steps": self.remaining_steps(),
                    },
                )
            )
        if refused:
            taken.events.append(
                ("ack_refused", {"role": "worker", "rank": rank, "lease_ids": refused})
            )
        return taken

    def release(self, rank: int, msg: ReleaseShards) -> Coroutine[Any, Any, None]:
        """A worker gives leases back (its step was dropped): only its own DOING
        ones go back to the end of TODO; the rest it no longer holds anyway. The
        queue changes now, in arrival order; await the result for durability."""
        if self.queue is None:
            return _nothing()
        own = [lease_id for lease_id in msg.lease_ids if self.queue.holder(lease_id) == rank]
        why = msg.reason or f"released by worker {rank} at step {msg.step}"
        return self._commit(self.queue.release_leases(own), rank, why)

    # --------------------------------------------------------------- helpers

    def _first_served(self, rank: int) -> None:
        if not self._serving:
            self._serving = True
            self._recorder.emit("dds_serving", role="worker", rank=rank)

    def _commit(
        self, transitions: list[Transition], rank: int, why: str
    ) -> Coroutine[Any, Any, None]:
        """Stage the transitions' records now; the result resolves once they are
        durable (and their effects are accounted)."""
        return self._committed(self._stage(transitions), transitions, rank, why)

    async def _committed(
        self, seq: int, transitions: list[Transition], rank: int, why: str
    ) -> None:
        if not transitions:
            return
        assert self._committer is not None
        await self._committer.until_durable(seq)
        released = [t for t in transitions if isinstance(t, Release)]
        if released:
            assert self.spec is not None
            # A released shard is read again from its start: its records may repeat.
            self._rerun_records += sum(self.spec.shard_length(t.shard) for t in released)
            if why:
                self._recorder.emit(
                    "shards_released", role="worker", rank=rank, reason=why, count=len(released)
                )
        await self._maybe_snapshot()

    def _stage(self, transitions: list[Transition]) -> int:
        """Append the transitions' records to the WAL: the last one's seq (0: none)."""
        if not transitions:
            return 0
        assert self._committer is not None
        return self._committer.stage([encode_transition(t) for t in transitions])

    async def _maybe_snapshot(self) -> None:
        assert self._wal is not None
        assert self._committer is not None
        assert self.queue is not None
        threshold = max(SNAPSHOT_MIN_LOG_BYTES, SNAPSHOT_LOG_RATIO * self._snapshot_bytes)
        if (
            self._wal.bytes_since_snapshot >= threshold
            and not self._snapshotting
            and self._clock() >= self._next_snapshot_at
        ):
            self._snapshotting = True
            try:
                began = self._clock()
                state = self.queue.snapshot()
                self._next_snapshot_at = began + (self._clock() - began) / SNAPSHOT_MAX_LOOP_SHARE
                self._snapshot_bytes = len(state)
                await self._committer.snapshot(state)
                self.snapshots += 1
            finally:
                self._snapshotting = False

    def _load_dataset(self) -> DatasetSpec | None:
        try:
            data: dict[str, Any] = json.loads(self._dataset_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise RunDirError(f"{self._dataset_path} is unreadable: {err}") from err
        return DatasetSpec(**data)

    def _store_dataset(self, spec: DatasetSpec) -> None:
        write_json_atomic(self._dataset_path, asdict(spec))

    # -------------------------------------------------------------- summary

    def held_records(self) -> dict[int, tuple[int, int]] | None:
        """Once no shard is left to hand out (every one DOING or DONE, no epoch
        to start): worker -> (the records of the leases it holds, the one it
        reads and those it fetched ahead; those of the oldest, which it may
        have read in part or whole: it is acked a step after its last record).
        None before that, and without a data set. Why: the job's last
        steps run on these alone, and a worker holding many steps' worth at a
        small batch size ends the job alone (``Balancer``'s end of data)."""
        if self.queue is None or self.queue.todo_count > 0:
            return None
        return self.queue.held_records()

    def remaining_steps(self) -> int | None:
        """Steps of work left at the global batch (None without a data set or batch)."""
        if self.queue is None or self.spec is None or not self.spec.global_batch:
            return None
        remaining = (self.queue.total - self.queue.done_count) * self.spec.shard_size
        return remaining // self.spec.global_batch

    def summary_fields(self) -> dict[str, Any]:
        if self.queue is None or self.spec is None:
            return {"shards_total": 0, "shards_done": 0, "records_total": 0, "duplicate_records": 0}
        return {
            "shards_by_worker": {
                str(w): n for w, n in sorted(self.queue.fetched_by_worker.items())
            },
            "shards_total": self.queue.total,
            "shards_done": self.queue.done_count,
            "records_total": self.spec.dataset_size * self.spec.epochs,
            "duplicate_records": self._rerun_records,
        }
