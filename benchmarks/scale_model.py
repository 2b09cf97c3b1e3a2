"""Where one supervisor stops, and what per-rack relays would buy (issue 18).

A model calibrated on this machine, not a measurement at 10,000 hosts:

1. From ``benchmarks/results/scale.json`` (``scale.py``'s real supervisor against
   simulated hosts), fit the supervisor's CPU as ``a + b x W`` (share of one core;
   W the load it carried, in workers at 10 steps/s, one per host).
2. Measure here, with the real code and no sockets, the part of ``b`` that is
   per *report* and would stay in the supervisor behind relays: decoding the
   reports inside a StepReports frame, the Monitor's ``report_worker`` for each,
   and the ``reports`` event written to the log. The rest of ``b`` is per
   *message* (receive, envelope, dispatch, replies, heartbeats, pings, DDS
   round trips): a relay in front of R hosts turns R hosts' messages into one.
3. Project N = 1,000 ... 10,000 for one supervisor and for relays of R = 40
   hosts (one rack), and the one-core ceiling each reaches.

    python benchmarks/scale_model.py [--scale FILE.json] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dtlaunch.events import EventRecorder, JsonlEventLog  # noqa: E402
from dtlaunch.supervisor.control.policies import NdPolicy, monitor_for  # noqa: E402
from dtlaunch.wire.codec import decode, encode  # noqa: E402
from dtlaunch.wire.messages import StepReport, StepReports  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
STEPS_PER_S = 10.0
REPORTS_PER_MESSAGE = 5  # the SDK sends every 5 steps (runtime/steps.py)
RACK = 40
SIZES = (1_000, 2_000, 5_000, 10_000)


def per_report_cost_s(workers: int = 200, steps: int = 300) -> float:
    """CPU seconds the supervisor spends per step report that no relay can take
    away: the reports' decode, the Monitor's windows, the event log line."""
    monitor = monitor_for(NdPolicy({}))
    folder = tempfile.TemporaryDirectory(prefix="scale-model-")
    event_log = JsonlEventLog(Path(folder.name) / "events.jsonl")
    recorder = EventRecorder([event_log])
    frames = [
        encode(
            StepReports.of(
                [
                    StepReport(step=s + k, batch_size=32, compute_s=0.08, samples=32)
                    for k in range(REPORTS_PER_MESSAGE)
                ]
            )
        )
        for s in range(0, steps, REPORTS_PER_MESSAGE)
    ]
    began = time.process_time()
    for index, frame in enumerate(frames):
        for rank in range(workers):
            msg = decode(frame)
            assert isinstance(msg, StepReports)
            now = index * REPORTS_PER_MESSAGE / STEPS_PER_S
            recorder.emit(
                "reports", role="worker", rank=rank, step=msg.step, compute_s=msg.compute_s
            )
            monitor.report_steps(
                rank,
                ends=[now] * len(msg.step),
                steps=msg.step,
                batch_sizes=msg.batch_size,
                compute_s=msg.compute_s,
                comm_s=msg.comm_s,
                samples=msg.samples,
            )
    spent = time.process_time() - began
    event_log.close()
    folder.cleanup()
    return spent / (len(frames) * workers * REPORTS_PER_MESSAGE)


def fit(results: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares ``cpu_share = a + b x W`` over the measured step runs, where W
    is the load the supervisor actually carried in workers at 10 steps/s (its
    StepReports in, over 2 a worker-second): a saturated run carries less than it
    was offered, and the fit must not credit it with the rest."""
    per_worker_messages = STEPS_PER_S / REPORTS_PER_MESSAGE
    rows = [
        (r["reports_in_per_s"] / per_worker_messages, r["supervisor_cpu_pct"] / 100)
        for r in results
        if r["mode"] == "steps" and "error" not in r
    ]
    if len(rows) < 2:
        raise SystemExit("need scale.json with at least two sizes; run benchmarks/scale.py")
    n, cpu = np.array(rows, dtype=float).T
    b, a = np.polyfit(n, cpu, 1)
    return float(a), float(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale-model.json")
    args = parser.parse_args()
    results = json.loads(args.scale.read_text())["results"]
    a, b = fit(results)
    report_s = per_report_cost_s()
    per_worker_reports = STEPS_PER_S * report_s  # CPU share per worker, reports only
    per_worker_messages = max(0.0, b - per_worker_reports)
    rows = []
    for n in SIZES:
        single = a + b * n
        relayed = a + n * per_worker_reports + n * per_worker_messages / RACK
        rows.append(
            {
                "n": n,
                "one_supervisor_cores": round(single, 2),
                "behind_relays_cores": round(relayed, 2),
                "relays": n // RACK,
            }
        )
    ceiling_single = (1 - a) / b
    ceiling_relayed = (1 - a) / (per_worker_reports + per_worker_messages / RACK)
    model = {
        "fit_a_core_share": round(a, 4),
        "fit_b_per_worker": round(b, 6),
        "per_report_cost_us": round(report_s * 1e6, 2),
        "per_worker_reports_share": round(per_worker_reports, 6),
        "per_worker_messages_share": round(per_worker_messages, 6),
        "rack": RACK,
        "one_core_ceiling_workers": int(ceiling_single),
        "one_core_ceiling_workers_behind_relays": int(ceiling_relayed),
        "projection": rows,
    }
    lines = [
        f"Fit over the measured runs: supervisor CPU = {a:.3f} + {b * 1e3:.3f}e-3 x N "
        "(share of one core).",
        f"Per step report that stays behind relays (decode, Monitor, event log): "
        f"{report_s * 1e6:.1f} us, i.e. {per_worker_reports * 100:.3f} % of a core per "
        "worker at 10 steps/s.",
        f"One core reaches: {int(ceiling_single)} workers alone, {int(ceiling_relayed)} "
        f"behind relays of {RACK} hosts.",
        "",
        "| workers (one per host) | one supervisor: cores | behind relays of 40: cores | relays |",
        "|---:|---:|---:|---:|",
        *(
            f"| {r['n']} | {r['one_supervisor_cores']} | {r['behind_relays_cores']} | "
            f"{r['relays']} |"
            for r in rows
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(json.dumps(model, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
