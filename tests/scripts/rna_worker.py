"""A regression trained through ``dtlaunch.rna.Trainer``, the same script under
``--policy rna``, ``--policy none`` and standalone.

argv: OUT_DIR [SLEEP_S] [SLOW_RANKS] [SLOW_SLEEP_S]. Every step sleeps SLEEP_S
(SLOW_SLEEP_S on the comma-separated SLOW_RANKS) to stand for compute. Writes
OUT_DIR/<rank>.json: the model version and a digest of the parameters after
each step (in one group, equal versions must hold equal models on every
worker), the final loss and the records this worker trained; and
OUT_DIR/pid-<rank>-<restart count> at start. A restarted worker waits, before it
joins the group, for as long as OUT_DIR/hold-restarts exists (a test's gate: the
survivors' group without it is then certain to form first).
Standalone, RNA_STANDALONE_RECORDS gives the data set's size.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import dtlaunch

DIM = 8
TRUE_W = torch.arange(1.0, DIM + 1.0) / DIM


X_ALL = torch.randn(8000, DIM, generator=torch.Generator().manual_seed(12345))


def records(idx):
    return X_ALL[idx], X_ALL[idx] @ TRUE_W


def digest(model):
    data = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main():
    out = Path(sys.argv[1])
    sleep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    slow_ranks = {int(r) for r in sys.argv[3].split(",")} if len(sys.argv) > 3 else set()
    slow_sleep = float(sys.argv[4]) if len(sys.argv) > 4 else sleep_s
    standalone = int(os.environ.get("RNA_STANDALONE_RECORDS", "0"))
    if standalone:  # python script.py: the data set comes from here
        job = dtlaunch.init(dataset_size=standalone, shard_size=100, global_batch=20)
    else:
        job = dtlaunch.init()
    (out / f"pid-{job.rank}-{job.restart_count}").write_text(str(os.getpid()))
    hold = out / "hold-restarts"
    deadline = time.monotonic() + 120
    while job.restart_count > 0 and hold.exists():
        if time.monotonic() > deadline:
            sys.exit(f"restart held for 120 s: the test never removed {hold}")
        time.sleep(0.05)
    torch.manual_seed(job.rank)  # unequal starts: the group's first state sync evens them
    model = torch.nn.Linear(DIM, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    rna = dtlaunch.rna.Trainer(model, optimizer)
    versions = {}
    trained = 0
    for idx in job.bsp_batches():  # under rna: job.batches()
        if idx:  # a synchronous step may have nothing for this worker: it still joins
            x, y = records(idx)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
            loss.backward()
        time.sleep(slow_sleep if job.rank in slow_ranks else sleep_s)
        rna.step()
        job.step()
        trained += len(idx)
        versions[str(rna.version)] = digest(model)
    rna.close()
    x, y = records(list(range(len(X_ALL))))
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x).squeeze(-1), y).item()
    result = {
        "rank": job.rank,
        "mode": rna.mode,
        "rounds": rna.rounds,
        "version": rna.version,
        "versions": versions,
        "final_digest": digest(model),
        "final_loss": final,
        "records": trained,
        "pid": os.getpid(),
    }
    (out / f"{job.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
