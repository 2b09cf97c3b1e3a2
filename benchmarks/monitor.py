"""Monitor benchmark: the columnar windows against the plain loops they replaced.

The straggler Monitor's ``snapshot`` runs on the supervisor's event loop at every
policy decision. Before ``dtlaunch/supervisor/control/windows.py`` it recomputed
every window statistic with Python loops over every report (seconds at 1,000
workers); the old code is kept as ``OracleMonitor`` in
``tests/test_monitor_scale.py`` and timed here side by side with the Monitor.

Load (the issue's): N workers x S steps each at 10 steps/s (t = step / 10),
batch 32, compute ~0.08 s +-5 %, every 100th worker 1.6x slower, windows of the
``nd`` policy (``monitor_for(NdPolicy({}))``: l_trans 60 s, l_per 300 s). For
N in {10, 100, 1000} and S in {900, 3000} it reports

* ``report_worker``: CPU microseconds per call while feeding all reports;
* ``snapshot(now)``: CPU milliseconds, best and median of several calls;
* whether both give the same snapshot (``equal``: every field within 1e-9).

Target: snapshot <= 50 ms at 1,000 x 3,000 (idle 2-core machine), report_worker
no slower than before. CPU time (``time.process_time``) is reported, so a busy
machine inflates the numbers less than wall time; ``uptime``'s load is recorded.

    python benchmarks/monitor.py [--out benchmarks/results/monitor.json] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from dtlaunch.supervisor.control.monitor import Monitor
from dtlaunch.supervisor.control.policies import monitor_for
from dtlaunch.supervisor.control.policies.nd import NdPolicy

ROOT = Path(__file__).resolve().parent.parent
WORKERS = (10, 100, 1_000)
STEPS = (900, 3_000)
SNAPSHOTS = 5
TARGET_MS = 50.0


def _oracle_module() -> Any:
    path = ROOT / "tests" / "test_monitor_scale.py"
    spec = importlib.util.spec_from_file_location("monitor_oracle", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _measure(mon: Any, oracle: Any, workers: int, steps: int) -> tuple[dict[str, Any], Any]:
    start = time.process_time()
    now = oracle.feed_scale(mon, workers, steps)
    feed_s = time.process_time() - start
    times, snap = [], None
    for _ in range(1 if isinstance(mon, oracle.OracleMonitor) and workers >= 1000 else SNAPSHOTS):
        gc.collect()
        start = time.process_time()
        snap = mon.snapshot(now)
        times.append(time.process_time() - start)
    result = {
        "report_worker_us": 1e6 * feed_s / (workers * steps),
        "snapshot_ms_best": 1e3 * min(times),
        "snapshot_ms_median": 1e3 * statistics.median(times),
        "snapshots": len(times),
    }
    return result, snap


def run(workers: int, steps: int, oracle: Any) -> dict[str, Any]:
    policy = NdPolicy({})
    row: dict[str, Any] = {"workers": workers, "steps": steps, "reports": workers * steps}
    new = monitor_for(policy)
    row["new"], new_snap = _measure(new, oracle, workers, steps)
    old = oracle.OracleMonitor(l_trans=policy.l_trans, l_per=policy.l_per)
    row["old"], old_snap = _measure(old, oracle, workers, steps)
    row["differences"] = oracle.differences(new_snap, old_snap)
    row["equal"] = not row["differences"]
    row["snapshot_speedup"] = row["old"]["snapshot_ms_best"] / row["new"]["snapshot_ms_best"]
    row["report_worker_ratio"] = row["new"]["report_worker_us"] / row["old"]["report_worker_us"]
    del new, old, new_snap, old_snap
    gc.collect()
    return row


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Monitor benchmark",
        "",
        f"`python benchmarks/monitor.py`, {result['date']}, {result['machine']}, "
        f"load before: {result['load_before']}, after: {result['load_after']}.",
        f"Windows of `nd` (l_trans {result['l_trans']:g} s, l_per {result['l_per']:g} s); "
        "CPU time. Old: the plain loops (`OracleMonitor` in tests/test_monitor_scale.py).",
        "",
        "| workers | steps | reports | snapshot old ms | snapshot new ms | speed-up "
        "| report_worker old µs | new µs | equal |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:--|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['workers']:,} | {row['steps']:,} | {row['reports']:,} "
            f"| {row['old']['snapshot_ms_best']:.1f} | {row['new']['snapshot_ms_best']:.2f} "
            f"| {row['snapshot_speedup']:.0f}x | {row['old']['report_worker_us']:.2f} "
            f"| {row['new']['report_worker_us']:.2f} | {'yes' if row['equal'] else 'NO'} |"
        )
    lines += [
        "",
        f"Target: snapshot <= {TARGET_MS:g} ms at 1,000 x 3,000: "
        + ("met" if result["target_met"] else "NOT met")
        + f" ({result['new_ms_at_target']:.1f} ms).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/monitor.json")
    parser.add_argument("--quick", action="store_true", help="only N = 10, 100 (writes no file)")
    args = parser.parse_args()
    oracle = _oracle_module()
    policy = NdPolicy({})
    assert isinstance(monitor_for(policy), Monitor)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "l_trans": policy.l_trans,
        "l_per": policy.l_per,
        "rows": [],
    }
    for workers in WORKERS[:2] if args.quick else WORKERS:
        for steps in STEPS:
            row = run(workers, steps, oracle)
            result["rows"].append(row)
            print(
                f"{workers:>5} x {steps:>5}: snapshot old {row['old']['snapshot_ms_best']:9.1f} ms"
                f"  new {row['new']['snapshot_ms_best']:7.2f} ms ({row['snapshot_speedup']:5.0f}x)"
                f"  report_worker old {row['old']['report_worker_us']:.2f} us"
                f"  new {row['new']['report_worker_us']:.2f} us  equal {row['equal']}",
                flush=True,
            )
    result["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    at_target = [r for r in result["rows"] if r["workers"] == 1000 and r["steps"] == 3000]
    result["new_ms_at_target"] = at_target[0]["new"]["snapshot_ms_best"] if at_target else None
    result["target_met"] = bool(at_target) and result["new_ms_at_target"] <= TARGET_MS
    out = args.out or (None if args.quick else ROOT / "benchmarks/results/monitor.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        if at_target:
            out.with_suffix(".md").write_text(_markdown(result))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
