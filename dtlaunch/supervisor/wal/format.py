"""The WAL's on-disk format: file names, segment headers, records and snapshot files.

::

    segment  seg-<first seq, 20 digits>.wal
             header  magic "DTLWAL\\0S" | u32 format version | u64 first seq
                     | u32 crc32c(the 20 bytes before it)
             record  u32 payload length | u32 crc32c(seq + payload) | u64 seq | payload   (repeated)
    snapshot snap-<covered seq, 20 digits>.snap
             magic "DTLWAL\\0P" | u32 format version | u64 covered seq | u64 state length
             | u32 crc32c(covered seq + state length + state) | state
    high-water mark  <log directory>.highwater, *beside* the log directory
             magic "DTLWAL\\0H" | u32 format version | u64 seq | u32 crc32c(the 20 bytes before)

The high-water mark names a seq the log once held durably (the first record of
its newest segment). It lives outside the log directory so that losing the
newest segment, or every file of the directory, is noticed instead of resuming
from an older state without a word.

All integers are little-endian. The sequence number sits inside the checksummed part,
so a record that is intact but in the wrong place (a gap, a reordered or stale write)
is caught by its number, not only by its checksum.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from dtlaunch.errors import WalCorruptError as WalCorruptError  # defined with every error
from dtlaunch.errors import WalVersionError as WalVersionError

FORMAT_VERSION = 1
SEGMENT_MAGIC = b"DTLWAL\x00S"
SNAPSHOT_MAGIC = b"DTLWAL\x00P"
HIGH_WATER_MAGIC = b"DTLWAL\x00H"
HIGH_WATER_SUFFIX = ".highwater"
SEGMENT_HEADER = struct.Struct("<8sIQI")
RECORD_HEAD = struct.Struct("<IIQ")
SNAPSHOT_HEADER = struct.Struct("<8sIQQI")
SEQ = struct.Struct("<Q")
RECORD_OVERHEAD = RECORD_HEAD.size
MAX_PAYLOAD = 64 << 20  # a DDS transition is tens of bytes; anything near this is a bug
RESYNC_TRIES = 16  # how many following sequence numbers a damaged-record check looks for

_SEGMENT_RE = re.compile(r"seg-(\d{20})\.wal")
_SNAPSHOT_RE = re.compile(r"snap-(\d{20})\.snap")
TEMP_SUFFIX = ".tmp"


def run_dir_of(wal_dir: Path) -> Path:
    """The run directory a user passes to ``dtlaunch wal repair`` for ``wal_dir``."""
    return wal_dir.parent if wal_dir.name == "wal" else wal_dir


def high_water_path(wal_dir: Path) -> Path:
    """Where the high-water mark of the log in ``wal_dir`` is kept (beside it)."""
    return wal_dir.with_name(wal_dir.name + HIGH_WATER_SUFFIX)


def encode_high_water(seq: int) -> bytes:
    head = SEGMENT_HEADER.pack(HIGH_WATER_MAGIC, FORMAT_VERSION, seq, 0)[:-4]
    return head + struct.pack("<I", crc32c(head))


def decode_high_water(buf: bytes) -> int | str:
    """The seq a high-water mark names, or what is wrong with it."""
    if len(buf) != SEGMENT_HEADER.size:
        return f"{len(buf)} bytes, not {SEGMENT_HEADER.size}"
    magic, version, seq, crc = SEGMENT_HEADER.unpack_from(buf, 0)
    if magic != HIGH_WATER_MAGIC or crc != crc32c(buf[: SEGMENT_HEADER.size - 4]):
        return "not a sound high-water mark (magic or checksum)"
    if version != FORMAT_VERSION:
        return f"format version {version}, this dtlaunch reads {FORMAT_VERSION}"
    return int(seq)


def segment_name(first_seq: int) -> str:
    return f"seg-{first_seq:020d}.wal"


def snapshot_name(seq: int) -> str:
    return f"snap-{seq:020d}.snap"


def segment_seq(name: str) -> int | None:
    """The first sequence number a segment's file name promises, or None if not a segment."""
    match = _SEGMENT_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def snapshot_seq(name: str) -> int | None:
    match = _SNAPSHOT_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def encode_segment_header(first_seq: int) -> bytes:
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, first_seq, 0)[:-4]
    return head + struct.pack("<I", crc32c(head))


def decode_segment_header(buf: bytes, file: Path) -> tuple[int | None, str]:
    """``(first seq, "")`` for a sound header, else ``(None, problem)``.

    Raises:
        WalVersionError: a sound header (magic and checksum) of another format version.
    """
    if len(buf) < SEGMENT_HEADER.size:
        return None, f"segment header cut short ({len(buf)} of {SEGMENT_HEADER.size} bytes)"
    magic, version, first_seq, crc = SEGMENT_HEADER.unpack_from(buf, 0)
    if magic != SEGMENT_MAGIC:
        return None, f"not a dtlaunch WAL segment (magic {magic!r})"
    if crc != crc32c(buf[: SEGMENT_HEADER.size - 4]):
        # Damage first: a flipped byte of the version field fails the checksum
        # too, and only damage can be repaired. The version read is named in
        # case another release wrote the log.
        hint = "" if version == FORMAT_VERSION else f" (its version field reads {version})"
        return None, f"segment header checksum mismatch{hint}"
    if version != FORMAT_VERSION:
        raise WalVersionError(file, version, supported=FORMAT_VERSION)
    return first_seq, ""


def encode_record(seq: int, payload: bytes) -> bytes:
    body = SEQ.pack(seq) + payload
    return struct.pack("<II", len(payload), crc32c(body)) + body


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentScan:
    """What one pass over a segment's records found."""

    payloads: list[bytes]  # records with seq > skip_through, in order
    payload_bytes: int  # their size on disk, headers included
    next_seq: int  # the seq the next record must carry
    end: int  # offset just past the last sound record
    damage: str  # what is wrong at ``end``; "" when the segment ends cleanly there
    tail: bool  # the damage looks like a torn final write (nothing sound follows it)


def scan_records(buf: bytes, start: int, first_seq: int, skip_through: int) -> SegmentScan:
    """Parse records from ``start`` until the end of ``buf`` or the first damaged one.

    This is the recovery hot path: one ``unpack_from`` and one ``crc32c`` per record,
    slices of a memoryview, no per-record objects besides the payload itself.
    """
    view = memoryview(buf)
    size = len(buf)
    payloads: list[bytes] = []
    keep = payloads.append
    unpack = RECORD_HEAD.unpack_from
    head = RECORD_OVERHEAD
    expected = first_seq
    offset = start
    kept_from = -1
    damage = ""
    tail = False
    while offset < size:
        if offset + head > size:
            damage, tail = f"record header cut short ({size - offset} of {head} bytes)", True
            break
        length, crc, seq = unpack(buf, offset)
        stop = offset + head + length
        if stop > size:
            left = size - offset - head
            damage = f"record of {length} bytes runs past the end of the file ({left} left)"
            tail = True
            break
        if crc32c(view[offset + 8 : stop]) != crc:
            damage = f"checksum mismatch in the record expected to carry seq {expected}"
            # The last record of a torn write, perhaps followed by blocks the file
            # system zero-filled after the crash; anything else after it is damage.
            tail = buf.count(0, stop) == size - stop
            break
        if seq != expected:
            damage = (
                f"record carries seq {seq} where seq {expected} belongs (gap or reordered write)"
            )
            break
        if seq > skip_through:
            if kept_from < 0:
                kept_from = offset
            keep(buf[offset + head : stop])
        expected += 1
        offset = stop
    if tail and find_record(buf, offset + 1, expected, RESYNC_TRIES) is not None:
        # Sound records after the damage: this is not an interrupted last write.
        tail = False
    kept = offset - kept_from if kept_from >= 0 else 0
    return SegmentScan(
        payloads=payloads,
        payload_bytes=kept,
        next_seq=expected,
        end=offset,
        damage=damage,
        tail=tail,
    )


def find_record(buf: bytes, start: int, seq: int, tries: int) -> tuple[int, int] | None:
    """``(offset, seq)`` of the first sound record at or after ``start`` whose seq is one
    of ``seq .. seq + tries - 1`` (searched in that order), or None.

    Searching for the encoded sequence number is a C-speed scan, so checking whether a
    damaged record is really the last one costs little even in a large segment.
    """
    for candidate in range(seq, seq + tries):
        pattern = SEQ.pack(candidate)
        at = buf.find(pattern, start + 8)
        while at >= 0:
            offset = at - 8
            if _sound_record_at(buf, offset):
                return offset, candidate
            at = buf.find(pattern, at + 1)
    return None


def _sound_record_at(buf: bytes, offset: int) -> bool:
    if offset < 0 or offset + RECORD_OVERHEAD > len(buf):
        return False
    length, crc, _seq = RECORD_HEAD.unpack_from(buf, offset)
    stop = offset + RECORD_OVERHEAD + length
    return stop <= len(buf) and crc32c(memoryview(buf)[offset + 8 : stop]) == int(crc)


def count_sound_records(buf: bytes, start: int, next_seq: int) -> int:
    """How many sound records lie from ``start`` on, resynchronising past damage.

    Used by repair to say how much it drops; best effort by nature.
    """
    count = 0
    offset = start
    while True:
        found = find_record(buf, offset, next_seq, RESYNC_TRIES)
        if found is None:
            return count
        offset, next_seq = found
        scan = scan_records(buf, offset, next_seq, skip_through=next_seq - 1)
        count += len(scan.payloads)
        next_seq = scan.next_seq
        offset = scan.end


def encode_snapshot(seq: int, state: bytes) -> bytes:
    covered = struct.pack("<QQ", seq, len(state))
    crc = crc32c(state, crc32c(covered))
    return SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, FORMAT_VERSION, seq, len(state), crc) + state


def decode_snapshot(buf: bytes, file: Path) -> tuple[int, bytes] | str:
    """``(covered seq, state)``, or a problem description when the file is damaged.

    Raises:
        WalVersionError: the snapshot was written in another format version.
    """
    if len(buf) < SNAPSHOT_HEADER.size:
        return f"snapshot header cut short ({len(buf)} of {SNAPSHOT_HEADER.size} bytes)"
    magic, version, seq, length, crc = SNAPSHOT_HEADER.unpack_from(buf, 0)
    if magic != SNAPSHOT_MAGIC:
        return f"not a dtlaunch WAL snapshot (magic {magic!r})"
    state = buf[SNAPSHOT_HEADER.size :]
    if version != FORMAT_VERSION:
        # The checksum does not cover the version field: a snapshot whose state
        # checks out under this format is ours with a damaged version byte.
        if len(state) == length and crc32c(state, crc32c(struct.pack("<QQ", seq, length))) == crc:
            return f"snapshot header damaged: version field reads {version}, the state is sound"
        raise WalVersionError(file, version, supported=FORMAT_VERSION)
    if len(state) != length:
        return f"snapshot holds {len(state)} bytes of state, its header says {length}"
    if crc32c(state, crc32c(struct.pack("<QQ", seq, length))) != crc:
        return "snapshot checksum mismatch"
    return seq, state
