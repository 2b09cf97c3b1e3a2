"""Fails in a chosen way on chosen attempts, succeeds otherwise.

usage: flaky.py OUT_DIR MODE FAIL_RANK FAIL_ATTEMPTS
MODE: sigkill | runtime | import | argparse
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

out_dir, mode, fail_rank, fail_attempts = (
    Path(sys.argv[1]),
    sys.argv[2],
    int(sys.argv[3]),
    int(sys.argv[4]),
)
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
(out_dir / f"{rank}-{attempt}.json").write_text(
    json.dumps({"rank": rank, "attempt": attempt, "pid": os.getpid()})
)
print(f"rank {rank} attempt {attempt}", flush=True)
time.sleep(0.5)
if rank == fail_rank and attempt < fail_attempts:
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "runtime":
        raise RuntimeError(f"deliberate failure of rank {rank} attempt {attempt}")
    if mode == "import":
        import dtlaunch_no_such_module  # noqa: F401
    if mode == "argparse":
        import argparse

        argparse.ArgumentParser().parse_args(["--no-such-flag"])
time.sleep(0.5)
print(f"rank {rank} done", flush=True)
