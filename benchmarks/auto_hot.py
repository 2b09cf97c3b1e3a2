"""DLRover §4.2 / §5.4 on this machine: a hot parameter server, left alone and
handled by ``--policy auto``.

The job of ``benchmarks/auto.py`` (CPU-bound workers, built-in servers, BSP)
with two servers and a skewed model: besides the small linear model the
workers push a tensor of ``BIG`` floats and one of ``SMALL`` (5x fewer), each
one block, so the placement by bytes gives server 0 the big block and server
1 the rest, and server 0's updates cost about five times server 1's. Every
process runs under its host's CPU quota (``cpus / slots``, a cgroup): on the
servers' host 0.125 core each, so server 0 is hot (held by its quota) while
server 1 idles; the workers' host gives 0.25 each; a spare host declares half
a core for one slot. The hosts declare 2 cores in all, the machine's.

Columns, run one after the other in one invocation, the same job and workers:

    none    --policy none: the hot server stays where it is (doing nothing)
    auto    --policy auto (max_workers=2: the same workers): sample, optimize,
            adjust; a hot server (at 90 % of its quota, or throttled by it in 15 %
            of its CPU periods) is moved to the spare host with a fresh process,
            its blocks handed over live

Reported per column: JCT (first to last step report), the training
throughput, each server's mean CPU use against its quota, and auto's
decisions; the ratio auto / none of the JCT (issue 16: "a hot server is
detected and fixed; JCT vs doing nothing is reported").

    python benchmarks/auto_hot.py [--out benchmarks/results/auto-hot.json] [--keep]
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

from benchmarks.auto import measure  # noqa: E402
from benchmarks.jobrun import loopback_sshd, timed_run  # noqa: E402

ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
SCRIPT = REPO / "tests" / "scripts" / "ps_cpu_worker.py"
BURN_S = 0.01
BIG, SMALL = 1_000_000, 200_000  # floats: 4 MB (one block) and a fifth of it
WORKERS = 2
RECORDS = 3000
# max_workers=2: the workers stay as they are, so the JCT difference is the hot
# server's move alone (sizing the workers is benchmarks/auto.py's question).
AUTO = "auto:sample_s=8,interval_s=10,l_trans=4,l_per=8,max_workers=2"


def hostfile(path: Path) -> Path:
    servers, workers, spare = ADDRESSES
    path.write_text(
        f"{servers} slots=4 servers=2 cpus=0.5\n{workers} slots=4 cpus=1\n"
        f"{spare} slots=1 cpus=0.5 spare\n"
    )
    return path


def run_column(name: str, policy: str, *, root: Path, env: dict[str, str]) -> dict[str, Any]:
    run_dir, out = root / name / "run", root / name / "out"
    out.mkdir(parents=True)
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "-H", str(hostfile(root / name / "hosts")),
        "--workers", str(WORKERS), "--servers", "2", "--run-dir", str(run_dir),
        "--dataset-size", str(RECORDS), "--shard-size", "40", "--global-batch", "8",
        "--output", "none", "--control-interval", "1", "--policy", policy,
        str(SCRIPT), str(out), str(BURN_S), f"{BIG},{SMALL}",
    ]  # fmt: skip
    code, output, wall = timed_run(argv, env, timeout_s=900, cwd=REPO)
    if code != 0:
        raise SystemExit(f"{name}: dtlaunch exited {code}\n{output[-3000:]}")
    result = measure(run_dir)
    result.update(name=name, policy=policy, wall_s=round(wall, 2), servers=server_use(run_dir))
    print(
        f"{name:>5}: JCT {result['jct_s']:7.1f} s, {result['throughput']:7.1f} samples/s, "
        f"servers {result['servers']}",
        flush=True,
    )
    return result


def server_use(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Per server: the hosts it ran on in order, and on each its mean CPU (cores,
    from the agents' ``resources`` samples while it was there) and its quota."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    where: dict[str, str] = {}  # server -> the host it runs on now
    use: dict[str, dict[str, Any]] = {}
    samples: dict[tuple[str, str], list[float]] = {}
    for e in events:
        proc_id = f"{e.get('role')}-{e.get('rank')}"
        if e["kind"] == "spawn" and e["role"] == "server":
            where[proc_id] = e["host"]
            entry = use.setdefault(proc_id, {"hosts": [], "cpu": {}, "quota": {}})
            if e["host"] not in entry["hosts"]:
                entry["hosts"].append(e["host"])
            entry["quota"][e["host"]] = e.get("cpu_limit", 0.0)
        elif e["kind"] == "moved" and e["role"] == "server":
            where[proc_id] = e["new_host"]  # its readings are the new process's from here
        elif e["kind"] == "resources":
            for proc, reading in e["procs"].items():
                if proc in where:
                    samples.setdefault((proc, where[proc]), []).append(reading[1] / 100.0)
    for proc_id, entry in use.items():
        entry["cpu"] = {
            host: round(statistics.fmean(samples.get((proc_id, host), [0.0])), 3)
            for host in entry["hosts"]
        }
    return dict(sorted(use.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/auto-hot.json")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    with loopback_sshd(ADDRESSES, name="auto-hot", keep=args.keep) as (_, root, env):
        none = run_column("none", "none", root=root, env=env)
        auto = run_column("auto", AUTO, root=root, env=env)
    moves = [d for d in auto["decisions"] if d["action"] == "KILL_RESTART"]
    checks = {
        "hot_server_moved": bool(moves),
        "auto_jct_vs_none": round(auto["jct_s"] / none["jct_s"], 3),
        "auto_throughput_vs_none": round(auto["throughput"] / none["throughput"], 3),
    }
    report = {
        "machine": "2 cores; loopback hosts: the servers' (cpus=0.5 slots=4: 0.125 core "
        "a process), the workers' (cpus=1 slots=4: 0.25), a spare (cpus=0.5 slots=1)",
        "workload": {
            "burn_s": BURN_S,
            "big_floats": BIG,
            "small_floats": SMALL,
            "workers": WORKERS,
            "records": RECORDS,
        },
        "auto_policy": AUTO,
        "none": none,
        "auto": auto,
        "checks": checks,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    rows = [
        "| column | workers (start -> end) | JCT s | samples/s | server CPU (cores) / quota |",
        "|---|---|---:|---:|---|",
    ]
    for label in ("none", "auto"):
        r = report[label]
        servers = "; ".join(
            f"{proc}: " + ", ".join(f"{h} {s['cpu'][h]:.2f}/{s['quota'][h]:g}" for h in s["cpu"])
            for proc, s in r["servers"].items()
        )
        end = r["final_workers"] or report["workload"]["workers"]
        rows.append(
            f"| {label} | {report['workload']['workers']} -> {end} | {r['jct_s']} | "
            f"{r['throughput']} | {servers} |"
        )
    checks = report["checks"]
    lines = [
        f"Machine: {report['machine']}. Workload: {report['workload']}.",
        f"auto: `{report['auto_policy']}`.",
        "",
        *rows,
        "",
        f"- hot server moved by auto: {checks['hot_server_moved']}",
        f"- auto's JCT / doing nothing: {checks['auto_jct_vs_none']}; throughput: "
        f"{checks['auto_throughput_vs_none']}x",
        "",
        "auto's decisions:",
        *(
            f"- {d['t']} s {d['action']} {d['count'] or ''}: {d['reason']}"
            for d in report["auto"]["decisions"]
        ),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
