"""DLRover Table 1 / Fig. 9 on this machine: ``--policy auto`` against static choices.

A PS job (built-in servers, BSP) whose workers are CPU-bound: every step burns
``BURN_S`` of CPU in a busy loop (``tests/scripts/ps_cpu_worker.py``) and pushes a
model of ``EXTRA`` floats, so the server's updates cost CPU in proportion to the
workers' pushes. Two loopback hosts declare ``cpus=1`` each (the machine's two
cores): every process runs under a CPU limit of its host's cores over its slots
(``cpus / slots``, a cgroup quota), as DLRover gives a pod its cores. The
emulation is real CPU, scaled to two cores: the cores are the machine's, the
hosts are loopback addresses.

Columns, run one after the other in one invocation:

    static N+M --workers N --servers M --policy none, for M = 1 (N = 1..7), M = 2
               (N = 2..6) and M = 3 (N = 3..5): the grid search over the 8 slots; the
               best is the one with the highest training throughput
    hand       the hand guess (--hand, default 4 workers and 1 server), a static column
    auto       --workers 1 --servers 1 --policy auto: sample, optimize (eq. 10-11,
               with the servers' count free), adjust

Reported per column: JCT (the training time, first to last step report), the
mean training throughput (samples/s), the processes' mean CPU use over the
cores declared, and their peak memory; for auto also the time until its
throughput first reached 90 % of the best static one (10 s windows), and its
decisions. Targets (issue 16): auto >= 90 % of the best static throughput, its
JCT within 10 % of the best static JCT and >= 20 % better than the hand guess.

    python benchmarks/auto.py [--quick] [--out benchmarks/results/auto.json] [--keep]

--quick: the grid is 1+1, 2+1, 4+1, 3+2 and a smaller data set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.jobrun import loopback_sshd, timed_run  # noqa: E402

ADDRESSES = ["127.0.0.2", "127.0.0.3"]
SCRIPT = REPO / "tests" / "scripts" / "ps_cpu_worker.py"
BURN_S = 0.01  # CPU a step burns (a worker's compute)
EXTRA = 400_000  # floats of the pushed model: the server's update work per push
WINDOW_S = 10.0  # throughput windows (time to 90 %)
AUTO = "auto:sample_s=8,interval_s=10,l_trans=4,l_per=8"


def hostfile(path: Path) -> Path:
    a0, a1 = ADDRESSES
    path.write_text(f"{a0} slots=4 servers=1 cpus=1\n{a1} slots=4 cpus=1\n")
    return path


def run_column(
    name: str,
    workers: int,
    policy: str,
    *,
    root: Path,
    env: dict[str, str],
    records: int,
    servers: int = 1,
) -> dict[str, Any]:
    run_dir, out = root / name / "run", root / name / "out"
    out.mkdir(parents=True)
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "-H", str(hostfile(root / name / "hosts")),
        "--workers", str(workers), "--servers", str(servers), "--run-dir", str(run_dir),
        "--dataset-size", str(records), "--shard-size", "40", "--global-batch", "8",
        "--output", "none", "--control-interval", "1", "--policy", policy,
        str(SCRIPT), str(out), str(BURN_S), str(EXTRA),
    ]  # fmt: skip
    code, output, wall = timed_run(argv, env, timeout_s=900, cwd=REPO)
    if code != 0:
        raise SystemExit(f"{name}: dtlaunch exited {code}\n{output[-3000:]}")
    result = measure(run_dir)
    result.update(
        name=name,
        start_workers=workers,
        start_servers=servers,
        policy=policy,
        wall_s=round(wall, 2),
    )
    if result["final_workers"] is None:  # no scale: the workers it started with
        result["final_workers"] = workers
    if result["final_servers"] is None:
        result["final_servers"] = servers
    print(
        f"{name:>9}: JCT {result['jct_s']:7.1f} s, {result['throughput']:7.1f} samples/s, "
        f"CPU {result['cpu_use']:.0%} of the declared cores, workers {result['final_workers']}, "
        f"servers {result['final_servers']}",
        flush=True,
    )
    return result


def measure(run_dir: Path) -> dict[str, Any]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    steps: list[tuple[float, int]] = []  # (step end, samples)
    for e in events:
        if e["kind"] == "reports":
            steps += zip(e["t"], e["samples"], strict=True)
    steps.sort()
    first, last = steps[0][0], steps[-1][0]
    samples = sum(n for _, n in steps)
    windows: list[tuple[float, float]] = []  # (window end, samples/s)
    t = first
    while t < last:
        n = sum(s for at, s in steps if t <= at < t + WINDOW_S)
        windows.append((round(t + WINDOW_S - first, 1), round(n / WINDOW_S, 2)))
        t += WINDOW_S / 2
    cpu, rss = [], 0
    for e in events:
        if e["kind"] == "resources":
            procs = e["procs"].values()
            cpu.append(sum(p[1] for p in procs) / 100.0)
            rss = max(rss, sum(p[0] for p in procs))
    scales = [e["workers"] for e in events if e["kind"] == "scale"]
    server_scales = [e["servers"] for e in events if e["kind"] == "scale_servers"]
    decisions = [
        {
            "t": round(e["mono"], 1),
            "action": e["action"],
            "count": e.get("count"),
            "reason": e.get("reason", ""),
            "inputs": e.get("inputs", {}),
        }
        for e in events
        if e["kind"] == "decision" and e.get("action") not in (None, "NONE")
    ]
    return {
        "jct_s": round(last - first, 2),
        "throughput": round(samples / max(last - first, 1e-9), 2),
        "windows": windows,
        "cpu_use": round(statistics.fmean(cpu) / 2.0, 3) if cpu else 0.0,
        "peak_rss_mb": round(rss / 2**20, 1),
        "final_workers": scales[-1] if scales else None,
        "final_servers": server_scales[-1] if server_scales else None,
        "decisions": decisions,
    }


def time_to(result: dict[str, Any], rate: float) -> float | None:
    return next((t for t, r in result["windows"] if r >= rate), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hand", type=int, default=4, help="workers of the hand guess")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/auto.json")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.quick:
        grid = [(1, 1), (2, 1), (4, 1), (3, 2)]
    else:
        grid = [(n, m) for m, workers in ((1, range(1, 8)), (2, range(2, 7)), (3, range(3, 6)))
                for n in workers]  # fmt: skip
    records = 2400 if args.quick else 6000
    with loopback_sshd(ADDRESSES, name="auto", keep=args.keep) as (_, root, env):
        static = {
            f"{n}+{m}": run_column(
                f"static-{n}+{m}", n, "none", root=root, env=env, records=records, servers=m
            )
            for n, m in grid
        }
        hand = static.get(f"{args.hand}+1") or run_column(
            "hand", args.hand, "none", root=root, env=env, records=records
        )
        auto = run_column("auto", 1, AUTO, root=root, env=env, records=records)
    best_n = max(static, key=lambda n: static[n]["throughput"])
    best = static[best_n]
    reached = time_to(auto, 0.9 * best["throughput"])
    checks = {
        "auto_throughput_vs_best": round(auto["throughput"] / best["throughput"], 3),
        "auto_jct_vs_best": round(auto["jct_s"] / best["jct_s"], 3),
        "auto_jct_vs_hand": round(auto["jct_s"] / hand["jct_s"], 3),
        "auto_time_to_90pct_s": reached,
    }
    targets = {
        "auto_throughput_vs_best >= 0.90": checks["auto_throughput_vs_best"] >= 0.90,
        "auto_jct_vs_best <= 1.10": checks["auto_jct_vs_best"] <= 1.10,
        "auto_jct_vs_hand <= 0.80": checks["auto_jct_vs_hand"] <= 0.80,
    }
    report = {
        "machine": "2 cores; 2 loopback hosts declaring cpus=1 slots=4 (each process "
        "limited to 0.25 core); built-in servers",
        "workload": {"burn_s": BURN_S, "extra_floats": EXTRA, "records": records},
        "auto_policy": AUTO,
        "best_static": best_n,
        "hand_workers": args.hand,
        "static": static,
        "hand": hand,
        "auto": auto,
        "checks": checks,
        "targets": targets,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    rows = [
        "| column | workers (start -> end) | servers (start -> end) | JCT s | samples/s "
        "| CPU use of declared | peak RSS MB |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    columns = [(f"static {n}", r) for n, r in report["static"].items()]
    if report["hand"]["name"] == "hand":
        columns.append(("hand", report["hand"]))
    columns.append(("auto", report["auto"]))
    for label, r in columns:
        rows.append(
            f"| {label} | {r['start_workers']} -> {r['final_workers']} | "
            f"{r['start_servers']} -> {r['final_servers']} | "
            f"{r['jct_s']} | {r['throughput']} | {r['cpu_use']:.0%} | {r['peak_rss_mb']} |"
        )
    checks = report["checks"]
    lines = [
        f"Machine: {report['machine']}. Workload: {report['workload']}.",
        f"Best static: {report['best_static']} (workers+servers); hand guess: "
        f"{report['hand_workers']} workers and 1 server; auto: `{report['auto_policy']}` "
        "from 1 worker and 1 server.",
        "",
        *rows,
        "",
        f"- auto's throughput / best static: {checks['auto_throughput_vs_best']}",
        f"- auto's JCT / best static: {checks['auto_jct_vs_best']}; / hand guess: "
        f"{checks['auto_jct_vs_hand']}",
        f"- auto reached 90 % of the best static throughput after "
        f"{checks['auto_time_to_90pct_s']} s of training",
        "- targets: "
        + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in report["targets"].items()),
        "",
        "auto's decisions:",
        *(
            f"- {d['t']} s {d['action']} {d['count']}: {d['reason']}"
            for d in report["auto"]["decisions"]
        ),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
