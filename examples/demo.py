"""``make demo``: what dtlaunch does that torchrun does not, in about a minute.

The same data-parallel job runs twice on this machine, one after the other: four
workers train a small linear model with a real gloo allreduce, reading their
records through dtlaunch's dynamic data sharding, and worker 3 is made three
times slower than the others (``--inject slowdown``, as a slow GPU or a busy host
would be). With ``--policy none`` every step waits for worker 3, as under torchrun
(BSP). With ``--policy nd`` dtlaunch sees worker 3 fall behind from its step
reports and gives it a smaller share of each global batch (AntDT's ADJUST_BS),
keeping the global batch and the gradient mean the same. At the end a table
compares the two runs and says where their run directories and plots are.

    python examples/demo.py [--workers 4] [--steps 60] [--keep-going]

While a run is going, ``dtlaunch status RUN_DIR`` in another terminal shows it live.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import dtlaunch

REPO = Path(__file__).resolve().parent.parent
SYNTHETIC = REPO / "examples" / "synthetic.py"
SLOW_RANK_FACTOR = 3  # worker 3 computes 3x slower
CAPACITY = 160  # samples/s of a normal worker: 16 records take 0.1 s
# nd on a short job: short windows (1 s transient, 3 s persistent), a plan two steps
# ahead, and no replacement (there is no spare host in embedded mode; the slowness
# is bound to rank 3 wherever it runs, so a restart could not help).
ND_POLICY = "nd:l_trans=1,l_per=3,apply_after=2,margin=0.02,min_batch=2,restart_cost=1000"

console = Console()


@dataclass(frozen=True)
class Outcome:
    label: str
    policy: str
    run_dir: Path
    summary: dict[str, Any]
    train_s: float | None
    plot: Path | None


def run_once(label: str, policy: str, args: argparse.Namespace, runs: Path) -> Outcome:
    run_dir = runs / f"demo-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    global_batch = 16 * args.workers
    status = Path(sys.executable).parent / "dtlaunch"
    console.rule(f"[bold]{label}[/]: --policy {policy.split(':')[0]}")
    console.print(f"watch it live in another terminal: {_short(status)} status {_short(run_dir)}")
    result = dtlaunch.launch(
        str(SYNTHETIC),
        [
            "--dataset-size", str(args.steps * global_batch), "--global-batch", str(global_batch),
            "--shard-size", "64", "--capacity", str(CAPACITY), "--prefetch", "1",
        ],
        workers=args.workers,
        policy=policy,
        control_interval=0.25,
        inject=[f"slowdown:role=worker,ranks={args.workers - 1},factor={SLOW_RANK_FACTOR}"],
        env=["OMP_NUM_THREADS=1"],
        run_dir=run_dir,
        output="0",
    )  # fmt: skip
    return Outcome(
        label,
        policy,
        result.run_dir,
        result.summary,
        _train_seconds(result.run_dir),
        _plot(result.run_dir),
    )


def _plot(run_dir: Path) -> Path | None:
    """``dtlaunch replay RUN_DIR --plot``; None when matplotlib is not installed."""
    out = run_dir / "timeline.png"
    done = subprocess.run(
        [sys.executable, "-m", "dtlaunch", "replay", str(run_dir), "--plot", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return out if done.returncode == 0 and out.exists() else None


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def compare(bsp: Outcome, nd: Outcome) -> Table:
    table = Table(title="dtlaunch demo: the same job, one worker 3x slower", title_justify="left")
    table.add_column("")
    for outcome in (bsp, nd):
        table.add_column(f"{outcome.label} (--policy {outcome.policy.split(':')[0]})")

    def row(name: str, value: Any) -> None:
        table.add_row(name, *(str(value(o)) for o in (bsp, nd)))

    row("job time (JCT)", lambda o: f"{o.summary['jct_s']:.1f} s")
    row("training time", lambda o: f"{o.train_s:.1f} s" if o.train_s else "?")
    row("records trained", lambda o: f"{o.summary['records_total']:,}")
    row("shards done", lambda o: f"{o.summary['shards_done']}/{o.summary['shards_total']}")
    row("actions taken", lambda o: _actions(o.summary) or "none")
    return table


def _train_seconds(run_dir: Path) -> float | None:
    """Rank 0's ``synthetic: ... train_s=S`` (from its first step to the end)."""
    found = re.search(r"synthetic: .*\btrain_s=([0-9.]+)", _read(run_dir / "logs" / "worker-0.log"))
    return float(found.group(1)) if found else None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _actions(summary: dict[str, Any]) -> str:
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(summary.get("actions", {}).items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="workers (the last is slow)")
    parser.add_argument("--steps", type=int, default=60, help="global steps of each run")
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where run dirs go")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.steps < 10:
        parser.error("--workers must be at least 2 and --steps at least 10")
    bsp = run_once("bsp", "none", args, args.runs.absolute())
    nd = run_once("nd", ND_POLICY, args, args.runs.absolute())
    console.print()
    console.print(compare(bsp, nd))
    for outcome in (bsp, nd):
        plot = _short(outcome.plot) if outcome.plot else "none (pip install 'dtlaunch[plot]')"
        console.print(f"{outcome.label}: run dir {_short(outcome.run_dir)}  plot {plot}")
    speedup = bsp.summary["jct_s"] / nd.summary["jct_s"]
    records = f"{nd.summary['records_total']:,} records"
    if speedup >= 1.05:
        verdict = f"nd trained the same {records} {speedup:.2f}x faster"
    else:  # start-up and detection are most of a very short run
        verdict = f"nd trained the same {records}, no faster in a run this short (x{speedup:.2f})"
    console.print(
        f"{verdict}: it gives worker {args.workers - 1} a smaller share of every batch "
        "instead of waiting for it. `dtlaunch replay RUN_DIR` tells each run's story."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
