"""WAL measurements on the real disk: group commit, fsync per record, latency, recovery.

Each function works in a fresh folder under ``path`` and returns a dict of numbers;
benchmarks/dds.py calls them. Run as a script to print them all side by side:

    python benchmarks/wal_bench.py [--records 1000000] [--appends 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from dtlaunch.supervisor.wal.files import FileHandle
from dtlaunch.supervisor.wal.log import GroupCommitter, RealFiles, Wal

PAYLOAD = b"G|shard=000123|worker=07|attempt=01|ep=3|"  # ~ one DDS transition
# Targets of the issue on a 2-core machine; checked when run as a script.
MIN_GROUP_COMMIT_RATE = 20_000.0  # durable appends/s, 64 in flight
MAX_RECOVERY_S = 2.0  # for 1,000,000 records without a snapshot


class CountingFiles(RealFiles):
    """Real files that count fsyncs, to report records per fsync."""

    def __init__(self) -> None:
        self.fsyncs = 0

    def fsync(self, handle: FileHandle) -> None:
        self.fsyncs += 1
        super().fsync(handle)


def _fresh(path: Path, name: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=path))
    return folder / "wal"


def group_commit_rate(path: Path, n: int = 100_000, concurrency: int = 64) -> dict[str, float]:
    """Durable appends/s with ``concurrency`` appenders awaiting GroupCommitter.append."""
    files = CountingFiles()
    wal, _ = Wal.open(_fresh(path, "group"), files=files)
    per_task = max(1, n // concurrency)

    async def run() -> float:
        committer = GroupCommitter(wal)

        async def appender() -> None:
            for _ in range(per_task):
                await committer.append(PAYLOAD)

        start = time.perf_counter()
        await asyncio.gather(*(appender() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        await committer.close()
        return elapsed

    try:
        elapsed = asyncio.run(run())
    finally:
        wal.close()
    total = per_task * concurrency
    return {
        "appends": total,
        "concurrency": concurrency,
        "seconds": elapsed,
        "appends_per_s": total / elapsed,
        "fsyncs": files.fsyncs,
        "records_per_fsync": total / max(1, files.fsyncs),
    }


def fsync_per_record_rate(path: Path, n: int = 2_000) -> dict[str, float]:
    """The baseline: append one record, sync it, repeat (no batching)."""
    wal, _ = Wal.open(_fresh(path, "single"))
    try:
        start = time.perf_counter()
        for _ in range(n):
            wal.append(PAYLOAD)
            wal.sync()
        elapsed = time.perf_counter() - start
    finally:
        wal.close()
    return {"appends": n, "seconds": elapsed, "appends_per_s": n / elapsed}


def fsync_latency_percentiles(path: Path, n: int = 2_000) -> dict[str, float]:
    """Latency of one durable append (write + fsync of a single record), in ms."""
    wal, _ = Wal.open(_fresh(path, "latency"))
    samples: list[float] = []
    try:
        wal.append(PAYLOAD)
        wal.sync()  # the first sync also creates the segment
        for _ in range(n):
            wal.append(PAYLOAD)
            start = time.perf_counter()
            wal.sync()
            samples.append(time.perf_counter() - start)
    finally:
        wal.close()
    samples.sort()

    def pct(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] * 1e3

    return {"syncs": n, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": samples[-1] * 1e3}


def recovery_time(path: Path, records: int = 1_000_000) -> dict[str, float]:
    """Seconds for Wal.open to read back ``records`` records (no snapshot)."""
    wal_dir = _fresh(path, "recovery")
    wal, _ = Wal.open(wal_dir)
    try:
        for seq in range(1, records + 1):
            wal.append(PAYLOAD)
            if seq % 8192 == 0:
                wal.sync()
    finally:
        wal.close()
    size = sum(p.stat().st_size for p in wal_dir.glob("seg-*.wal"))
    start = time.perf_counter()
    wal, recovered = Wal.open(wal_dir)
    elapsed = time.perf_counter() - start
    wal.close()
    if len(recovered.records) != records:
        raise AssertionError(f"recovered {len(recovered.records)} of {records} records")
    return {
        "records": records,
        "bytes": size,
        "seconds": elapsed,
        "records_per_s": records / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="for recovery_time")
    parser.add_argument("--appends", type=int, default=100_000, help="for group_commit_rate")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=None, help="folder on the disk to test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wal-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        group = group_commit_rate(root, args.appends, args.concurrency)
        single = fsync_per_record_rate(root)
        latency = fsync_latency_percentiles(root)
        recovery = recovery_time(root, args.records)
    results = {
        "group_commit": group,
        "fsync_per_record": single,
        "fsync_latency": latency,
        "recovery": recovery,
        "group_commit_speedup": group["appends_per_s"] / single["appends_per_s"],
    }
    print(json.dumps(results, indent=2))
    checks = [
        (
            f"group commit >= {MIN_GROUP_COMMIT_RATE:.0f} appends/s",
            group["appends_per_s"] >= MIN_GROUP_COMMIT_RATE,
        ),
    ]
    if args.records >= 1_000_000:
        checks.append(
            (f"recovery of 1M records <= {MAX_RECOVERY_S} s", recovery["seconds"] <= MAX_RECOVERY_S)
        )
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    return 0 if all(ok for _label, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
