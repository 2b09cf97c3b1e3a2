"""``dtlaunch`` whose fsync fails with EIO on WAL files after N successes.

usage: dtlaunch_failing_fsync.py N COUNT_FILE dtlaunch-args...
Each fsync attempted on a WAL file is counted in COUNT_FILE, so the test can
check that the failed one was never retried.
"""

import errno
import os
import sys

limit, count_file = int(sys.argv[1]), sys.argv[2]
real_fsync = os.fsync
attempts = 0


def failing_fsync(fd: int) -> None:
    global attempts
    if "/wal/" in os.readlink(f"/proc/self/fd/{fd}"):
        attempts += 1
        with open(count_file, "w") as out:
            out.write(str(attempts))
        if attempts > limit:
            raise OSError(errno.EIO, "Input/output error (injected)")
    real_fsync(fd)


os.fsync = failing_fsync
sys.argv = ["dtlaunch", *sys.argv[3:]]
from dtlaunch.cli import main  # noqa: E402

main()
