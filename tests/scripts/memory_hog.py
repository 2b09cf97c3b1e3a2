"""A process whose memory grows past its limit, for the OOM-relaunch tests.

usage: memory_hog.py LEDGER_DIR STEP HOG HOG_MB     (HOG: worker:RANK or server:RANK)

As a worker it is dds_worker.py's twin: it appends each batch's record ids to
LEDGER_DIR/<rank>-<attempt>.txt, flushed before job.step(). As a ps-lite style
server (``--ps-server script``, DMLC_ROLE=server) it serves until the job stops it.
The process named by HOG takes HOG_MB more memory and keeps it (written bytes, so
every page is resident and counts against a cgroup limit as well as an
address-space one): a worker after its third step, a server as it starts. It
does so on every attempt, as a model whose working set outgrew its first limit.
"""

import os
import sys
import time
from pathlib import Path

ledger_dir = Path(sys.argv[1])
step_s = float(sys.argv[2])
hog_role, hog_rank = sys.argv[3].split(":")
hog_mb = int(sys.argv[4])
held = []


def grow(role, rank):
    if (role, rank) == (hog_role, int(hog_rank)):
        held.append(b"\x01" * (hog_mb << 20))
        print(f"{role} {rank} holds {hog_mb} MiB more", flush=True)


if os.environ.get("DMLC_ROLE") == "server":
    grow("server", int(os.environ["RANK"]))
    while True:  # a parameter server serves until the job stops it
        time.sleep(0.2)

import dtlaunch  # noqa: E402 - a script server needs no SDK

job = dtlaunch.init()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with (ledger_dir / f"{job.rank}-{attempt}.txt").open("a") as ledger:
    for step, batch in enumerate(job.batches()):
        if step == 3:
            grow("worker", job.rank)
        time.sleep(step_s)
        ledger.write(" ".join(map(str, batch)) + "\n")
        ledger.flush()
        job.step()
job.close()
print(f"rank {job.rank} finished after {job.step_count} steps", flush=True)
