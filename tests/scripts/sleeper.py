"""A long-running 'training' process that also starts a grandchild, and records
both pids (with create times) so a test can prove nothing is left behind.

    sleeper.py OUT_DIR [SECONDS [TICK_S]]   TICK_S: print a line that often"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

out_dir = Path(sys.argv[1])
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
tick_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
me = psutil.Process()
record = {
    "rank": int(os.environ["RANK"]),
    "attempt": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    "pids": [[me.pid, me.create_time()], [child.pid, psutil.Process(child.pid).create_time()]],
}
path = out_dir / f"{os.environ['ROLE_NAME']}-{record['rank']}-{record['attempt']}.json"
path.write_text(json.dumps(record))
print(f"sleeping {seconds}s as pid {me.pid}", flush=True)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    time.sleep(tick_s or 0.2)
    if tick_s:
        print("tick", flush=True)
child.kill()
child.wait()
