"""Straggler patterns users meet beyond AntDT's Table III (issue 13): the scenario matrix.

``python benchmarks/stragglers.py --scenarios`` (or this file) runs, one after the
other on this machine, examples/synthetic.py under dtlaunch on loopback hosts
(127.0.0.2-9, spares 127.0.0.10-11, one real sshd) for each scenario below, in
the columns none (plain BSP), lb-bsp, nd and ideal (the same hosts without the
slowness; one run per host layout, shared by its scenarios).

Slowness is injected as AntDT does (``--inject``): *fixed* is a delay added to
every step whatever the batch (contention, a slow local disk), *proportional* a
``slowdown`` factor on the step's compute (a slower device). Times are scaled as
in ``benchmarks/stragglers.py``: a step of 32 records at 120 records/s is 0.27 s;
a fixed slowness of 0.32 s a step is AntDT's persistent straggler at intensity
0.8 divided by 10.

Targets (the issue's acceptance): every scenario whose spare hosts can take all
the slow processes, nd <= 1.15x ideal; scenarios where nothing can help (no
spare host), nd <= 1.02x none. The others are reported only.

    python benchmarks/straggler_scenarios.py [--quick] [--only NAME,...] [--out F.json] [--keep]

--quick: shorter jobs (not held to the targets). Writes JSON and a Markdown table
(benchmarks/results/stragglers-scenarios[.quick].{json,md}).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.jobrun import loopback_sshd, timed_run  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SYNTHETIC = REPO / "examples" / "synthetic.py"
HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 10))
SPARES = ("127.0.0.10", "127.0.0.11")
COLUMNS = ("none", "lb-bsp", "nd", "ideal")
TARGET_ND_VS_IDEAL = 1.15  # a spare host can take every slow process
TARGET_ND_VS_NONE = 1.02  # nothing can help: nd must not make it worse
RUN_TIMEOUT_S = 600.0
FIXED_S = 0.32  # AntDT's persistent 4 s x intensity 0.8, scaled down 10x
FACTOR = 2.2  # proportional: the same step time as the fixed delay at batch 32
# The job: 4 or 8 workers, 32 records each a step at 120 records/s. nd decides
# from windows of a few steps and replaces a straggler whose gain over the
# remaining steps beats the restart cost (a replacement imports torch: ~4 s).
CAPACITY = 120.0
PER_WORKER_BATCH = 32
CONTROL_INTERVAL_S = 0.25
ND = (
    "nd:lambda=1.5,l_trans=1,l_per=3,apply_after=2,margin=0.02,min_batch=2,"
    "restart_cost=4,cooldown=10"
)
LB_BSP = "lb-bsp:l_trans=1,l_per=3,apply_after=2,margin=0.02,min_batch=2"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One straggler pattern: the hostfile, the injection, and what can help."""

    name: str
    what: str
    layout: str  # the host layout, shared with the ideal run
    hostfile: tuple[str, ...]
    injections: tuple[str, ...]
    target: str = ""  # "ideal" (a spare can take every slow process), "none", or ""

    @property
    def workers(self) -> int:
        return sum(_slots(line) for line in self.hostfile if "spare" not in line.split())


def _slots(line: str) -> int:
    for word in line.split():
        if word.startswith("slots="):
            return int(word.removeprefix("slots="))
    return 1


def _ones(n: int) -> tuple[str, ...]:
    return tuple(f"{h} slots=1" for h in HOSTS[:n])


def cases(start_s: float) -> list[Case]:
    """The matrix. ``start_s``: when training starts, about (start-up included),
    for the straggler that appears mid-run and the host that recovers."""
    h = HOSTS
    spare1 = (f"{SPARES[0]} slots=1 spare",)
    mid, recover = start_s + 10, start_s + 12
    return [
        Case(name="one-slow-worker", what="one slow host of four, one worker each (Table III's)",
             layout="4x1", hostfile=_ones(4) + spare1,
             injections=(f"persistent:hosts={h[3]},delay={FIXED_S}",), target="ideal"),
        Case(name="proportional", what="one worker 2.2x slower per record (a slower device)",
             layout="4x1", hostfile=_ones(4) + spare1,
             injections=(f"slowdown:hosts={h[3]},factor={FACTOR}",), target="ideal"),
        Case(name="slow-host-2", what="a slow host with 2 workers, a 2-slot spare",
             layout="2x2", hostfile=(f"{h[0]} slots=2", f"{h[1]} slots=2",
                                     f"{SPARES[0]} slots=2 spare"),
             injections=(f"persistent:hosts={h[1]},delay={FIXED_S}",), target="ideal"),
        Case(name="slow-host-4", what="a slow host with 4 workers, a 4-slot spare",
             layout="2x4", hostfile=(f"{h[0]} slots=4", f"{h[1]} slots=4",
                                     f"{SPARES[0]} slots=4 spare"),
             injections=(f"persistent:hosts={h[1]},delay={FIXED_S}",), target="ideal"),
        Case(name="two-slow-hosts", what="two slow hosts of four, one 1-slot spare",
             layout="4x1", hostfile=_ones(4) + spare1,
             injections=(f"persistent:hosts={h[2]},{h[3]},delay={FIXED_S}",)),
        Case(name="appears-mid-run", what=f"a host turns slow {mid:.0f} s after launch",
             layout="4x1", hostfile=_ones(4) + spare1,
             injections=(f"persistent:hosts={h[3]},delay={FIXED_S},after={mid:g}",),
             target="ideal"),
        Case(name="recovers", what=f"a slow host that recovers {recover:.0f} s after launch",
             layout="4x1", hostfile=_ones(4) + spare1,
             injections=(f"persistent:hosts={h[3]},delay={FIXED_S},until={recover:g}",)),
        Case(name="no-spare", what="one slow host, no spare host: nothing can move",
             layout="4x1", hostfile=_ones(4),
             injections=(f"persistent:hosts={h[3]},delay={FIXED_S}",), target="none"),
    ]  # fmt: skip


@dataclass(slots=True)
class Outcome:
    case: str
    column: str
    ok: bool
    train_s: float | None  # rank 0's loop: the paper's JCT
    wall_s: float
    detail: dict[str, Any] = field(default_factory=dict)


def run_job(case: Case, column: str, *, steps: int, cluster: Cluster) -> Outcome:
    """One job of ``case`` (its hosts) under ``column`` (ideal: without the slowness)."""
    policy = {"nd": ND, "lb-bsp": LB_BSP}.get(column, "none")
    workers = case.workers
    hostfile = cluster.hostfile(case)
    run_dir = cluster.work / f"{case.name}-{column}-{time.monotonic_ns()}"
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "-H", str(hostfile),
        "--workers", str(workers), "--run-dir", str(run_dir), "--output", "none",
        "--policy", policy, "--control-interval", f"{CONTROL_INTERVAL_S:g}",
        "--env", "OMP_NUM_THREADS=1", "--workdir", str(REPO),
    ]  # fmt: skip
    if column != "ideal":
        for spec in case.injections:
            argv += ["--inject", spec]
    batch = PER_WORKER_BATCH * workers
    argv += [
        str(SYNTHETIC), "--dataset-size", str(steps * batch), "--shard-size", "64",
        "--global-batch", str(batch), "--capacity", f"{CAPACITY:g}", "--seed", "7",
        "--prefetch", "1",
    ]  # fmt: skip
    code, output, wall = timed_run(argv, cluster.env, timeout_s=RUN_TIMEOUT_S, cwd=REPO)
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((run_dir / "summary.json").read_text())
    train: float | None = None
    for log in sorted((run_dir / "logs").glob("worker-0*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("synthetic: ") and "train_s=" in line:
                train = float(line.split("train_s=")[1].split()[0])
    ok = code == 0 and summary.get("status") == "succeeded" and train is not None
    detail: dict[str, Any] = {
        "policy": policy,
        "actions": summary.get("actions", {}),
        "restarts": [
            {k: r.get(k) for k in ("rank", "host", "at_s")} for r in summary.get("restarts", [])
        ],
    }
    if not ok:
        detail["error"] = output[-1500:]
    return Outcome(case=case.name, column=column, ok=ok, train_s=train, wall_s=wall,
                   detail=detail)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Cluster:
    env: dict[str, str]
    work: Path
    write: Any  # SshdServer.write_hostfile

    def hostfile(self, case: Case) -> Path:
        return self.write(self.work / f"hosts-{case.name}", case.hostfile)  # type: ignore[no-any-return]


@contextlib.contextmanager
def loopback_cluster(keep: bool) -> Iterator[Cluster]:
    with loopback_sshd(HOSTS + SPARES, name="scenarios", keep=keep) as (server, root, env):
        yield Cluster(env=env, work=root, write=server.write_hostfile)


# ------------------------------------------------------------------ results


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(matrix: list[Case], outcomes: list[Outcome], *, quick: bool,
              steps: int) -> dict[str, Any]:  # fmt: skip
    """JSON: per scenario the training seconds of each column, nd's ratios, targets."""
    ideal = {o.case: o.train_s for o in outcomes if o.column == "ideal" and o.ok}
    rows: dict[str, dict[str, Any]] = {}
    targets: dict[str, bool] = {}
    for case in matrix:
        got = {o.column: o for o in outcomes if o.case == case.name and o.ok}
        jct = {c: got[c].train_s if c in got else None for c in COLUMNS[:-1]}
        jct["ideal"] = ideal.get(case.layout)
        nd_ideal, nd_none = _ratio(jct["nd"], jct["ideal"]), _ratio(jct["nd"], jct["none"])
        rows[case.name] = {
            "what": case.what,
            "workers": case.workers,
            "jct_s": {c: round(v, 2) if v else None for c, v in jct.items()},
            "nd_over_ideal": nd_ideal,
            "nd_over_none": nd_none,
            "speedup_nd_over_none": _ratio(jct["none"], jct["nd"]),
            "nd_actions": got["nd"].detail.get("actions") if "nd" in got else None,
            "target": case.target,
        }
        if case.target == "ideal":
            targets[f"{case.name}: nd<={TARGET_ND_VS_IDEAL}x ideal"] = bool(
                nd_ideal and nd_ideal <= TARGET_ND_VS_IDEAL
            )
        elif case.target == "none":
            targets[f"{case.name}: nd<={TARGET_ND_VS_NONE}x none"] = bool(
                nd_none and nd_none <= TARGET_ND_VS_NONE
            )
    return {
        "mode": "quick" if quick else "full",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "steps": steps,
        "policies": {"nd": ND, "lb-bsp": LB_BSP},
        "scenarios": rows,
        "targets": targets,
        "injections": {c.name: list(c.injections) for c in matrix},
        "hostfiles": {c.name: list(c.hostfile) for c in matrix},
        "runs": [
            {
                "case": o.case,
                "column": o.column,
                "ok": o.ok,
                "train_s": o.train_s,
                "wall_s": round(o.wall_s, 2),
                **o.detail,
            }
            for o in outcomes
        ],
    }


def render_markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Straggler scenarios ({results['mode']}, {results['date']}, "
        f"{results['cpus']} CPUs, {results['steps']} steps)",
        "",
        "Training time in seconds (rank 0's loop, AntDT's JCT); ideal: the same hosts "
        "without the slowness.",
        "",
        "| scenario | workers | none | lb-bsp | nd | ideal | nd / ideal | nd / none "
        "| nd's actions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["scenarios"].items():
        jct = row["jct_s"]
        cells = [f"{jct[c]:.1f}" if jct[c] else "failed" for c in COLUMNS]
        actions = ", ".join(f"{k} x{v}" for k, v in (row["nd_actions"] or {}).items()) or "-"
        ratios = [f"{r:.3f}" if r else "-" for r in (row["nd_over_ideal"], row["nd_over_none"])]
        lines.append(f"| {name}: {row['what']} | {row['workers']} | " + " | ".join(cells)
                     + " | " + " | ".join(ratios) + f" | {actions} |")  # fmt: skip
    lines += [""]
    for target, met in results["targets"].items():
        lines.append(f"- target {target}: {'met' if met else 'NOT met'}")
    lines.append(f"- policies: {results['policies']['nd']} | {results['policies']['lb-bsp']}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="shorter jobs, no targets")
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--out", type=Path, help="JSON file (Markdown beside it)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    opts = parser.parse_args(argv)
    known = [c.name for c in cases(0.0)]
    opts.only = [n.strip() for n in opts.only.split(",")] if opts.only else known
    unknown = sorted(set(opts.only) - set(known))
    if unknown:
        parser.error(f"--only: unknown scenario {', '.join(unknown)}; known: {', '.join(known)}")
    if opts.out is None:
        opts.out = RESULTS / ("stragglers-scenarios.quick.json" if opts.quick
                              else "stragglers-scenarios.json")  # fmt: skip
    if opts.out.suffix != ".json":
        parser.error(f"--out {opts.out}: give a .json file (the Markdown table goes beside it)")
    return opts


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the job and the sshd are stopped


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    steps = 60 if opts.quick else 160
    began = time.monotonic()
    outcomes: list[Outcome] = []
    with loopback_cluster(opts.keep) as cluster:
        if opts.keep:
            print(f"run directories: {cluster.work}", flush=True)
        # Start-up (sshd, agents, torch in every worker) before training begins,
        # measured by the first ideal run, places the mid-run straggler.
        matrix = [c for c in cases(0.0) if c.name in opts.only]
        layouts: dict[str, Case] = {}
        for case in matrix:
            layouts.setdefault(case.layout, case)
        for layout, case in layouts.items():
            ideal = run_job(case, "ideal", steps=steps, cluster=cluster)
            ideal.case = layout
            outcomes.append(ideal)
            failed = "" if ideal.ok else "  FAILED " + ideal.detail.get("error", "")[-300:]
            print(f"  ideal {layout:<4} train {ideal.train_s or 0:6.1f} s  "
                  f"wall {ideal.wall_s:6.1f} s{failed}", flush=True)  # fmt: skip
        first = next(iter(o for o in outcomes if o.ok), None)
        start_s = (first.wall_s - (first.train_s or 0.0)) if first else 15.0
        matrix = [c for c in cases(start_s) if c.name in opts.only]
        for case in matrix:
            for column in COLUMNS[:-1]:
                outcome = run_job(case, column, steps=steps, cluster=cluster)
                outcomes.append(outcome)
                state = "ok" if outcome.ok else "FAILED " + outcome.detail.get("error", "")[-300:]
                print(f"  {case.name:<16} {column:<7} train {outcome.train_s or 0:6.1f} s "
                      f"actions={outcome.detail.get('actions') or {}} {state}",
                      flush=True)  # fmt: skip
    results = summarize(matrix, outcomes, quick=opts.quick, steps=steps)
    results["bench_wall_s"] = round(time.monotonic() - began, 1)
    text = render_markdown(results)
    print(text)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(results, indent=1) + "\n")
    md = opts.out.with_suffix(".md")
    md.write_text(text)
    print(f"wrote {opts.out} and {md} ({results['bench_wall_s']:.0f} s)")
    ok = all(o.ok for o in outcomes) and (opts.quick or all(results["targets"].values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
