"""A ps-lite style script: the same program runs as server and worker (DMLC_ROLE).
Writes its environment to OUT_DIR/<role>-<rank>.json. As with ps-lite, a worker
needs its servers: it finishes only once every server is up (has written its
file), and servers serve until the job stops them after the workers finished."""

import json
import os
import socket
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
role = os.environ["DMLC_ROLE"]
keys = [
    k for k in os.environ if k.startswith(("DMLC_", "DTLAUNCH_", "ROLE_", "RANK", "WORLD_SIZE"))
]
record = {k: os.environ[k] for k in keys} | {"hostname": socket.gethostname()}
(out / f"{role}-{os.environ['RANK']}.json").write_text(json.dumps(record))
print(f"{role} {os.environ['RANK']} up", flush=True)
if role == "server":
    while True:  # a parameter server serves until the job stops it
        time.sleep(0.2)
servers = int(os.environ["DMLC_NUM_SERVER"])
deadline = time.monotonic() + 120
while len(list(out.glob("server-*.json"))) < servers:  # a worker needs its servers
    if time.monotonic() > deadline:
        sys.exit(f"worker: only {len(list(out.glob('server-*.json')))} of {servers} servers up")
    time.sleep(0.05)
