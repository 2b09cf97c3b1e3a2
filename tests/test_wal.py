"""The WAL on a real disk: round trips, group commit, snapshots, locking, damage, repair."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crc32c import crc32c

from dtlaunch.errors import DtlaunchError, RunDirError
from dtlaunch.supervisor.wal.format import encode_record, encode_segment_header
from dtlaunch.supervisor.wal.log import (
    GroupCommitter,
    RealFiles,
    Wal,
    WalCorruptError,
    WalFsyncError,
    WalTailLostError,
    WalVersionError,
    repair,
)

REPO = Path(__file__).resolve().parents[1]
HEADER = 24  # segment header bytes


class CountingFiles(RealFiles):
    """Real files that count writes and fsyncs; fsync fails with EIO once ``fail`` is
    set, as on a dying disk, and can be slowed down."""

    def __init__(self, fsync_delay: float = 0.0) -> None:
        self.fsyncs = self.writes = 0
        self.fsync_delay = fsync_delay
        self.fail = False

    def write(self, handle, data):
        self.writes += 1
        super().write(handle, data)

    def fsync(self, handle):
        self.fsyncs += 1
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")
        time.sleep(self.fsync_delay)
        super().fsync(handle)


def segments(wal_dir: Path) -> list[Path]:
    return sorted(p for p in wal_dir.iterdir() if p.name.startswith("seg-") and p.suffix == ".wal")


def write_log(wal_dir: Path, payloads: list[bytes], **kw) -> None:
    wal, _ = Wal.open(wal_dir, **kw)
    for data in payloads:
        wal.append(data)
        wal.sync()
    wal.close()


def record_offset(payloads: list[bytes], index: int) -> int:
    return HEADER + sum(16 + len(p) for p in payloads[:index])


PAYLOADS = [f"transition-{i}".encode() * (1 + i % 3) for i in range(20)]


def run_python(code: str, *args: str) -> subprocess.Popen[str]:
    pipe = subprocess.PIPE
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=pipe, stderr=pipe, text=True)


def recover(wal_dir: Path):
    """Recover and close at once: what a restarted supervisor would find."""
    wal, recovered = Wal.open(wal_dir)
    wal.close()
    return recovered


def test_round_trip_keeps_every_record_in_order(tmp_path):
    payloads = [b"", b"a", os.urandom(100_000), *PAYLOADS]
    wal, recovered = Wal.open(tmp_path / "wal")
    assert recovered.snapshot is None and recovered.records == [] and recovered.torn_tail is None
    assert [wal.append(p) for p in payloads] == list(range(1, len(payloads) + 1))
    assert wal.durable_seq == 0 and wal.appended_seq == len(payloads)
    assert wal.sync() == len(payloads) == wal.durable_seq
    wal.close()

    wal, recovered = Wal.open(tmp_path / "wal")
    assert recovered.records == payloads and recovered.torn_tail is None
    assert wal.append(b"next") == len(payloads) + 1
    wal.close()
    assert (tmp_path / "wal" / "LOCK").exists()


def test_segments_roll_over_and_recovery_crosses_them(tmp_path):
    payloads = [os.urandom(30) for _ in range(100)]
    wal, _ = Wal.open(tmp_path / "wal", segment_bytes=256)
    for start in range(0, 100, 3):
        for data in payloads[start : start + 3]:
            wal.append(data)
        wal.sync()
    wal.close()
    files = segments(tmp_path / "wal")
    assert len(files) > 10
    firsts = []
    for path in files:
        data = path.read_bytes()
        magic, version, first, _crc = struct.unpack_from("<8sIQI", data)
        assert (magic, version) == (b"DTLWAL\x00S", 1)
        assert path.name == f"seg-{first:020d}.wal"
        assert len(data) <= 256 + 3 * 46  # rolls over once past the limit
        firsts.append(first)
    assert firsts == sorted(firsts) and firsts[0] == 1
    recovered = recover(tmp_path / "wal")
    assert recovered.records == payloads


def test_concurrent_appends_share_few_fsyncs(tmp_path):
    files = CountingFiles()
    wal, _ = Wal.open(tmp_path / "wal", files=files)

    async def main():
        committer = GroupCommitter(wal)

        async def one(i):
            seq = await committer.append(b"rec-%d" % i)
            assert wal.durable_seq >= seq  # resolved only once durable
            return seq

        seqs = await asyncio.gather(*(one(i) for i in range(1000)))
        assert await committer.append_many([b"m1", b"m2", b"m3"]) == 1003
        await committer.close()
        return seqs

    seqs = asyncio.run(main())
    assert sorted(seqs) == list(range(1, 1001))
    # 1000 appends + one append_many: a handful of batches, one write + one fsync each
    # (plus one fsync for the new segment's header).
    assert files.fsyncs <= 6, files.fsyncs
    assert files.writes <= 6
    wal.close()
    recovered = recover(tmp_path / "wal")
    assert len(recovered.records) == 1003
    assert set(recovered.records[:1000]) == {b"rec-%d" % i for i in range(1000)}


def test_staged_records_resolve_once_durable_and_in_seq_order(tmp_path):
    """stage() appends without a waiter; until_durable(seq) resolves only after a
    sync covering seq, and at once for a seq that is durable already."""
    files = CountingFiles(fsync_delay=0.05)
    wal, _ = Wal.open(tmp_path / "wal", files=files)

    async def main():
        committer = GroupCommitter(wal)
        first = committer.stage([b"a", b"b"])
        second = committer.stage([b"c"])
        assert (first, second) == (2, 3)
        assert committer.stage([]) == wal.durable_seq  # nothing staged: nothing to wait for
        assert wal.durable_seq < first  # appended, not yet durable
        later = committer.until_durable(second)
        assert not later.done()
        assert await later == 3 and wal.durable_seq >= 3
        done = committer.until_durable(first)
        assert done.done() and done.result() == first  # durable already
        await committer.close()

    asyncio.run(main())
    wal.close()
    assert recover(tmp_path / "wal").records == [b"a", b"b", b"c"]


def test_a_failed_sync_fails_staging_and_waiting_after_it(tmp_path):
    files = CountingFiles()
    wal, _ = Wal.open(tmp_path / "wal", files=files)

    async def main():
        committer = GroupCommitter(wal)
        await committer.append(b"warm-up")
        files.fail = True
        with pytest.raises(WalFsyncError):
            await committer.until_durable(committer.stage([b"lost"]))
        with pytest.raises(WalFsyncError):
            committer.stage([b"refused"])
        with pytest.raises(WalFsyncError):
            committer.until_durable(1)

    asyncio.run(main())


def test_fsync_runs_off_the_event_loop_and_latecomers_share_the_next_one(tmp_path):
    files = CountingFiles(fsync_delay=0.3)
    wal, _ = Wal.open(tmp_path / "wal", files=files)

    async def main():
        committer = GroupCommitter(wal, max_delay=0.0)
        await committer.append(b"warm-up")  # creates the segment (header fsync)
        files.fsyncs = 0
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        first = asyncio.create_task(committer.append(b"first"))
        await asyncio.sleep(0.05)  # the first fsync is running now
        late = [asyncio.create_task(committer.append(b"late-%d" % i)) for i in range(50)]
        await asyncio.gather(first, *late)
        tick_task.cancel()
        await committer.close()
        return ticks

    ticks = asyncio.run(main())
    wal.close()
    assert ticks >= 20  # ~0.6 s of fsyncs, and the loop kept ticking every 10 ms
    assert files.fsyncs == 2  # the 50 late appends rode on one fsync


def test_snapshot_through_committer_while_appends_continue(tmp_path):
    wal, _ = Wal.open(tmp_path / "wal", segment_bytes=512)

    async def main():
        committer = GroupCommitter(wal)
        await committer.append_many([b"a%d" % i for i in range(30)])
        # The snapshot covers what was appended when it was called (seq 1..30); the
        # b-records race with it being written in a worker thread and follow it.
        snapshot = asyncio.create_task(committer.snapshot(b"state-of-a"))
        await asyncio.sleep(0)
        assert wal.bytes_since_snapshot == 0
        seqs = await asyncio.gather(*(committer.append(b"b%d" % i) for i in range(30)))
        await snapshot
        await committer.close()
        return seqs

    assert asyncio.run(main()) == list(range(31, 61))
    wal.close()
    recovered = recover(tmp_path / "wal")
    assert recovered.snapshot == b"state-of-a"
    assert recovered.records == [b"b%d" % i for i in range(30)]


SYNC_THEN_HANG = """
import sys, time; from pathlib import Path; from dtlaunch.supervisor.wal.log import Wal
wal, _ = Wal.open(Path(sys.argv[1]))
for i in range(10): wal.append(b"synced-%d" % i)
wal.sync()
for i in range(5): wal.append(b"buffered-%d" % i)
print("ready", flush=True); time.sleep(60)
"""


@pytest.mark.integration
def test_killed_writer_leaves_exactly_its_synced_records_and_frees_the_lock(tmp_path):
    wal_dir = tmp_path / "wal"
    child = run_python(SYNC_THEN_HANG, str(wal_dir))
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(RunDirError) as locked:
            Wal.open(wal_dir)
        assert f"pid {child.pid}" in str(locked.value)
        assert "Stop that process" in str(locked.value)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    wal, recovered = Wal.open(wal_dir)  # kill -9 released the lock
    wal.close()
    assert recovered.records == [b"synced-%d" % i for i in range(10)]
    assert recovered.torn_tail is None


TRY_OPEN = """
import sys; from pathlib import Path; from dtlaunch.errors import RunDirError
from dtlaunch.supervisor.wal.log import Wal
try: wal, rec = Wal.open(Path(sys.argv[1]))
except RunDirError as err: print(err); sys.exit(3)
print(len(rec.records)); wal.close()
"""


@pytest.mark.integration
def test_lock_refuses_a_second_supervisor_process(tmp_path):
    wal, _ = Wal.open(tmp_path / "wal")
    wal.append(b"x")
    wal.sync()
    other = run_python(TRY_OPEN, str(tmp_path / "wal"))
    out, err = other.communicate(timeout=60)
    assert other.returncode == 3, err
    assert f"locked by pid {os.getpid()}" in out
    with pytest.raises(RunDirError):  # another open in this process is refused too
        Wal.open(tmp_path / "wal")
    with pytest.raises(RunDirError, match="locked by"):  # and so is repair
        repair(tmp_path / "wal")
    wal.close()
    other = run_python(TRY_OPEN, str(tmp_path / "wal"))
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert out.strip() == "1"


def test_snapshots_compact_old_segments_and_recover_with_later_records(tmp_path):
    wal_dir = tmp_path / "wal"
    wal, _ = Wal.open(wal_dir, segment_bytes=200)
    for i in range(50):
        wal.append(b"first-%02d" % i)
        wal.sync()
    assert len(segments(wal_dir)) > 3
    assert wal.bytes_since_snapshot == sum(16 + 8 for _ in range(50))
    wal.write_snapshot(b"S1")
    assert wal.bytes_since_snapshot == 0
    assert segments(wal_dir) == []  # every record is covered by the snapshot
    assert [p.name for p in wal_dir.glob("snap-*")] == [f"snap-{50:020d}.snap"]
    for i in range(20):
        wal.append(b"second-%02d" % i)
    wal.sync()
    wal.write_snapshot(b"S2")
    assert [p.name for p in wal_dir.glob("snap-*")] == [f"snap-{70:020d}.snap"]
    later = [b"third-%d" % i for i in range(7)]
    for data in later:
        wal.append(data)
    wal.close()

    wal, recovered = Wal.open(wal_dir)
    assert recovered.snapshot == b"S2"
    assert recovered.records == later
    assert wal.appended_seq == 77
    assert wal.bytes_since_snapshot == sum(16 + len(p) for p in later)
    wal.close()


def test_leftovers_of_an_interrupted_compaction_are_ignored_then_removed(tmp_path):
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS[:10], segment_bytes=100)
    old = {p.name: p.read_bytes() for p in segments(wal_dir)}
    wal, _ = Wal.open(wal_dir, segment_bytes=100)
    wal.write_snapshot(b"through-10")
    wal.append(b"eleven")
    wal.close()
    for name, data in old.items():  # as if the deletes never reached the disk
        (wal_dir / name).write_bytes(data)
    (wal_dir / "seg-00000000000000000099.wal.tmp").write_bytes(b"half a header")
    recovered = recover(wal_dir)
    assert recovered.snapshot == b"through-10" and recovered.records == [b"eleven"]
    assert [p.name for p in segments(wal_dir)] == [f"seg-{11:020d}.wal"]
    assert not list(wal_dir.glob("*.tmp"))


@pytest.mark.parametrize(
    ("damage", "kept"),
    [
        ("cut-payload", 19),
        ("cut-header", 19),
        ("bad-crc-at-end", 19),
        ("zero-filled", 20),
    ],
)
def test_torn_final_record_is_cut_and_kept_as_backup(tmp_path, damage, kept):
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS)
    (segment,) = segments(wal_dir)
    data = segment.read_bytes()
    last = record_offset(PAYLOADS, 19)
    if damage == "cut-payload":
        segment.write_bytes(data[:-5])
    elif damage == "cut-header":
        segment.write_bytes(data[: last + 7])
    elif damage == "bad-crc-at-end":
        segment.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        segment.write_bytes(data + bytes(4096))
    damaged = segment.read_bytes()
    cut_at = last if kept == 19 else len(data)

    wal, recovered = Wal.open(wal_dir)
    torn = recovered.torn_tail
    assert recovered.records == PAYLOADS[:kept]
    assert torn is not None and torn.file == segment and torn.offset == cut_at
    assert torn.bytes_cut == len(damaged) - cut_at
    assert torn.backup.parent == wal_dir and torn.backup.read_bytes() == damaged[cut_at:]
    assert segment.read_bytes() == damaged[:cut_at]
    assert wal.append(b"again") == kept + 1
    wal.close()
    recovered = recover(wal_dir)
    assert recovered.torn_tail is None and recovered.records == [*PAYLOADS[:kept], b"again"]


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x55
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["payload-byte", "length-past-eof"])
def test_corruption_before_the_tail_is_refused_naming_file_offset_and_fix(tmp_path, damage):
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS)
    (segment,) = segments(wal_dir)
    at = record_offset(PAYLOADS, 4)
    data = bytearray(segment.read_bytes())
    if damage == "payload-byte":
        data[at + 20] ^= 0x55
    else:  # looks like a torn final record, but sound records follow it
        data[at : at + 4] = struct.pack("<I", 10_000_000)
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError) as caught:
        Wal.open(wal_dir)
    message = str(caught.value)
    assert str(segment) in message and f"byte {at}" in message
    assert f"dtlaunch wal repair {tmp_path}" in message
    assert caught.value.offset == at and isinstance(caught.value, DtlaunchError)
    # The refusal released the lock and changed nothing.
    with pytest.raises(WalCorruptError):
        Wal.open(wal_dir)
    assert segment.read_bytes() == data


def test_sequence_gap_is_refused(tmp_path):
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    body = b"".join(encode_record(seq, b"p%d" % seq) for seq in (1, 2, 4, 5))
    (wal_dir / f"seg-{1:020d}.wal").write_bytes(encode_segment_header(1) + body)
    with pytest.raises(WalCorruptError, match="seq 4 where seq 3 belongs"):
        Wal.open(wal_dir)


def test_damaged_header_and_damaged_older_segment_are_refused(tmp_path):
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS, segment_bytes=120)
    first, second, *_ = segments(wal_dir)
    good = first.read_bytes()
    first.write_bytes(good[:-3])  # a torn end, but not in the last segment
    with pytest.raises(WalCorruptError) as caught:
        Wal.open(wal_dir)
    assert caught.value.file == first
    first.write_bytes(good)
    _flip(second, 13)  # inside the first-seq field of the header
    with pytest.raises(WalCorruptError, match="header checksum") as caught:
        Wal.open(wal_dir)
    assert caught.value.file == second and caught.value.offset == 0


def test_unknown_version_and_magic_are_refused(tmp_path):
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS[:3])
    (segment,) = segments(wal_dir)
    data = segment.read_bytes()
    head = struct.pack("<8sIQ", b"DTLWAL\x00S", 2, 1)
    segment.write_bytes(head + struct.pack("<I", crc32c(head)) + data[HEADER:])
    with pytest.raises(WalVersionError, match=r"format version 2.*reads only version 1"):
        Wal.open(wal_dir)
    with pytest.raises(WalVersionError):  # repair does not touch another format either
        repair(wal_dir)
    assert len(segment.read_bytes()) == len(data)
    segment.write_bytes(b"NOTAWAL!" + data[8:])
    with pytest.raises(WalCorruptError, match="not a dtlaunch WAL segment"):
        Wal.open(wal_dir)


def test_repair_cuts_at_the_first_damage_keeps_a_backup_then_open_works(tmp_path):
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS, segment_bytes=400)
    files = segments(wal_dir)
    assert len(files) >= 3
    _flip(files[0], record_offset(PAYLOADS, 3) + 20)  # seq 4 in the first segment
    before = {p.name: p.read_bytes() for p in files}

    report = repair(wal_dir)
    assert report.first_dropped_seq == 4 and report.kept_through_seq == 3
    assert report.records_dropped == 16  # seq 5..20 were sound; seq 4 was the damaged one
    assert report.backup is not None and report.backup.parent == wal_dir
    removed = sum(len(d) for d in before.values()) - len(files[0].read_bytes())
    assert report.bytes_removed == removed
    assert sum(p.stat().st_size for p in report.backup.iterdir()) == removed
    for path in files[1:]:
        assert (report.backup / path.name).read_bytes() == before[path.name]
    assert "dropped 16 record(s) from seq 4" in str(report)

    wal, recovered = Wal.open(wal_dir)
    assert recovered.records == PAYLOADS[:3] and recovered.torn_tail is None
    assert wal.append(b"after repair") == 4
    wal.close()
    assert repair(wal_dir).damage is None  # sound now: nothing to do


def test_damaged_only_snapshot_is_refused_and_repair_drops_what_depends_on_it(tmp_path):
    wal_dir = tmp_path / "wal"
    wal, _ = Wal.open(wal_dir)
    for data in PAYLOADS[:5]:
        wal.append(data)
    wal.write_snapshot(b"state")
    wal.append(b"later")
    wal.close()
    (snap,) = wal_dir.glob("snap-*")
    _flip(snap, 34)  # a byte of the state
    with pytest.raises(WalCorruptError, match="records missing"):
        Wal.open(wal_dir)
    report = repair(wal_dir)
    assert report.records_dropped == 1 and (report.backup / snap.name).exists()
    recovered = recover(wal_dir)
    assert recovered.snapshot is None and recovered.records == []


def test_fsync_error_is_fatal_reaches_every_waiter_and_is_never_retried(tmp_path):
    files = CountingFiles()
    wal, _ = Wal.open(tmp_path / "wal", files=files)

    async def main():
        committer = GroupCommitter(wal)
        await committer.append(b"durable")
        files.fail = True
        attempts = files.fsyncs
        results = await asyncio.gather(
            *(committer.append(b"x%d" % i) for i in range(20)), return_exceptions=True
        )
        assert all(isinstance(r, WalFsyncError) for r in results), results
        assert "Input/output error" in str(results[0])
        assert isinstance(results[0], DtlaunchError)
        assert files.fsyncs == attempts + 1  # exactly one try, shared by all 20
        with pytest.raises(WalFsyncError):
            await committer.append(b"refused")
        await committer.close()
        for refused in (lambda: wal.append(b"x"), wal.sync, lambda: wal.write_snapshot(b"s")):
            with pytest.raises(WalFsyncError):
                refused()
        assert files.fsyncs == attempts + 1

    asyncio.run(main())
    wal.close()  # releases the lock without raising again
    files.fail = False
    assert recover(tmp_path / "wal").records[0] == b"durable"


def test_a_flipped_version_byte_is_damage_that_repair_can_cut(tmp_path):
    """Issue 12, defect 5: a segment whose version byte flipped (so its header
    checksum fails) was 'written by another release', and repair refused it."""
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS, segment_bytes=400)
    files = segments(wal_dir)
    _flip(files[1], 8)  # the version field of the second segment's header
    with pytest.raises(WalCorruptError, match=r"header checksum mismatch.*version field") as caught:
        Wal.open(wal_dir)
    assert caught.value.file == files[1] and caught.value.offset == 0
    report = repair(wal_dir)
    assert report.damage is not None and report.backup is not None
    recovered = recover(wal_dir)
    assert recovered.records == PAYLOADS[: len(recovered.records)] and recovered.records


def test_a_snapshot_with_a_flipped_version_byte_is_damage_too(tmp_path):
    wal_dir = tmp_path / "wal"
    wal, _ = Wal.open(wal_dir)
    for data in PAYLOADS[:5]:
        wal.append(data)
    wal.write_snapshot(b"state")
    wal.append(b"later")
    wal.close()
    (snap,) = wal_dir.glob("snap-*")
    _flip(snap, 8)  # the version field: not covered by the snapshot's checksum
    with pytest.raises(WalCorruptError, match=r"records missing.*damaged"):
        Wal.open(wal_dir)
    report = repair(wal_dir)
    assert (report.backup / snap.name).exists()
    assert recover(wal_dir).records == []


def test_a_lost_newest_segment_is_refused_until_repair_accepts_the_loss(tmp_path):
    """Deleting the last segment used to resume silently with the queue rolled back."""
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS, segment_bytes=400)
    files = segments(wal_dir)
    newest_first = int(files[-1].name[4:24])
    files[-1].unlink()
    with pytest.raises(WalTailLostError) as refused:
        Wal.open(wal_dir)
    text = str(refused.value)
    assert f"once held seq {newest_first}" in text
    assert f"ends at seq {newest_first - 1}" in text
    assert f"dtlaunch wal repair {tmp_path}" in text

    report = repair(wal_dir)
    assert report.changed and report.tail_lost_from == newest_first
    assert f"records from seq {newest_first} are gone" in str(report)
    wal, recovered = Wal.open(wal_dir)
    assert recovered.records == PAYLOADS[: newest_first - 1]
    assert wal.append(b"after repair") == newest_first
    wal.sync()
    wal.close()
    assert not repair(wal_dir).changed  # the mark moved with the new segment: sound


def test_a_wal_whose_every_file_is_gone_is_refused_until_repaired(tmp_path):
    wal_dir = tmp_path / "wal"
    write_log(wal_dir, PAYLOADS[:5])
    for path in wal_dir.iterdir():
        path.unlink()
    with pytest.raises(WalTailLostError, match="every record is gone"):
        Wal.open(wal_dir)
    shutil.rmtree(wal_dir)  # the directory itself may go too
    with pytest.raises(WalTailLostError, match="every record is gone"):
        Wal.open(wal_dir)
    shutil.rmtree(wal_dir)  # open made it (and its LOCK), then refused
    assert repair(wal_dir).tail_lost_from == 1
    assert recover(wal_dir).records == []


def test_the_high_water_mark_moves_only_with_a_new_segment_and_a_damaged_one_is_ignored(
    tmp_path, caplog
):
    wal_dir, mark = tmp_path / "wal", tmp_path / "wal.highwater"
    files = CountingFiles()
    wal, _ = Wal.open(wal_dir, files=files)
    assert not mark.exists()  # an empty log promises nothing
    wal.append(b"a")
    wal.sync()
    written = mark.read_bytes()
    assert struct.unpack_from("<8sIQ", written) == (b"DTLWAL\x00H", 1, 1)
    fsyncs = files.fsyncs
    for data in PAYLOADS[:5]:
        wal.append(data)
        wal.sync()
    assert files.fsyncs == fsyncs + 5  # one per sync: the mark costs nothing per record
    assert mark.read_bytes() == written
    wal.close()

    mark.write_bytes(b"\x00" * len(written))
    with caplog.at_level("WARNING"):
        assert len(recover(wal_dir).records) == 6
    assert "ignoring the WAL's high-water mark" in caplog.text
