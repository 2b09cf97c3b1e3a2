"""Write-ahead log for the data-sharding queue: opaque records, group commit, snapshots.

::

    <run_dir>/wal/LOCK                      flock'd by the one process writing the log
    <run_dir>/wal/seg-<first seq>.wal       records, appended; see wal_format for bytes
    <run_dir>/wal/snap-<covered seq>.snap   state covering every record up to that seq
    <run_dir>/wal.highwater                 a seq the log once held (see wal_format)

A record is durable once :meth:`Wal.sync` (or :meth:`GroupCommitter.append`) returns:
all records buffered since the last sync go out in one write and one fsync. An fsync
that fails is fatal (:class:`WalFsyncError`): after a failed fsync the kernel may have
dropped the dirty pages and a retry can "succeed" without the data, so the log
refuses every later write and recovery starts from what is really on disk.

A new segment is started on the first sync after :meth:`Wal.open` or a snapshot, or
when the current one has grown past ``segment_bytes``; a segment never receives
records again once another one exists, so only the last segment can end torn.
Once a new segment's first records are durable, the high-water mark is moved to
its first seq; :meth:`Wal.open` refuses a log that ends before the mark
(:class:`WalTailLostError`) until ``repair`` accepts the loss.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dtlaunch.errors import RunDirError, WalTailLostError
from dtlaunch.supervisor.wal.commit import GroupCommitter
from dtlaunch.supervisor.wal.files import (
    FileHandle,
    FileLayer,
    LockHeldError,
    RealFiles,
    WalFsyncError,
)
from dtlaunch.supervisor.wal.format import (
    MAX_PAYLOAD,
    SEGMENT_HEADER,
    TEMP_SUFFIX,
    WalCorruptError,
    WalVersionError,
    encode_high_water,
    encode_record,
    encode_segment_header,
    encode_snapshot,
    high_water_path,
    run_dir_of,
    segment_name,
    segment_seq,
    snapshot_name,
    snapshot_seq,
)
from dtlaunch.supervisor.wal.recovery import (
    RepairReport,
    TornTail,
    cut_torn_tail,
    read_high_water,
    remove_files,
    repair_locked,
    scan_log,
    write_durably,
)

__all__ = [
    "FileLayer",
    "GroupCommitter",
    "RealFiles",
    "Recovered",
    "RepairReport",
    "TornTail",
    "Wal",
    "WalCorruptError",
    "WalFsyncError",
    "WalTailLostError",
    "WalVersionError",
    "repair",
]

log = logging.getLogger(__name__)

LOCK_NAME = "LOCK"

# Told the seconds each group commit's fsync took (in the thread that synced). The
# job wires its metrics in here, so that this package knows no metrics library.
FsyncObserver = Callable[[float], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered:
    """What :meth:`Wal.open` read back."""

    snapshot: bytes | None
    records: list[bytes]  # after the snapshot, in order
    torn_tail: TornTail | None


def _take_lock(files: FileLayer, directory: Path) -> FileHandle:
    owner = f"pid {os.getpid()} on host {socket.gethostname()}"
    try:
        return files.lock(directory / LOCK_NAME, owner)
    except LockHeldError as held:
        raise RunDirError(
            f"the WAL in {directory} is locked by {held.holder}: another dtlaunch supervisor "
            f"is running this job. Stop that process first (or, for a new job, pass another "
            f"--run-dir). The lock is freed the moment its process exits, even if killed."
        ) from None


class Wal:
    """The log of one run directory. Thread-safe: appends may race with a sync running
    in a worker thread (that is how :class:`GroupCommitter` overlaps them).
    """

    def __init__(
        self,
        *,
        directory: Path,
        files: FileLayer,
        segment_bytes: int,
        lock: FileHandle,
        last_seq: int,
        snapshot_seq: int,
        record_bytes: int,
        on_fsync: FsyncObserver | None = None,
    ) -> None:
        """Use :meth:`open`."""
        self._dir = directory
        self._on_fsync = on_fsync
        self._files = files
        self._segment_bytes = segment_bytes
        self._lock_handle = lock
        self._lock = threading.Lock()  # buffer and counters
        self._sync_lock = threading.Lock()  # one writer of files at a time
        self._buffer: list[bytes] = []
        self._appended_seq = last_seq
        self._durable_seq = last_seq
        self._appended_bytes = record_bytes
        self._snapshot_mark = 0  # _appended_bytes when the last snapshot's point was taken
        self._snapshot_seq = snapshot_seq
        self._segment: FileHandle | None = None
        self._segment_size = 0
        self._failure: WalFsyncError | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        files: FileLayer | None = None,
        segment_bytes: int = 64 << 20,
        on_fsync: FsyncObserver | None = None,
    ) -> tuple[Wal, Recovered]:
        """Lock ``directory`` (``<run_dir>/wal``, created if missing) and recover it.

        ``on_fsync`` is told how long each sync's fsync of the records took.

        Raises:
            RunDirError: another live process holds the WAL's lock.
            WalCorruptError: damage before the tail; names file and byte, and the fix.
            WalTailLostError: the log ends before its high-water mark (files lost).
            WalVersionError: a file written in another format version.
        """
        if segment_bytes <= SEGMENT_HEADER.size:
            raise ValueError(
                f"segment_bytes must exceed {SEGMENT_HEADER.size}, got {segment_bytes}"
            )
        files = files or RealFiles()
        if files.make_dir(directory):
            files.fsync_dir(directory.parent)
        lock = _take_lock(files, directory)
        try:
            state = scan_log(files, directory)
            torn = None
            if state.damage is not None and not state.damage.tail:
                raise state.damage.error()
            # A torn tail is never below the mark: the mark moves after a sync.
            reached = read_high_water(files, directory)
            if reached > state.last_seq:
                raise WalTailLostError(
                    directory, state.last_seq, reached, run_dir=run_dir_of(directory)
                )
            if state.damage is not None:
                torn = cut_torn_tail(files, state.damage)
            remove_files(files, directory, state.stale)
        except BaseException:
            files.unlock(lock)
            raise
        # A new run's empty log is not news; a recovery is.
        log.log(
            logging.INFO if state.last_seq else logging.DEBUG,
            "WAL %s recovered: snapshot through seq %d, %d records after it, last seq %d",
            directory,
            state.snapshot_seq,
            len(state.records),
            state.last_seq,
        )
        wal = cls(
            directory=directory,
            files=files,
            segment_bytes=segment_bytes,
            lock=lock,
            last_seq=state.last_seq,
            snapshot_seq=state.snapshot_seq,
            record_bytes=state.record_bytes,
            on_fsync=on_fsync,
        )
        return wal, Recovered(snapshot=state.snapshot, records=state.records, torn_tail=torn)

    # ------------------------------------------------------------------ state

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def appended_seq(self) -> int:
        """Seq of the last record appended (durable or not); 0 for an empty log."""
        return self._appended_seq

    @property
    def durable_seq(self) -> int:
        """Every record up to this seq is on disk."""
        return self._durable_seq

    @property
    def bytes_since_snapshot(self) -> int:
        """Record bytes appended since the last snapshot's point: when to take the next."""
        return self._appended_bytes - self._snapshot_mark

    @property
    def failed(self) -> bool:
        return self._failure is not None

    # ----------------------------------------------------------------- writes

    def append(self, payload: bytes) -> int:
        """Buffer one record; returns its seq. Not durable until :meth:`sync`.

        Raises:
            WalFsyncError: an earlier write or fsync failed.
        """
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"WAL record of {len(payload)} bytes exceeds {MAX_PAYLOAD} bytes")
        with self._lock:
            self._check_open()
            seq = self._appended_seq + 1
            record = encode_record(seq, payload)
            self._buffer.append(record)
            self._appended_seq = seq
            self._appended_bytes += len(record)
        return seq

    def sync(self) -> int:
        """Write every buffered record and fsync once; returns the last durable seq.

        Raises:
            WalFsyncError: the write or fsync failed (now and for every later call).
        """
        with self._sync_lock:
            return self._sync_locked()

    def mark_snapshot_point(self) -> int:
        """The seq a snapshot of the current state covers (the last appended one).

        Resets :attr:`bytes_since_snapshot` now, so callers that check it while the
        snapshot is being written do not start another one.
        """
        with self._lock:
            self._snapshot_mark = self._appended_bytes
            return self._appended_seq

    def write_snapshot(self, state: bytes, *, covers_seq: int | None = None) -> None:
        """Store ``state``, which covers every record up to ``covers_seq`` (default: the
        last appended one), then delete the segments and snapshots it makes redundant.

        Order matters for crashes: records are synced first, the snapshot file is made
        durable (temp file, fsync, rename, directory fsync) before anything is deleted.

        Raises:
            WalFsyncError: a write, fsync, rename or delete failed.
        """
        seq = self.mark_snapshot_point() if covers_seq is None else covers_seq
        if not 0 <= seq <= self._appended_seq:
            raise ValueError(
                f"a snapshot cannot cover seq {seq}: the last appended is {self._appended_seq}"
            )
        with self._sync_lock:
            if seq < self._snapshot_seq:
                # Two snapshots raced (GroupCommitter.snapshot); the newer one won.
                log.debug("WAL %s: snapshot through %d skipped, newer one exists", self._dir, seq)
                return
            self._sync_locked()
            try:
                write_durably(
                    self._files, self._dir / snapshot_name(seq), encode_snapshot(seq, state)
                )
                if self._segment is not None:
                    self._files.close(self._segment)
                    self._segment = None  # the next sync starts a new segment
                remove_files(self._files, self._dir, self._redundant_after(seq))
            except OSError as err:
                raise self._fail("snapshot", err) from err
            self._snapshot_seq = seq
        log.info("WAL %s: snapshot through seq %d (%d bytes)", self._dir, seq, len(state))

    def close(self) -> None:
        """Sync what is buffered and release the lock. Idempotent.

        Raises:
            WalFsyncError: the final sync failed (the lock is released anyway).
        """
        with self._sync_lock:
            if self._closed:
                return
            try:
                if self._failure is None:
                    self._sync_locked()
            finally:
                with self._lock:
                    self._closed = True
                if self._segment is not None:
                    try:
                        self._files.close(self._segment)
                    except OSError as err:
                        log.warning("closing WAL segment failed: %s", err)
                    self._segment = None
                self._files.unlock(self._lock_handle)

    def __enter__(self) -> Wal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._failure is not None:
            raise WalFsyncError(str(self._failure))
        if self._closed:
            raise RuntimeError(f"the WAL in {self._dir} is closed")

    def _sync_locked(self) -> int:
        with self._lock:
            self._check_open()
            batch = self._buffer
            last = self._appended_seq
            if not batch:
                return self._durable_seq
            self._buffer = []
        try:
            first = last - len(batch) + 1
            started = self._segment is None or self._segment_size >= self._segment_bytes
            if started:
                self._start_segment(first)
            assert self._segment is not None
            data = b"".join(batch)
            self._files.write(self._segment, data)
            self._segment_size += len(data)
            fsync_began = time.perf_counter()
            self._files.fsync(self._segment)
            fsync_s = time.perf_counter() - fsync_began
            if started:  # seq ``first`` is durable now: the log may never end before it
                write_durably(self._files, high_water_path(self._dir), encode_high_water(first))
        except OSError as err:
            raise self._fail("write/fsync", err) from err
        self._durable_seq = last
        if self._on_fsync is not None:
            try:
                self._on_fsync(fsync_s)
            except Exception:  # the records are durable: a broken observer must not fail them
                log.exception("the WAL's fsync observer failed")
        return last

    def _start_segment(self, first_seq: int) -> None:
        """Seal the current segment and start one whose first record is ``first_seq``.

        The header is made durable under a temp name and renamed, so a segment that
        exists under its real name always has a whole header.
        """
        if self._segment is not None:
            self._files.close(self._segment)  # every write to it was fsynced already
            self._segment = None
        path = self._dir / segment_name(first_seq)
        tmp = path.with_name(path.name + TEMP_SUFFIX)
        handle = self._files.create(tmp)
        try:
            self._files.write(handle, encode_segment_header(first_seq))
            self._files.fsync(handle)
            self._files.rename(tmp, path)
            self._files.fsync_dir(self._dir)
        except BaseException:
            self._files.close(handle)
            raise
        self._segment = handle
        self._segment_size = SEGMENT_HEADER.size

    def _redundant_after(self, seq: int) -> list[str]:
        """Segments whose records all have seq <= ``seq``; snapshots older than it."""
        names = self._files.list_dir(self._dir)
        firsts = sorted(s for name in names if (s := segment_seq(name)) is not None)
        covered = [
            segment_name(first)
            for index, first in enumerate(firsts)
            if (firsts[index + 1] if index + 1 < len(firsts) else self._durable_seq + 1) <= seq + 1
        ]
        old = [name for name in names if (s := snapshot_seq(name)) is not None and s < seq]
        return covered + old

    def _fail(self, what: str, err: OSError) -> WalFsyncError:
        failure = WalFsyncError(
            f"WAL {what} failed in {self._dir}: {err}. Records since the last successful "
            f"sync may not be on disk, and a retried fsync cannot tell, so this WAL accepts "
            f"no more writes. Stop the job, check the disk (free space, dmesg), then "
            f"restart it with --resume {run_dir_of(self._dir)}: recovery uses what is durable."
        )
        with self._lock:
            if self._failure is None:
                self._failure = failure
            self._buffer = []
        log.error("%s", failure)
        return failure


def repair(directory: Path, *, files: FileLayer | None = None) -> RepairReport:
    """Cut the WAL in ``directory`` at its first damage, keeping a backup of all removed.

    Raises:
        RunDirError: a supervisor holds the WAL's lock.
        WalVersionError: the WAL was written in another format version (not repairable).
    """
    files = files or RealFiles()
    try:
        files.list_dir(directory)
    except FileNotFoundError:
        if read_high_water(files, directory) > 0:  # every file went, the directory too
            files.make_dir(directory)
            files.fsync_dir(directory.parent)
            return repair(directory, files=files)
        raise RunDirError(
            f"{directory} does not exist, so there is no WAL to repair: pass the run "
            f"directory of a job that used data sharding (it holds a wal/ folder)"
        ) from None
    lock = _take_lock(files, directory)
    try:
        return repair_locked(files, directory)
    finally:
        files.unlock(lock)
