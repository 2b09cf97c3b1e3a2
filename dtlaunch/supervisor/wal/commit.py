"""asyncio front of the WAL: many concurrent appends share one write and one fsync."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from dtlaunch.supervisor.wal.files import WalFsyncError


class SyncedLog(Protocol):
    """What the committer needs of a :class:`~dtlaunch.supervisor.wal.log.Wal`
    (a protocol, so that the log can own a committer without an import loop)."""

    @property
    def durable_seq(self) -> int: ...

    def append(self, payload: bytes) -> int: ...

    def sync(self) -> int: ...

    def mark_snapshot_point(self) -> int: ...

    def write_snapshot(self, state: bytes, *, covers_seq: int) -> None: ...


class GroupCommitter:
    """asyncio front of a :class:`Wal`: each append resolves once its record is durable.

    Appends go into the WAL's buffer at once, in the event loop. One flusher task
    repeatedly syncs in a worker thread; every append that arrives while an fsync is
    running rides on the next one, so N concurrent callers share few fsyncs. Before a
    sync the flusher lets every ready task add its records (up to ``max_batch``
    records, at most ``max_delay`` seconds): a cap on gathering, not a fixed wait.
    """

    def __init__(self, wal: SyncedLog, *, max_batch: int = 4096, max_delay: float = 0.002) -> None:
        if max_batch < 1 or max_delay < 0:
            raise ValueError(
                f"need max_batch >= 1 and max_delay >= 0, got {max_batch}, {max_delay}"
            )
        self._wal = wal
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._waiters: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._appended = 0  # records handed to the WAL by this committer
        self._synced = 0  # ... of which durable
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closing = False

    async def append(self, payload: bytes) -> int:
        """Append one record; returns its seq once it is durable.

        Raises:
            WalFsyncError: this or an earlier sync failed.
        """
        return await self.until_durable(self.stage([payload]))

    async def append_many(self, payloads: list[bytes]) -> int:
        """Append records in order; returns the last one's seq once all are durable."""
        return await self.until_durable(self.stage(payloads))

    def stage(self, payloads: list[bytes]) -> int:
        """Append records now, in order, without waiting: returns the last one's
        seq (the durable one when ``payloads`` is empty), for :meth:`until_durable`.
        Callers that serve many requests at once stage each request's records and
        wait once for the last: one future instead of one per request.

        Raises:
            WalFsyncError: an earlier sync failed.
        """
        if self._closing:
            raise RuntimeError("the GroupCommitter is closed")
        if self._failure is not None:
            raise WalFsyncError(str(self._failure))
        if not payloads:
            return self._wal.durable_seq
        seq = 0
        for payload in payloads:
            seq = self._wal.append(payload)
        self._appended += len(payloads)
        return seq

    def until_durable(self, seq: int) -> asyncio.Future[int]:
        """A future resolved once record ``seq`` (and every one before it) is durable.

        Raises:
            WalFsyncError: an earlier sync failed.
        """
        if self._failure is not None:
            raise WalFsyncError(str(self._failure))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if seq <= self._wal.durable_seq:
            future.set_result(seq)
            return future
        self._waiters.append((seq, future))
        self._wake.set()
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_forever(), name="wal-group-commit")
        return future

    async def snapshot(self, state: bytes) -> None:
        """Snapshot ``state``, which covers every record appended so far, in a worker
        thread; appends keep flowing meanwhile and land after the snapshot point."""
        seq = self._wal.mark_snapshot_point()
        await asyncio.to_thread(self._wal.write_snapshot, state, covers_seq=seq)

    async def close(self) -> None:
        """Wait until every appended record is durable (or failed), then stop."""
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            await self._flusher

    async def _flush_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiters:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = loop.time() + self._max_delay
            while self._appended - self._synced < self._max_batch and loop.time() < deadline:
                before = self._appended
                await asyncio.sleep(0)
                if self._appended == before:
                    break
            appended = self._appended
            try:
                durable = await asyncio.to_thread(self._wal.sync)
            except Exception as err:  # WalFsyncError, or a bug: either way nothing is durable
                self._failure = err
                while self._waiters:
                    _seq, future = self._waiters.popleft()
                    if not future.done():
                        # A fresh exception each: one raised in many tasks would pile
                        # up every task's traceback on the shared object.
                        fresh = WalFsyncError(str(err)) if isinstance(err, WalFsyncError) else err
                        future.set_exception(fresh)
                return
            self._synced = appended
            while self._waiters and self._waiters[0][0] <= durable:
                seq, future = self._waiters.popleft()
                if not future.done():  # a cancelled caller: its record is durable anyway
                    future.set_result(seq)
