"""Crash at every point: the WAL recovers every acknowledged record, whatever reached disk.

An in-memory FileLayer records every I/O operation and knows, per file, which bytes
are durable (fsync) and, per directory, which creations/renames/removals are durable
(directory fsync). For every prefix of a workload's operations it builds disk images a
power cut could leave (durable state plus a random prefix of what was not yet durable,
with torn or zero-filled writes) and checks what ``Wal.open`` makes of each.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dtlaunch.supervisor.wal.files import FileHandle
from dtlaunch.supervisor.wal.log import Wal

WAL_DIR = Path("/run/wal")
SEED = 20240611
RANDOM_IMAGES = 6  # random post-crash images per crash point, besides the two extremes


@dataclass
class Inode:
    data: bytearray = field(default_factory=bytearray)  # what the process sees
    synced: bytes = b""  # what survives a crash for sure
    pending: list[tuple[str, int, bytes]] = field(default_factory=list)  # since last fsync


class MemFiles:
    """A FileLayer in memory that can produce post-crash disk images."""

    def __init__(self, image: dict[Path, bytes] | None = None) -> None:
        self.names: dict[Path, Inode] = {}  # the namespace the process sees
        self.durable: dict[Path, Inode] = {}  # the namespace that survives a crash
        self.ns_pending: list[tuple[str, Path, Path | Inode]] = []  # until fsync_dir
        self.dirs: set[Path] = set()
        self.handles: dict[int, Inode] = {}
        self.next_handle = 3
        self.locks: set[Path] = set()
        self.on_op = lambda: None  # called after every operation that changes state
        self.fsyncs = 0
        for path, data in (image or {}).items():
            inode = Inode(bytearray(data), bytes(data))
            self.names[path] = self.durable[path] = inode
            self.dirs.add(path.parent)

    # ------------------------------------------------------------- FileLayer
    def make_dir(self, path: Path) -> bool:
        # Simplification: directory creation is durable at once. Parents are
        # made too, as RealFiles does (the high-water mark lives in the parent).
        created = path not in self.dirs
        self.dirs.add(path)
        self.dirs.update(path.parents)
        return created

    def list_dir(self, path: Path) -> list[str]:
        return [p.name for p in self.names if p.parent == path]

    def read(self, path: Path) -> bytes:
        return bytes(self.names[path].data)

    def size(self, path: Path) -> int:
        return len(self.names[path].data)

    def _handle(self, inode: Inode) -> FileHandle:
        self.next_handle += 1
        self.handles[self.next_handle] = inode
        return self.next_handle

    def create(self, path: Path) -> FileHandle:
        assert path.parent in self.dirs, path
        inode = Inode()
        self.names[path] = inode
        self.ns_pending.append(("link", path, inode))
        self.on_op()
        return self._handle(inode)

    def open_append(self, path: Path) -> FileHandle:
        return self._handle(self.names[path])

    def write(self, handle: FileHandle, data: bytes) -> None:
        inode = self.handles[handle]
        inode.pending.append(("write", len(inode.data), bytes(data)))
        inode.data += data
        self.on_op()

    def truncate(self, handle: FileHandle, size: int) -> None:
        inode = self.handles[handle]
        inode.pending.append(("truncate", size, b""))
        del inode.data[size:]
        self.on_op()

    def fsync(self, handle: FileHandle) -> None:
        inode = self.handles[handle]
        inode.synced = bytes(inode.data)
        inode.pending.clear()
        self.fsyncs += 1
        self.on_op()

    def close(self, handle: FileHandle) -> None:
        del self.handles[handle]

    def fsync_dir(self, path: Path) -> None:
        keep = []
        for op in self.ns_pending:
            if op[1].parent == path:
                apply_ns(self.durable, op)
            else:
                keep.append(op)
        self.ns_pending = keep
        self.on_op()

    def rename(self, src: Path, dst: Path) -> None:
        self.names[dst] = self.names.pop(src)
        self.ns_pending.append(("rename", src, dst))
        self.on_op()

    def remove(self, path: Path) -> None:
        del self.names[path]
        self.ns_pending.append(("unlink", path, path))
        self.on_op()

    def lock(self, path: Path, owner: str) -> FileHandle:
        assert path not in self.locks
        self.locks.add(path)
        return -len(self.locks)

    def unlock(self, handle: FileHandle) -> None:
        self.locks.clear()

    # ---------------------------------------------------------------- crashes
    def crash_image(self, rng: random.Random, mode: str) -> dict[Path, bytes]:
        """Files after a power cut now. ``mode``: durable | everything | random."""
        names = dict(self.durable)
        count = {"durable": 0, "everything": len(self.ns_pending)}.get(
            mode, rng.randint(0, len(self.ns_pending))
        )
        for op in self.ns_pending[:count]:
            apply_ns(names, op)
        return {path: inode_image(inode, rng, mode) for path, inode in names.items()}


def apply_ns(names: dict[Path, Inode], op: tuple[str, Path, Path | Inode]) -> None:
    kind, path, arg = op
    if kind == "link":
        assert isinstance(arg, Inode)
        names[path] = arg
    elif kind == "rename":
        assert isinstance(arg, Path)
        if path in names:
            names[arg] = names.pop(path)
    else:
        names.pop(path, None)


def inode_image(inode: Inode, rng: random.Random, mode: str) -> bytes:
    data = bytearray(inode.synced)
    ops = inode.pending
    count = {"durable": 0, "everything": len(ops)}.get(mode, rng.randint(0, len(ops)))
    for kind, at, chunk in ops[:count]:
        if kind == "write":
            data[at : at + len(chunk)] = chunk
        else:
            del data[at:]
    if count < len(ops) and mode == "random" and ops[count][0] == "write":
        _kind, at, chunk = ops[count]
        torn = rng.randint(0, len(chunk))
        real = rng.randint(0, torn) if rng.random() < 0.3 else torn
        # The file grew by ``torn`` bytes; the blocks past ``real`` read back as zeros.
        data[at:] = chunk[:real] + bytes(torn - real)
    return bytes(data)


@functools.cache
def payload(seq: int) -> bytes:
    return f"rec-{seq}:".encode() + bytes(random.Random(seq).randbytes(seq % 37))


@functools.cache
def state(count: int) -> bytes:
    digest = hashlib.sha256(b"\0".join(payload(s) for s in range(1, count + 1))).hexdigest()
    return f"state-through-{count}:{digest}".encode()


@dataclass
class CrashPoint:
    op: int
    acked: int  # records whose sync()/snapshot returned before the crash
    appended: int
    images: list[dict[Path, bytes]]


def run_workload(
    steps: int, rng: random.Random, segment_bytes: int = 256
) -> tuple[list[CrashPoint], int]:
    fs = MemFiles()
    progress = {"acked": 0, "appended": 0}
    points: list[CrashPoint] = []

    def crash_here() -> None:
        images = [fs.crash_image(rng, mode) for mode in ("durable", "everything")]
        images += [fs.crash_image(rng, "random") for _ in range(RANDOM_IMAGES)]
        points.append(CrashPoint(len(points), progress["acked"], progress["appended"], images))

    fs.on_op = crash_here
    wal, _ = Wal.open(WAL_DIR, files=fs, segment_bytes=segment_bytes)
    reopens = 0
    mark: int | None = None
    for _step in range(steps):
        roll = rng.random()
        if roll < 0.6:
            progress["appended"] = wal.append(payload(progress["appended"] + 1))
        elif roll < 0.9:
            wal.sync()
            progress["acked"] = progress["appended"]
        elif roll < 0.93:
            wal.write_snapshot(state(progress["appended"]))
            progress["acked"] = progress["appended"]
            mark = None
        elif roll < 0.96:
            # As GroupCommitter.snapshot does: the state is taken at a mark, records
            # appended after it go on, and the snapshot is written later.
            if mark is None:
                mark = wal.mark_snapshot_point()
            else:
                wal.write_snapshot(state(mark), covers_seq=mark)
                progress["acked"] = progress["appended"]
                mark = None
        else:  # a clean restart: close (syncs), then recover from the live files
            wal.close()
            progress["acked"] = progress["appended"]
            wal, recovered = Wal.open(WAL_DIR, files=fs, segment_bytes=segment_bytes)
            check_recovery(recovered, progress["acked"], progress["appended"])
            reopens += 1
            mark = None
    wal.close()
    assert reopens > 0
    return points, fs.fsyncs


def check_recovery(recovered, acked: int, appended: int) -> int:
    start = 0
    if recovered.snapshot is not None:
        head, _, _ = recovered.snapshot.partition(b":")
        start = int(head.removeprefix(b"state-through-"))
        assert recovered.snapshot == state(start)
    total = start + len(recovered.records)
    assert acked <= total <= appended, (acked, total, appended)
    assert recovered.records == [payload(s) for s in range(start + 1, total + 1)]
    return total


def recover(image: dict[Path, bytes], point: CrashPoint, *, reuse: bool) -> bool:
    """Recover ``image``, check it; True when a torn tail was cut."""
    fs = MemFiles(image)
    try:
        wal, recovered = Wal.open(WAL_DIR, files=fs, segment_bytes=256)
    except Exception as err:
        raise AssertionError(f"crash after op {point.op}: recovery raised {err!r}") from err
    total = check_recovery(recovered, point.acked, point.appended)
    torn = recovered.torn_tail is not None
    if torn:
        assert fs.read(recovered.torn_tail.backup)  # the cut bytes are kept
    if not reuse:
        wal.close()
        return torn
    # The recovered log takes new records and survives another clean restart.
    assert wal.append(payload(total + 1)) == total + 1
    wal.sync()
    wal.close()
    wal, again = Wal.open(WAL_DIR, files=fs, segment_bytes=256)
    assert again.torn_tail is None
    assert check_recovery(again, total + 1, total + 1) == total + 1
    wal.close()
    return torn


# One workload in make test (14 s); the smallest and the largest segments, 27 s
# more, in make test-slow.
@pytest.mark.parametrize(
    ("seed", "segment_bytes"),
    [
        (SEED, 256),
        pytest.param(SEED + 7, 90, marks=pytest.mark.slow),
        pytest.param(SEED + 9, 2048, marks=pytest.mark.slow),
    ],
)
def test_crash_at_every_point_keeps_every_acknowledged_record(seed, segment_bytes):
    rng = random.Random(seed)
    points, fsyncs = run_workload(steps=1500, rng=rng, segment_bytes=segment_bytes)
    assert len(points) > 1500 and fsyncs > 400  # the workload really did I/O
    torn = 0
    for point in points:
        for number, image in enumerate(point.images):
            torn += recover(image, point, reuse=(point.op + number) % 5 == 0)
    # Sanity of the model itself: many crashes did tear a write.
    assert torn > 100


def test_crash_while_recovery_cuts_a_torn_tail():
    """Power cut during Wal.open's own repair of a torn tail, at each of its steps."""
    rng = random.Random(SEED + 1)
    points, _ = run_workload(steps=150, rng=rng)
    checked = 0
    for point in points:
        image = point.images[-1]
        fs = MemFiles(image)
        inner: list[dict[Path, bytes]] = []
        fs.on_op = lambda fs=fs, inner=inner: inner.append(fs.crash_image(rng, "random"))
        wal, recovered = Wal.open(WAL_DIR, files=fs, segment_bytes=256)
        wal.close()
        if recovered.torn_tail is None:
            continue
        checked += 1
        assert recovered.torn_tail.backup.name.startswith(recovered.torn_tail.file.name)
        tail = recovered.torn_tail
        for second in inner:
            recover(second, point, reuse=False)
            # Whatever the cut reached, the torn bytes are in the segment or the backup.
            kept_in_segment = len(second.get(tail.file, b"")) > tail.offset
            assert kept_in_segment or len(second.get(tail.backup, b"")) == tail.bytes_cut
        if checked >= 25:
            break
    assert checked >= 5
