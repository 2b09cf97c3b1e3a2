"""The data-sharding queue's write-ahead log (DESIGN.md "Stateful DDS": WAL).

Open :class:`Wal` first; the modules below it, from the bytes up:

- ``format``   file names, segment headers, CRC32C-framed records, snapshot files
- ``files``    the file operations the log uses, behind a protocol a test can fake
- ``recovery`` reading a log directory back, cutting a torn tail, ``repair``
- ``commit``   the asyncio group committer: many appends share one fsync
- ``log``      :class:`Wal` itself: append, sync, snapshot, compaction, LOCK
"""

from dtlaunch.supervisor.wal.log import (
    FileLayer,
    GroupCommitter,
    RealFiles,
    Recovered,
    RepairReport,
    TornTail,
    Wal,
    WalCorruptError,
    WalFsyncError,
    WalTailLostError,
    WalVersionError,
    repair,
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
