"""Reading a WAL directory back: newest sound snapshot, then the segments after it.

:func:`scan_log` only reads. :func:`cut_torn_tail` and :func:`repair` change files,
and always keep what they remove: a durable backup is written before anything is
truncated or moved.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from dtlaunch.supervisor.wal.files import FileLayer
from dtlaunch.supervisor.wal.format import (
    SEGMENT_HEADER,
    TEMP_SUFFIX,
    WalCorruptError,
    count_sound_records,
    decode_high_water,
    decode_segment_header,
    decode_snapshot,
    encode_high_water,
    high_water_path,
    run_dir_of,
    scan_records,
    segment_name,
    segment_seq,
    snapshot_seq,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class TornTail:
    """A final record cut short by a crash, removed by :meth:`Wal.open`."""

    file: Path
    offset: int
    bytes_cut: int
    backup: Path

    def __str__(self) -> str:
        return (
            f"torn final record in {self.file} at byte {self.offset}: cut {self.bytes_cut} "
            f"bytes (kept in {self.backup})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Damage:
    """The first problem found while reading the log."""

    file: Path
    offset: int  # 0 when the whole segment is unusable (header, gap)
    problem: str
    lost_seq: int  # the first seq that cannot be read from here on
    tail: bool  # a torn final write of the last segment, which open() may cut

    def error(self) -> WalCorruptError:
        return WalCorruptError(
            self.file, self.offset, self.problem, run_dir=run_dir_of(self.file.parent)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LogState:
    """Everything :func:`scan_log` learned about a WAL directory."""

    snapshot: bytes | None
    snapshot_seq: int  # 0 without a snapshot
    records: list[bytes]  # after the snapshot, in order
    record_bytes: int  # their size on disk
    last_seq: int  # last readable seq (the snapshot's when no record follows it)
    segments: list[int]  # first seqs of the segments read, up to the damaged one
    later_segments: list[int]  # segments after the damaged one (never read)
    stale: list[str]  # covered segments, older snapshots, temp files: safe to delete
    bad_snapshots: list[str]
    damage: Damage | None = field(default=None)


def scan_log(files: FileLayer, directory: Path) -> LogState:
    """Read snapshot and segments; report the first damage instead of raising on it.

    Raises:
        WalVersionError: a file is in a format version this dtlaunch does not read.
    """
    segments: dict[int, str] = {}
    snapshots: dict[int, str] = {}
    stale: list[str] = []
    for name in files.list_dir(directory):
        if (seq := segment_seq(name)) is not None:
            segments[seq] = name
        elif (seq := snapshot_seq(name)) is not None:
            snapshots[seq] = name
        elif name.endswith(TEMP_SUFFIX):
            stale.append(name)  # an interrupted create or snapshot: never renamed, never used
    state: bytes | None = None
    snap_seq = 0
    bad_snapshots: list[str] = []
    for seq in sorted(snapshots, reverse=True):
        name = snapshots[seq]
        if state is not None:
            stale.append(name)
            continue
        decoded = decode_snapshot(files.read(directory / name), directory / name)
        if isinstance(decoded, str) or decoded[0] != seq:
            problem = decoded if isinstance(decoded, str) else "file name and header disagree"
            log.warning("ignoring damaged WAL snapshot %s: %s", directory / name, problem)
            bad_snapshots.append(name)
            continue
        snap_seq, state = decoded
    order = sorted(segments)
    # Segments wholly covered by the snapshot are left over from an interrupted
    # compaction: the first one needed is the last to start at or before snap_seq + 1.
    start = 0
    for index, first in enumerate(order):
        if first <= snap_seq + 1:
            start = index
    stale.extend(segments[first] for first in order[:start])
    live = order[start:]
    records: list[bytes] = []
    record_bytes = 0
    expected = snap_seq + 1
    damage: Damage | None = None
    read: list[int] = []
    for index, first in enumerate(live):
        path = directory / segments[first]
        read.append(first)
        buf = files.read(path)
        header_seq, problem = decode_segment_header(buf, path)
        if not problem and header_seq != first:
            problem = f"header says the segment starts at seq {header_seq}, its name says {first}"
        if not problem and (first > expected or (index > 0 and first != expected)):
            problem = (
                f"segment starts at seq {first} but seq {expected} comes next (records missing)"
            )
        if problem and bad_snapshots:
            problem += f"; the newer snapshot {bad_snapshots[-1]} is damaged"
        if problem:
            damage = Damage(file=path, offset=0, problem=problem, lost_seq=expected, tail=False)
            break
        scan = scan_records(buf, SEGMENT_HEADER.size, first, skip_through=snap_seq)
        records.extend(scan.payloads)
        record_bytes += scan.payload_bytes
        expected = max(scan.next_seq, snap_seq + 1)
        if scan.damage:
            last = index == len(live) - 1
            damage = Damage(
                file=path,
                offset=scan.end,
                problem=scan.damage,
                lost_seq=expected,
                tail=scan.tail and last,
            )
            break
    return LogState(
        snapshot=state,
        snapshot_seq=snap_seq,
        records=records,
        record_bytes=record_bytes,
        last_seq=expected - 1,
        segments=read,
        later_segments=live[len(read) :],
        stale=stale,
        bad_snapshots=bad_snapshots,
        damage=damage,
    )


def read_high_water(files: FileLayer, directory: Path) -> int:
    """The seq the log in ``directory`` once held durably; 0 without a sound mark.

    A damaged mark is only a lost safeguard, not lost data: it is ignored with a
    warning (the next new segment writes a sound one).
    """
    path = high_water_path(directory)
    try:
        if path.name not in files.list_dir(path.parent):
            return 0
        decoded = decode_high_water(files.read(path))
    except OSError as err:
        log.warning("cannot read the WAL's high-water mark %s: %s", path, err)
        return 0
    if isinstance(decoded, str):
        log.warning("ignoring the WAL's high-water mark %s: %s", path, decoded)
        return 0
    return decoded


def write_durably(files: FileLayer, path: Path, data: bytes) -> None:
    """Write a whole file so that after a crash it is either absent or complete."""
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    handle = files.create(tmp)
    try:
        files.write(handle, data)
        files.fsync(handle)
    finally:
        files.close(handle)
    files.rename(tmp, path)
    files.fsync_dir(path.parent)


def truncate_durably(files: FileLayer, path: Path, size: int) -> None:
    handle = files.open_append(path)
    try:
        files.truncate(handle, size)
        files.fsync(handle)
    finally:
        files.close(handle)


def unused_name(files: FileLayer, directory: Path, stem: str) -> Path:
    taken = set(files.list_dir(directory))
    name, counter = stem, 1
    while name in taken or name + TEMP_SUFFIX in taken:
        counter += 1
        name = f"{stem}.{counter}"
    return directory / name


def cut_torn_tail(files: FileLayer, damage: Damage) -> TornTail:
    """Back up the bytes of a torn final write, then truncate the segment before them."""
    data = files.read(damage.file)
    cut = data[damage.offset :]
    backup = unused_name(
        files, damage.file.parent, f"{damage.file.name}.torn-at-{damage.offset}.bak"
    )
    write_durably(files, backup, cut)
    truncate_durably(files, damage.file, damage.offset)
    log.warning(
        "WAL %s: torn final record at byte %d (%s); cut %d bytes, kept in %s",
        damage.file,
        damage.offset,
        damage.problem,
        len(cut),
        backup,
    )
    return TornTail(file=damage.file, offset=damage.offset, bytes_cut=len(cut), backup=backup)


def remove_files(files: FileLayer, directory: Path, names: list[str]) -> None:
    for name in names:
        files.remove(directory / name)
    if names:
        files.fsync_dir(directory)


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairReport:
    """What :func:`repair` found and removed."""

    damage: str | None  # "FILE at byte N: problem", None when the log was sound
    kept_through_seq: int  # the log now ends with this seq
    first_dropped_seq: int | None
    records_dropped: int  # sound records found in what was removed (best effort)
    bytes_removed: int
    backup: Path | None  # folder holding everything removed
    tail_lost_from: int | None = None  # the log ended here, below its high-water mark
    high_water: int = 0  # that mark

    @property
    def changed(self) -> bool:
        """Whether the log now holds less than it once did (workers' leases are stale)."""
        return self.damage is not None or self.backup is not None or self.tail_lost_from is not None

    def __str__(self) -> str:
        lines = []
        if self.tail_lost_from is not None:
            lines.append(
                f"the log once held seq {self.high_water} but its files end at seq "
                f"{self.tail_lost_from - 1}: records from seq {self.tail_lost_from} are gone "
                f"with the missing files. The queue resumes from that older state (shards "
                f"finished since are trained again)"
            )
        if self.damage is None and self.backup is None:
            if not lines:
                return (
                    f"the WAL is sound (it ends at seq {self.kept_through_seq}); nothing to repair"
                )
            return "\n".join(lines)
        lines.append(f"damage: {self.damage or 'damaged snapshot files only'}")
        if self.first_dropped_seq is not None:
            lines.append(
                f"dropped {self.records_dropped} record(s) from seq {self.first_dropped_seq} "
                f"({self.bytes_removed} bytes); the log now ends at seq {self.kept_through_seq}"
            )
        lines.append(f"everything removed is kept in {self.backup}")
        return "\n".join(lines)


def repair_locked(files: FileLayer, directory: Path) -> RepairReport:
    """Cut the log at its first damage and lower its high-water mark to what is
    left (accepting files that are gone). The caller holds the WAL's lock."""
    state = scan_log(files, directory)
    damage = state.damage
    high_water = read_high_water(files, directory)
    if high_water > state.last_seq:
        # What the mark promised past the damage went with the cut, not with lost files.
        lost_from = None if damage is not None else state.last_seq + 1
        write_durably(files, high_water_path(directory), encode_high_water(state.last_seq))
    else:
        lost_from = None
    if damage is None and not state.bad_snapshots:
        report = RepairReport(
            damage=None,
            kept_through_seq=state.last_seq,
            first_dropped_seq=None,
            records_dropped=0,
            bytes_removed=0,
            backup=None,
            tail_lost_from=lost_from,
            high_water=high_water,
        )
        if lost_from is not None:
            log.info("WAL %s repaired: %s", directory, report)
        return report
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    backup = unused_name(files, directory, f"repair-{stamp}")
    files.make_dir(backup)
    removed = 0
    dropped = 0
    for name in state.bad_snapshots:
        removed += files.size(directory / name)
        files.rename(directory / name, backup / name)
    if damage is not None:
        data = files.read(damage.file)
        removed += len(data) - damage.offset
        if damage.offset == 0:
            first = segment_seq(damage.file.name) or damage.lost_seq
            dropped += count_sound_records(data, SEGMENT_HEADER.size, first)
            files.rename(damage.file, backup / damage.file.name)
        else:
            dropped += count_sound_records(data, damage.offset, damage.lost_seq)
            cut = backup / f"{damage.file.name}.from-{damage.offset}"
            write_durably(files, cut, data[damage.offset :])
            truncate_durably(files, damage.file, damage.offset)
        for first in state.later_segments:
            path = directory / segment_name(first)
            data = files.read(path)
            removed += len(data)
            dropped += count_sound_records(data, SEGMENT_HEADER.size, first)
            files.rename(path, backup / path.name)
    files.fsync_dir(backup)
    files.fsync_dir(directory)
    report = RepairReport(
        damage=f"{damage.file} at byte {damage.offset}: {damage.problem}" if damage else None,
        kept_through_seq=state.last_seq,
        first_dropped_seq=damage.lost_seq if damage else None,
        records_dropped=dropped,
        bytes_removed=removed,
        backup=backup,
        high_water=high_water,
    )
    log.info("WAL %s repaired: %s", directory, report)
    return report
