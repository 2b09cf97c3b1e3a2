"""A synthetic DDS worker that keeps a record-level ledger for the tests.

usage: dds_worker.py LEDGER_DIR STEP [SLOWDOWN_BY_RANK as r:f,r:f] [--register=N,S,E,B]

STEP is seconds per step, or @FILE holding them (re-read every few steps, so a
test can slow the job down while it kills supervisors and speed it up after).

Every batch's record indices are appended (one line per step: epoch-agnostic
record ids) to LEDGER_DIR/<rank>-<attempt>.txt and flushed before job.step(),
so the ledger survives a SIGKILL of this process. A rank listed in
SLOWDOWN_BY_RANK sleeps that factor times longer per step.
"""

import os
import sys
import time
from pathlib import Path

import dtlaunch

ledger_dir = Path(sys.argv[1])
step_arg = sys.argv[2]


def step_seconds():
    if step_arg.startswith("@"):
        try:
            return float(Path(step_arg[1:]).read_text())
        except (OSError, ValueError):
            return 0.0
    return float(step_arg)


slowdown = {}
register = {}
for arg in sys.argv[3:]:
    if arg.startswith("--register="):
        n, s, e, b = (int(x) for x in arg.split("=", 1)[1].split(","))
        register = {"dataset_size": n, "shard_size": s, "epochs": e, "global_batch": b}
    elif arg:
        slowdown = {int(r): float(f) for r, f in (p.split(":") for p in arg.split(","))}

job = dtlaunch.init(**register)
rank = job.rank
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
factor = slowdown.get(rank, 1.0)
delay = step_seconds() * factor
with (ledger_dir / f"{rank}-{attempt}.txt").open("a") as ledger:
    for step, batch in enumerate(job.batches()):
        if step % 10 == 0:
            delay = step_seconds() * factor
        time.sleep(delay)
        ledger.write(" ".join(map(str, batch)) + "\n")
        ledger.flush()
        job.step()
job.close()
print(f"rank {rank} finished after {job.step_count} steps", flush=True)
