"""Batch-balancing solver benchmark (AntDT eq. 3): ours vs cvxpy LP relaxation vs MIP.

For n = 10, 100, 1,000, 10,000 workers with random throughputs (log-normal,
spanning about two orders of magnitude) and a global batch B = 64 n + noise,
prints the solve time of

* ours: ``dtlaunch.solvers.solve_batch_sizes`` (exact integer optimum), median of
  several repetitions (target: < 5 ms at n = 1,000);
* cvxpy LP relaxation (continuous B_i, CLARABEL or HiGHS): a lower bound whose
  solution is not integral; we report how many entries are fractional;
* cvxpy MIP with HiGHS (``mip_rel_gap = 0``), with a time limit; skipped above
  ``--mip-max-n``.

and checks that our makespan equals the MIP's wherever the MIP finished.

Then AntDT-DD's eq. 4 solver (``dtlaunch.solvers.solve_dd``: a batch size and an
accumulation count per device class) at 1,000 workers, in 4 device classes and
with 1,000 distinct speeds, median of several repetitions (target: < 100 ms).
Its agreement with a MIP is a test (``tests/test_solver_dd.py``), on small
instances where the MIP finishes.

    python benchmarks/solvers.py [--out FILE.json] [--mip-time-limit 60] [--mip-max-n 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import cvxpy as cp
import numpy as np

from dtlaunch.solvers import DeviceClass, makespan, solve_batch_sizes, solve_dd, solve_dd_workers

SIZES = (10, 100, 1_000, 10_000)
TARGET_MS_AT_1000 = 5.0
DD_TARGET_MS_AT_1000 = 100.0
REPEATS = 9


def _instance(n: int, seed: int) -> tuple[list[float], int, int]:
    rng = np.random.default_rng(seed)
    speeds = (100.0 * rng.lognormal(0.0, 1.0, n)).tolist()
    return speeds, 64 * n + int(rng.integers(0, n)), 1


def _time_ours(speeds: list[float], total: int, minimum: int) -> dict[str, Any]:
    solve_batch_sizes(speeds, total, minimum)  # warm-up: imports, caches
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        sizes = solve_batch_sizes(speeds, total, minimum)
        times.append(time.perf_counter() - start)
    return {
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "makespan": makespan(sizes, speeds),
    }


def _problem(
    speeds: list[float], total: int, minimum: int, integer: bool
) -> tuple[cp.Problem, cp.Variable]:
    sizes = cp.Variable(len(speeds), integer=integer)
    z = cp.Variable()
    constraints = [sizes <= z * np.asarray(speeds), cp.sum(sizes) == total, sizes >= minimum]
    return cp.Problem(cp.Minimize(z), constraints), sizes


def _time_lp(speeds: list[float], total: int, minimum: int) -> dict[str, Any]:
    problem, sizes = _problem(speeds, total, minimum, integer=False)
    start = time.perf_counter()
    problem.solve(solver="HIGHS")
    elapsed = time.perf_counter() - start
    values = np.asarray(sizes.value, dtype=np.float64)
    fractional = int(np.count_nonzero(np.abs(values - np.round(values)) > 1e-6))
    return {
        "ms": 1e3 * elapsed,
        "status": problem.status,
        "objective": float(problem.value),
        "fractional_entries": fractional,
    }


def _time_mip(speeds: list[float], total: int, minimum: int, limit_s: float) -> dict[str, Any]:
    problem, sizes = _problem(speeds, total, minimum, integer=True)
    start = time.perf_counter()
    try:
        problem.solve(solver="HIGHS", mip_rel_gap=0.0, mip_abs_gap=0.0, time_limit=limit_s)
    except cp.error.SolverError as exc:
        return {"ms": 1e3 * (time.perf_counter() - start), "status": f"error: {exc}"}
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {"ms": 1e3 * elapsed, "status": problem.status}
    timed_out = elapsed >= limit_s * 0.98 or problem.status != "optimal"
    if timed_out:
        result["status"] = f"timed out at {limit_s:g} s"
    if sizes.value is not None:
        integral = [round(float(b)) for b in sizes.value]
        result["feasible"] = sum(integral) == total and min(integral) >= minimum
        result["makespan"] = makespan(integral, speeds)
    result["optimal"] = not timed_out
    return result


def _time_dd() -> list[dict[str, Any]]:
    """AntDT-DD at 1,000 workers: a few device classes, then every worker its own."""
    rng = np.random.default_rng(7)
    classes = [  # V100, P100, T4, K80-like throughputs (samples/s) and batch bounds
        DeviceClass(throughput=400.0, min_batch=32, max_batch=256, count=400),
        DeviceClass(throughput=250.0, min_batch=24, max_batch=160, count=300),
        DeviceClass(throughput=160.0, min_batch=16, max_batch=128, count=200),
        DeviceClass(throughput=90.0, min_batch=8, max_batch=64, count=100),
    ]
    speeds = (100.0 * rng.lognormal(0.0, 0.5, 1_000)).tolist()
    cases = [
        ("4 classes", lambda: solve_dd(classes, 300_000)),
        ("1,000 speeds", lambda: solve_dd_workers(speeds, 16, 128, 200_000)),
    ]
    rows = []
    for name, solve in cases:
        plan = solve()  # warm-up
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            solve()
            times.append(time.perf_counter() - start)
        rows.append(
            {"case": name, "median_ms": 1e3 * statistics.median(times), "makespan": plan.makespan}
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--mip-time-limit", type=float, default=60.0, help="seconds per MIP")
    parser.add_argument("--mip-max-n", type=int, default=1_000, help="skip the MIP above this n")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    header = (
        f"{'n':>7} {'B':>9} | {'ours ms':>9} | {'LP ms':>9} {'frac.':>6} | "
        f"{'MIP ms':>10} {'MIP status':<22} | ours vs MIP makespan"
    )
    print(header)
    print("-" * len(header))
    for seed, n in enumerate(SIZES):
        speeds, total, minimum = _instance(n, seed)
        ours = _time_ours(speeds, total, minimum)
        lp = _time_lp(speeds, total, minimum)
        if n <= args.mip_max_n:
            mip = _time_mip(speeds, total, minimum, args.mip_time_limit)
        else:
            mip = {"status": f"skipped (n > {args.mip_max_n})"}
        if mip.get("optimal"):
            gap = (ours["makespan"] - mip["makespan"]) / mip["makespan"]
            mip["relative_gap_ours_minus_mip"] = gap
            verdict = "agree" if abs(gap) <= 1e-9 else "DIFFER"
            agreement = f"{verdict} (rel. diff {gap:+.1e})"
        elif "makespan" in mip:
            worse = (mip["makespan"] - ours["makespan"]) / ours["makespan"]
            agreement = (
                "unproven incumbent equals ours"
                if abs(worse) <= 1e-9
                else f"unproven incumbent worse by {worse:+.1e}"
            )
        else:
            agreement = "n/a"
        mip_ms = f"{mip['ms']:10.1f}" if "ms" in mip else f"{'-':>10}"
        print(
            f"{n:>7} {total:>9} | {ours['median_ms']:9.3f} | {lp['ms']:9.1f} "
            f"{lp['fractional_entries']:>6} | {mip_ms} {mip['status']:<22} | {agreement}"
        )
        rows.append(
            {"n": n, "total": total, "minimum": minimum, "ours": ours, "lp": lp, "mip": mip}
        )

    at_1000 = next(row["ours"]["median_ms"] for row in rows if row["n"] == 1_000)
    met = at_1000 < TARGET_MS_AT_1000
    print()
    print(
        f"target: ours < {TARGET_MS_AT_1000:g} ms at n = 1,000 -> {at_1000:.3f} ms "
        f"({'met' if met else 'NOT met'})"
    )
    print(
        "LP relaxation: 'frac.' counts non-integral B_i; its objective is only a lower bound "
        "and rounding it does not give the integer optimum."
    )
    print(
        f"MIP: HiGHS with mip_rel_gap=0, time limit {args.mip_time_limit:g} s per instance; "
        "a timed-out MIP has an incumbent but no optimality proof."
    )
    dd_rows = _time_dd()
    print()
    for row in dd_rows:
        print(f"AntDT-DD eq. 4, 1,000 workers, {row['case']}: {row['median_ms']:.2f} ms")
    dd_met = all(row["median_ms"] < DD_TARGET_MS_AT_1000 for row in dd_rows)
    print(f"target: < {DD_TARGET_MS_AT_1000:g} ms -> {'met' if dd_met else 'NOT met'}")
    if args.out:
        report = {
            "rows": rows,
            "target_ms_at_1000": TARGET_MS_AT_1000,
            "target_met": met,
            "dd_rows": dd_rows,
            "dd_target_ms_at_1000": DD_TARGET_MS_AT_1000,
            "dd_target_met": dd_met,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
