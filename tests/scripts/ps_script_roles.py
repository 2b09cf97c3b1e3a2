"""A torch-free ps-lite style script for ``--ps-server script``: the same program runs as
server and as worker (DMLC_ROLE). usage: ps_script_roles.py OUT_DIR

Each process writes OUT_DIR/<role>-<rank>.json (its DMLC_* variables, and whether torch
is loaded). A server then serves until the job stops it; a worker first waits for every
server's file, so the job only ends once its servers really ran.
"""

import json
import os
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
role = os.environ["DMLC_ROLE"]
rank = os.environ["RANK"]
record = {k: v for k, v in os.environ.items() if k.startswith("DMLC_")}
record["torch_loaded"] = "torch" in sys.modules
path = out / f"{role}-{rank}.json"
path.with_suffix(".tmp").write_text(json.dumps(record))
path.with_suffix(".tmp").rename(path)  # a reader never sees half a file
print(f"{role} {rank} up", flush=True)
if role == "server":
    while True:  # a parameter server serves until the job stops it
        time.sleep(0.2)
servers = int(os.environ["DMLC_NUM_SERVER"])
deadline = time.monotonic() + 60
while not all((out / f"server-{s}.json").exists() for s in range(servers)):
    if time.monotonic() > deadline:
        sys.exit(f"worker {rank}: no server wrote its file within 60 s")
    time.sleep(0.05)
print(f"worker {rank} saw {servers} server(s)", flush=True)
