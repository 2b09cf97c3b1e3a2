"""What one live ``dtlaunch status`` answer costs the supervisor at N workers: fold
the nodes into a StatusSnapshot, encode the reply, and (the client's share) decode
it; issue 18's target is a 1,000-row status in 200 ms end to end.

Side by side: this checkout against another one (``--baseline-ref``, default the
commit before the snapshot work), each in its own interpreter, rounds alternating;
each round is the fastest of ``--reps`` answers over the same folded events (the
least disturbed by the machine's other work), the figure the median of the rounds.

    python benchmarks/status_snapshot.py                 # N = 100, 1000
    python benchmarks/status_snapshot.py --quick         # N = 1000, fewer rounds

Results: ``benchmarks/results/status_snapshot.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
BASELINE_REF = "bb04160"  # session 28's start: before the codec fast paths and the budget

# Runs inside the checkout under test (its path first on sys.path): prints one JSON line.
MEASURE = r"""
import json, statistics, sys, time
from dtlaunch.events import Event
from dtlaunch.supervisor.status.fold import StatusFold
from dtlaunch.wire.codec import decode, encode
from dtlaunch.wire.messages import StatusReply

n, reps = int(sys.argv[1]), int(sys.argv[2])
fold = StatusFold(run_id="r", policy="nd", mode="allreduce")
t = 0.0
for rnd in range(60):  # 60 report batches a worker: more than the 40 points kept
    for r in range(n):
        t += 1e-4
        fold.emit(Event(kind="reports", mono=t, wall=t, role="worker", rank=r, host=f"h{r}",
                        data={"compute_s": [0.09 + r * 1e-5] * 10, "comm_s": [0.01] * 10,
                              "batch_size": [32] * 10, "t": [t]}))
states = {("worker", r): (f"h{r}", "running", 0) for r in range(n)}
times, size = [], 0
for _ in range(reps + 2):
    began = time.perf_counter()
    snap = fold.snapshot(now=t, source="live", stragglers={}, states=states,
                         shards=(5, 10), phase="running")
    frame = encode(StatusReply(request_id=1, snapshot=snap))
    decode(frame)
    times.append(time.perf_counter() - began)
    size = len(frame)
print(json.dumps({"best_ms": min(times[2:]) * 1e3, "frame_kb": size / 1e3}))
"""


def measure(checkout: Path, n: int, reps: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(checkout)!r})\n" + MEASURE,
         str(n), str(reps)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="N = 1000, 3 rounds of 7")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds, args.reps = "1000", 3, 7
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline),
             args.baseline_ref], check=True, capture_output=True,
        )  # fmt: skip
        try:
            rows = []
            for n in sizes:
                runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
                for _ in range(args.rounds):  # alternating: drift hits both alike
                    runs["baseline"].append(measure(baseline, n, args.reps))
                    runs["this"].append(measure(REPO, n, args.reps))
                base = statistics.median(r["best_ms"] for r in runs["baseline"])
                this = statistics.median(r["best_ms"] for r in runs["this"])
                rows.append({
                    "workers": n, "baseline_ms": round(base, 1), "this_ms": round(this, 1),
                    "speedup": round(base / this, 2),
                    "baseline_frame_kb": round(runs["baseline"][-1]["frame_kb"], 1),
                    "this_frame_kb": round(runs["this"][-1]["frame_kb"], 1),
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)],
                check=False, capture_output=True,
            )  # fmt: skip
    if not args.quick:
        write_results(rows, args)
    return 0


def write_results(rows: list[dict[str, float]], args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    (RESULTS / "status_snapshot.json").write_text(
        json.dumps({"when": stamp, "baseline_ref": args.baseline_ref, "rows": rows}, indent=1)
    )
    lines = [
        "# Status answer: fold + encode + decode (benchmarks/status_snapshot.py)",
        "",
        f"{stamp}; this checkout against `{args.baseline_ref}`, {args.rounds} alternating "
        f"rounds (the median of them), each the fastest of {args.reps} answers; 60 report "
        "batches per worker.",
        "",
        "| workers | baseline | this | speed-up | frame before | frame now |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['workers']} | {r['baseline_ms']} ms | {r['this_ms']} ms | {r['speedup']}x "
            f"| {r['baseline_frame_kb']} kB | {r['this_frame_kb']} kB |"
            for r in rows
        ),
        "",
    ]
    (RESULTS / "status_snapshot.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
