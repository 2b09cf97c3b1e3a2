"""Scale benchmark: one real supervisor against N simulated hosts (issue 18).

The supervisor is the code ``dtlaunch run`` runs (``run_job``: the real ROUTER with
CURVE, the real WAL with group commit, the node table, the Controller with
``--policy nd``, the event log, the status endpoint), in this process. Only the
launcher differs: instead of SSH it hands each host's ``AgentBootstrap`` to a
simulator process (``scale_sim.py``) that answers as that host's agent and
workers over the real wire. Every worker steps at ``--rate`` steps/s with one
slow worker in a hundred, so that ``nd`` has real decisions to make and its
``AdjustBatchSize`` plans reach every worker.

Measured per N, over a steady window after every worker has reported:

* supervisor CPU (% of one core; this process's CPU time, which is the
  supervisor's plus a few hooks) and RSS;
* report-to-decision latency: from a worker sending a StepReports (simulator
  clock, CLOCK_MONOTONIC is one clock for all processes) to the first decision
  of the Controller that has it; and send-to-intake latency alone;
* the policy's ``decide()`` time (p50/max);
* DDS fetch round trip is the simulators' view of lease flow; the durable DDS
  throughput is its own phase (``--rate 0``: workers fetch and acknowledge as
  fast as they are answered, 8 leases per request);
* heartbeat-loss and unresponsive verdicts (false positives: nothing is slow
  to answer on purpose), event-log bytes per minute;
* ``status --json`` latency: a separate process queries the live supervisor
  every 2 s (the query itself, in that process), and the whole
  ``dtlaunch status --json`` command is timed once at the end of the window.

    python benchmarks/scale.py [--quick] [--sizes 10,100,1000,2000] [--window S]
        [--soak S] [--out FILE.json]
    python benchmarks/scale.py --baseline-ref REF [--sizes 1000] [--window 150] [--rounds 2]

``--baseline-ref``: the same measurement of another commit's supervisor, the
runs alternating, medians and ratios side by side
(``benchmarks/results/scale-side-by-side-DATE.{json,md}``).

``--quick`` (N=100, short window) is what ``make test-slow`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dtlaunch.config import RunOptions  # noqa: E402
from dtlaunch.errors import DtlaunchError  # noqa: E402
from dtlaunch.hostfile import HostSpec  # noqa: E402
from dtlaunch.jobclient import request_stop  # noqa: E402
from dtlaunch.supervisor import job as job_module  # noqa: E402
from dtlaunch.supervisor.control.controller import Controller  # noqa: E402
from dtlaunch.supervisor.control.loop import ReportIntake  # noqa: E402
from dtlaunch.supervisor.launcher import AgentExit, HostInfo  # noqa: E402
from dtlaunch.supervisor.status.tracker import StatusTracker  # noqa: E402
from dtlaunch.wire.codec import to_dict  # noqa: E402
from dtlaunch.wire.messages import AgentBootstrap, StepReports  # noqa: E402

SIM = Path(__file__).resolve().parent / "scale_sim.py"
RESULTS = REPO / "benchmarks" / "results"
STEP_RATE = 10.0  # steps/s per worker, as the issue asks
BATCH = 32
SHARD = 320  # a lease lasts 10 steps: one fetch and one ack per worker per second
CONTROL_INTERVAL_S = 10.0
STATUS_PROBE = """
import asyncio, json, sys, time
from pathlib import Path
from dtlaunch.jobclient import StatusSource
from dtlaunch.supervisor.rundir import RunDir

async def main():
    source = StatusSource(RunDir.open(Path(sys.argv[1])), timeout=10.0)
    out = []
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        t0 = time.monotonic()
        snap, note = await source.current()
        out.append({"s": time.monotonic() - t0, "live": note == "", "rows": len(snap.nodes)})
        await asyncio.sleep(2.0)
    source.close()
    print(json.dumps(out))

asyncio.run(main())
"""


# ------------------------------------------------------------------ launcher


class SimAgent:
    """The supervisor's handle on one simulated agent: it ends when its host says Bye."""

    def __init__(self, sim: SimProcess, host: str) -> None:
        self._sim = sim
        self._host = host

    async def wait(self) -> AgentExit:
        await self._sim.exited(self._host)
        return AgentExit(definite=True, detail="simulated agent said bye")

    async def terminate(self) -> None:
        return None  # the simulator process is stopped as a whole by the benchmark


class SimProcess:
    """One ``scale_sim.py`` process: bootstraps in on stdin, ``exit HOST`` lines out."""

    def __init__(self, argv: list[str]) -> None:
        self._argv = argv
        self.proc: asyncio.subprocess.Process | None = None
        self._exits: dict[str, asyncio.Future[None]] = {}
        self.stats: dict[str, Any] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # its own group: stopped with it, never by name
        )
        self._reader = asyncio.create_task(self._read())

    def _future(self, host: str) -> asyncio.Future[None]:
        return self._exits.setdefault(host, asyncio.get_running_loop().create_future())

    async def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            word, _, rest = line.decode().strip().partition(" ")
            if word == "exit":
                future = self._future(rest)
                if not future.done():
                    future.set_result(None)
            elif word == "stats":
                self.stats = json.loads(rest)

    async def exited(self, host: str) -> None:
        await self._future(host)

    def hand(self, boot: AgentBootstrap) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(to_dict(boot)) + "\n").encode())

    async def finish(self, timeout_s: float) -> None:
        """Close stdin (no more hosts), wait for the stats line, stop the group."""
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            print(f"simulator {self.proc.pid} did not finish in {timeout_s} s; killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        if self._reader is not None:
            await self._reader


class SimLauncher:
    """``Launcher`` for the supervisor: hosts go round-robin to the simulators."""

    def __init__(self, sims: list[SimProcess], state_root: Path) -> None:
        self._sims = sims
        self._state_root = state_root
        self._next = 0
        self.launched = 0

    async def prepare(self, host: HostSpec) -> HostInfo:
        return HostInfo(endpoint_addr="127.0.0.1", state_dir=str(self._state_root / host.label))

    async def start(self, host: HostSpec, boot: AgentBootstrap, log_path: Path) -> SimAgent:
        sim = self._sims[self._next % len(self._sims)]
        self._next += 1
        self.launched += 1
        sim.hand(boot)
        return SimAgent(sim, host.label)

    async def close(self) -> None:
        return None


# ------------------------------------------------------------------ hooks


class Hooks:
    """Timestamps taken inside the supervisor: reports in, decisions out."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[int, int, float]] = []  # rank, last step, monotonic
        self.decisions: list[tuple[float, float]] = []  # when a due decide() began, its seconds
        self.replies: list[float] = []  # seconds the supervisor spent building a status answer
        self.ranks_seen: set[int] = set()
        self._saved: list[tuple[type, str, Any]] = []

    def install(self) -> None:
        hooks = self
        intake = ReportIntake.worker_reports
        decide = Controller.decide
        reply = StatusTracker.reply

        def worker_reports(self: ReportIntake, rank: int, reports: StepReports) -> None:
            if reports.step:
                hooks.arrivals.append((rank, max(reports.step), time.monotonic()))
                hooks.ranks_seen.add(rank)
            intake(self, rank, reports)

        def timed_decide(self: Controller, now: float, **kwargs: Any) -> list[Any]:
            # The controller's own test: a tick woken a hair early serves the grid
            # time just after ``now``, and ``now`` alone would call it not due.
            due = self.due(now, scheduled=kwargs.get("scheduled"))
            began = time.monotonic()
            actions = decide(self, now, **kwargs)
            if due:
                hooks.decisions.append((began, time.monotonic() - began))
            return actions

        def timed_reply(self: StatusTracker, request: Any, **kwargs: Any) -> Any:
            began = time.monotonic()
            answer = reply(self, request, **kwargs)
            hooks.replies.append(time.monotonic() - began)
            return answer

        self._saved = [
            (ReportIntake, "worker_reports", intake),
            (Controller, "decide", decide),
            (StatusTracker, "reply", reply),
        ]
        ReportIntake.worker_reports = worker_reports  # type: ignore[method-assign]
        Controller.decide = timed_decide  # type: ignore[method-assign]
        StatusTracker.reply = timed_reply  # type: ignore[method-assign]

    def remove(self) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)


# ------------------------------------------------------------------ one run


def _percentiles(values: list[float] | np.ndarray, *qs: float) -> list[float | None]:
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return [None for _ in qs]
    return [round(float(np.percentile(data, q)), 4) for q in qs]


def _records(n: int, window_s: float, rate: float) -> int:
    """A data set that outlasts the run: the window, the start and some margin."""
    if rate == 0:
        return SHARD * 40_000 * int(window_s + 120)  # beyond any fetch rate seen here
    return int(n * rate * BATCH * (window_s + 300))


def _sim_argv(n: int, records: int, log: Path | None, rate: float) -> list[str]:
    slow = ",".join(str(r) for r in range(0, n, 100)) if rate > 0 else ""
    argv = [
        sys.executable,
        str(SIM),
        "--rate",
        str(rate),
        "--batch",
        str(BATCH),
        "--compute-s",
        str(0.8 / STEP_RATE),
        "--dataset-size",
        str(records),
        "--shard-size",
        str(SHARD),
        "--global-batch",
        str(BATCH * n),
        "--slow-ranks",
        slow,
        "--slow-factor",
        "1.6",
    ]
    if rate == 0:
        argv += ["--fetch-count", "8"]
    if log is not None:
        argv += ["--send-log", str(log)]
    return argv


async def _run_one(
    args: argparse.Namespace, n: int, window_s: float, *, rate: float, tmp: Path
) -> dict[str, Any]:
    folder = tmp / f"n{n}-{'dds' if rate == 0 else 'steps'}"
    folder.mkdir()
    hostfile = folder / "hosts.txt"
    hostfile.write_text("".join(f"sim{i:05d} slots=1\n" for i in range(n)))
    script = folder / "train.py"
    script.write_text("raise SystemExit('simulated: never run')\n")
    run_dir = folder / "run"
    records = _records(n, window_s, rate)
    spec = RunOptions(
        script=str(script),
        hosts=str(hostfile),
        workers=n,
        policy="nd" if rate > 0 else "none",
        control_interval=CONTROL_INTERVAL_S,
        run_dir=run_dir,
        dataset_size=records,
        shard_size=SHARD,
        global_batch=BATCH * n,
        orphan_timeout=120.0,
        agent_timeout=120.0,
    ).job_spec()
    sims_count = max(1, min(args.sims, n // 50 or 1))
    sims = [
        SimProcess(_sim_argv(n, records, folder / f"sent-{k}.npy" if rate > 0 else None, rate))
        for k in range(sims_count)
    ]
    for sim in sims:
        await sim.start()
    launcher = SimLauncher(sims, folder / "agents")
    hooks = Hooks()
    hooks.install()
    original_launcher = job_module._launcher
    job_module._launcher = lambda *a, **k: launcher  # type: ignore[assignment]
    me = psutil.Process()
    result: dict[str, Any] = {"n": n, "mode": "dds" if rate == 0 else "steps", "sims": sims_count}
    job = asyncio.create_task(job_module.run_job(spec, console=io.StringIO()))
    try:
        started = time.monotonic()
        # Every worker reporting (or, for the DDS phase, leases flowing).
        while len(hooks.ranks_seen) < n and rate > 0:
            if job.done():
                job.result()
                raise RuntimeError("the job ended before every worker reported")
            if time.monotonic() - started > args.ready_timeout:
                raise RuntimeError(
                    f"only {len(hooks.ranks_seen)} of {n} workers reported within "
                    f"{args.ready_timeout} s"
                )
            await asyncio.sleep(0.2)
        if rate == 0:
            await asyncio.sleep(5.0)
        result["all_reporting_s"] = round(time.monotonic() - started, 2)
        events = run_dir / "events.jsonl"
        probe = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            STATUS_PROBE,
            str(run_dir),
            str(max(2.0, window_s - 2.0)),
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        log_bytes_0 = events.stat().st_size
        cpu_0 = sum(me.cpu_times()[:2])
        t0 = time.monotonic()
        arrivals_0 = len(hooks.arrivals)
        rss_peak = 0
        lags: list[float] = []  # how late a 0.1 s sleep of the supervisor's loop wakes
        while time.monotonic() - t0 < window_s:
            for _ in range(10):
                asked = time.monotonic()
                await asyncio.sleep(0.1)
                lags.append(time.monotonic() - asked - 0.1)
            rss_peak = max(rss_peak, me.memory_info().rss)
            if job.done():
                job.result()
                raise RuntimeError("the job ended during the measurement window")
        elapsed = time.monotonic() - t0
        cpu = sum(me.cpu_times()[:2]) - cpu_0
        log_bytes = events.stat().st_size - log_bytes_0
        probe_out, _ = await probe.communicate()
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dtlaunch",
            "status",
            str(run_dir),
            "--json",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        cli_t0 = time.monotonic()
        cli_out, cli_err = await cli.communicate()
        cli_s = time.monotonic() - cli_t0
        window_end = time.monotonic()
        await request_stop(run_dir, timeout=30.0)
        outcome = await asyncio.wait_for(job, 120.0)
        result["job_status"] = outcome.status
    finally:
        if not job.done():  # the size failed: its supervisor must not outlive it
            with contextlib.suppress(Exception):
                await request_stop(run_dir, timeout=10.0)
            try:
                await asyncio.wait_for(asyncio.shield(job), 60.0)
            except Exception:  # stopped or not, it must end here
                job.cancel()
                with contextlib.suppress(BaseException):
                    await job
        job_module._launcher = original_launcher  # type: ignore[assignment]
        hooks.remove()
        for sim in sims:
            await sim.finish(60.0)
    stats: Counter[str] = Counter()
    for sim in sims:
        stats.update(sim.stats)
    kinds = Counter(json.loads(line).get("kind") for line in (run_dir / "events.jsonl").open())
    queries = json.loads(probe_out or b"[]")
    live = [q["s"] for q in queries if q["live"]]
    result.update(
        window_s=round(elapsed, 1),
        supervisor_cpu_pct=round(100.0 * cpu / elapsed, 1),
        supervisor_rss_mb=round(rss_peak / 2**20, 1),
        reports_in_per_s=round((len(hooks.arrivals) - arrivals_0) / elapsed, 1),
        loop_lag_p99_s=_percentiles(lags, 99)[0],
        loop_lag_max_s=round(max(lags), 4),
        event_log_bytes_per_min=int(log_bytes / elapsed * 60),
        false_heartbeat_lost=kinds.get("heartbeat_lost", 0),
        false_agent_lost=kinds.get("agent_lost", 0),
        false_unresponsive=kinds.get("unresponsive", 0),
        stalls=kinds.get("stall", 0),
        decisions=kinds.get("decision", 0),
        status_queries=len(queries),
        status_live_queries=len(live),
        status_query_p50_s=_percentiles(live, 50)[0],
        status_query_p99_s=_percentiles(live, 99)[0],
        # The supervisor's share of an answer: building it on its loop (the rest
        # of a query is the wait for the loop, the transfer and the client's decode).
        status_build_p50_s=_percentiles(hooks.replies, 50)[0],
        status_build_max_s=round(max(hooks.replies), 4) if hooks.replies else None,
        status_query_max_s=round(max(live), 4) if live else None,
        status_rows=max((q["rows"] for q in queries), default=0),
        status_cli_s=round(cli_s, 3),
        status_cli_ok=cli.returncode == 0 and bool(cli_out.strip()),
        sim=dict(stats),
        sim_processes=[
            {
                k: sim.stats.get(k)
                for k in ("cpu_s", "wall_s", "tick_late_max_s", "tick_late_over_1s")
            }
            for sim in sims
        ],
    )
    if cli.returncode != 0:
        result["status_cli_error"] = cli_err.decode()[-500:]
    decide_s = [d for _, d in hooks.decisions]
    result["decide_p50_s"], result["decide_max_s"] = (
        _percentiles(decide_s, 50)[0],
        round(max(decide_s), 4) if decide_s else None,
    )
    if rate > 0:
        result.update(_latencies(folder, sims_count, hooks, t0, window_end))
    else:
        ops = stats["leases_granted"] + stats["leases_acked"]
        result["dds_lease_ops"] = ops
        result["dds_ops_per_s"] = round(ops / (window_end - started), 1)
        result["dds_fetch_requests_per_s"] = round(stats["fetches"] / (window_end - started), 1)
    return result


def _latencies(folder: Path, sims: int, hooks: Hooks, t0: float, t1: float) -> dict[str, Any]:
    """Send -> intake and send -> decision, for the reports sent in the window."""
    sent = np.concatenate(
        [
            np.load(folder / f"sent-{k}.npy")
            for k in range(sims)
            if (folder / f"sent-{k}.npy").exists()
        ]
    )
    arrived = {(int(r), int(s)): t for r, s, t in hooks.arrivals}
    decisions = np.array(sorted(t for t, _ in hooks.decisions))
    to_intake: list[float] = []
    to_decision: list[float] = []
    lost = 0
    for rank, step, t_sent in sent:
        if not t0 <= t_sent <= t1 - 2 * CONTROL_INTERVAL_S:
            continue  # only reports a decision could have followed within the window
        t_in = arrived.get((int(rank), int(step)))
        if t_in is None:
            lost += 1
            continue
        to_intake.append(t_in - t_sent)
        k = int(np.searchsorted(decisions, t_in))
        if k < len(decisions):
            to_decision.append(float(decisions[k]) - t_sent)
    p_in = _percentiles(to_intake, 50, 99)
    p_dec = _percentiles(to_decision, 50, 99)
    return {
        "reports_measured": len(to_intake),
        "reports_not_arrived": lost,
        "send_to_intake_p50_s": p_in[0],
        "send_to_intake_p99_s": p_in[1],
        "report_to_decision_p50_s": p_dec[0],
        "report_to_decision_p99_s": p_dec[1],
        "control_interval_s": CONTROL_INTERVAL_S,
    }


# ------------------------------------------------------------------ report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


def _sim_cpu(r: dict[str, Any]) -> str:
    return " + ".join(
        f"{100 * p['cpu_s'] / p['wall_s']:.0f}" for p in r["sim_processes"] if p.get("wall_s")
    )


STEP_COLUMNS: list[tuple[str, Any]] = [
    ("N", lambda r: r["n"]),
    ("supervisor CPU % of a core", lambda r: r["supervisor_cpu_pct"]),
    ("RSS MB", lambda r: r["supervisor_rss_mb"]),
    ("reports/s in", lambda r: r["reports_in_per_s"]),
    (
        "report→decision p50 / p99 s",
        lambda r: f"{r.get('report_to_decision_p50_s')} / {r.get('report_to_decision_p99_s')}",
    ),
    ("decide() p50 / max ms", lambda r: f"{_ms(r['decide_p50_s'])} / {_ms(r['decide_max_s'])}"),
    ("loop lag p99 / max ms", lambda r: f"{_ms(r['loop_lag_p99_s'])} / {_ms(r['loop_lag_max_s'])}"),
    (
        "status query p50 / p99 / max ms (rows)",
        lambda r: (
            f"{_ms(r['status_query_p50_s'])} / {_ms(r.get('status_query_p99_s'))} / "
            f"{_ms(r['status_query_max_s'])} ({r['status_rows']})"
        ),
    ),
    (
        "status answer built p50 / max ms",
        lambda r: f"{_ms(r.get('status_build_p50_s'))} / {_ms(r.get('status_build_max_s'))}",
    ),
    ("`status --json` command s", lambda r: r["status_cli_s"]),
    ("event log KB/min", lambda r: r["event_log_bytes_per_min"] // 1024),
    (
        "heartbeat_lost / unresponsive",
        lambda r: f"{r['false_heartbeat_lost']} / {r['false_unresponsive']}",
    ),
    ("simulators CPU %", _sim_cpu),
]
DDS_COLUMNS: list[tuple[str, Any]] = [
    ("N (DDS stress)", lambda r: r["n"]),
    ("lease fetch+ack ops/s", lambda r: r["dds_ops_per_s"]),
    ("fetch requests/s", lambda r: r["dds_fetch_requests_per_s"]),
    ("supervisor CPU %", lambda r: r["supervisor_cpu_pct"]),
    ("heartbeat_lost", lambda r: r["false_heartbeat_lost"]),
    ("simulators CPU %", _sim_cpu),
]


def _table(results: list[dict[str, Any]], columns: list[tuple[str, Any]]) -> list[str]:
    def row(r: dict[str, Any]) -> str:
        if "error" in r:  # the size did not run to its window: say why, in the row
            return f"| {r['n']} | {r['error']} |" + " |" * (len(columns) - 2)
        return "| " + " | ".join(str(cell(r)) for _, cell in columns) + " |"

    return [
        "| " + " | ".join(name for name, _ in columns) + " |",
        "|" + "---:|" * len(columns),
        *(row(r) for r in results),
    ]


def _markdown(results: list[dict[str, Any]]) -> str:
    rows = _table([r for r in results if r["mode"] == "steps"], STEP_COLUMNS)
    dds = [r for r in results if r["mode"] == "dds"]
    if dds:
        rows += ["", *_table(dds, DDS_COLUMNS)]
    return "\n".join(rows) + "\n"


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="dtlaunch-scale-"))
    try:
        runs = [(n, STEP_RATE) for n in args.sizes] + ([(args.dds_n, 0.0)] if args.dds_n else [])
        for n, rate in runs:
            window = args.soak if n == args.soak_n and args.soak and rate else args.window
            what = "steady window" if rate else "DDS stress, window"
            print(f"N={n}: {what} {window:g} s ...", flush=True)
            try:
                results.append(await _run_one(args, n, window, rate=rate, tmp=tmp))
            except (RuntimeError, DtlaunchError) as err:  # a size not carried is a result too
                mode = "steps" if rate else "dds"
                results.append({"n": n, "mode": mode, "error": str(err)})
            print(json.dumps(results[-1]), flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N=100, 30 s window")
    parser.add_argument("--sizes", default="10,100,1000,2000")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--soak", type=float, default=0.0, help="window for --soak-n (e.g. 600)")
    parser.add_argument("--soak-n", type=int, default=1000)
    parser.add_argument("--dds-n", type=int, default=1000)
    parser.add_argument("--sims", type=int, default=2, help="simulator processes")
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--baseline-ref",
        help="side by side: alternate this checkout's supervisor with the one of this "
        "git ref (a worktree), --rounds times each, at the first of --sizes",
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.baseline_ref:
        side_by_side(args)
        return
    if args.quick:
        # The latencies are measured for reports sent in the window's first
        # (window - 2 control intervals): 10 s of them.
        args.sizes, args.window, args.dds_n, args.soak = "100", 30.0, 100, 0.0
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s]
    # The loop and the collector settings `dtlaunch run` runs its supervisor with.
    with (
        job_module.collector_for_a_supervisor(),
        asyncio.Runner(loop_factory=job_module.new_event_loop) as runner,
    ):
        results = runner.run(main_async(args))
    table = _markdown(results)
    print(table)
    out = args.out or RESULTS / ("scale.quick.json" if args.quick else "scale.json")
    out.write_text(
        json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), "results": results}, indent=1) + "\n"
    )
    out.with_suffix(".md").write_text(table)


# ------------------------------------------------------------------ side by side


def side_by_side(args: argparse.Namespace) -> None:
    """The supervisor of ``--baseline-ref`` and this checkout's at one N, runs
    alternating so that the machine's drift (the simulators' CPU share moved
    from 34 % to 45 % over one afternoon) hits both alike. Each side's simulators
    speak its own wire protocol (each run's ``PYTHONPATH`` and working directory
    are its checkout, which ``scale_sim.py``, the status probe and the ``dtlaunch
    status`` command import; ``python -c`` and ``-m`` look in the working
    directory first): the same load of the same messages, as each version's SDK
    encodes them."""
    n = int(str(args.sizes).split(",")[0])
    tmp = Path(tempfile.mkdtemp(prefix="dtlaunch-scale-ab-"))
    baseline = tmp / "baseline"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline), args.baseline_ref],
        check=True, capture_output=True,
    )  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    try:
        for round_no in range(args.rounds):
            for side, checkout in (("baseline", baseline), ("this", REPO)):
                out = tmp / f"{side}-{round_no}.json"
                script = str(checkout / "benchmarks" / "scale.py")
                argv = [sys.executable, script, "--sizes", str(n), "--window", str(args.window),
                        "--dds-n", "0", "--out", str(out)]  # fmt: skip
                env = {**os.environ, "PYTHONPATH": str(checkout)}
                subprocess.run(
                    argv, check=True, capture_output=True, timeout=args.window + 900, env=env,
                    cwd=checkout,
                )  # fmt: skip
                row = json.loads(out.read_text())["results"][0]
                runs[side].append(row)
                print(f"{side} round {round_no + 1}: {row.get('supervisor_cpu_pct')} % of a core",
                      flush=True)  # fmt: skip
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)],
            check=False, capture_output=True,
        )  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)
    _write_side_by_side(args, n, runs)


def _write_side_by_side(
    args: argparse.Namespace, n: int, runs: dict[str, list[dict[str, Any]]]
) -> None:
    def median(side: str, key: str) -> float:
        return float(np.median([r[key] for r in runs[side] if r.get(key) is not None]))

    keys = [
        ("supervisor_cpu_pct", "supervisor CPU % of a core", 1.0),
        ("loop_lag_p99_s", "loop lag p99 ms", 1000.0),
        ("loop_lag_max_s", "loop lag max ms", 1000.0),
        ("status_query_p50_s", "status query p50 ms", 1000.0),
        ("status_query_p99_s", "status query p99 ms", 1000.0),
        ("status_query_max_s", "status query max ms", 1000.0),
        ("status_build_p50_s", "status answer built p50 ms", 1000.0),
        ("reports_in_per_s", "report messages/s in", 1.0),
    ]
    lines = [
        f"# Scale, side by side: this checkout against `{args.baseline_ref}` "
        f"(benchmarks/scale.py --baseline-ref)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')}; N = {n}, {args.window:g} s windows, "
        f"{args.rounds} rounds alternating (baseline first); medians; each run's figures "
        "in the JSON.",
        "",
        "| measure | baseline | this | this / baseline |",
        "|---|---:|---:|---:|",
    ]
    for key, label, scale in keys:
        base, this = median("baseline", key), median("this", key)
        ratio = f"{this / base:.3f}" if base else "-"
        lines.append(f"| {label} | {base * scale:.1f} | {this * scale:.1f} | {ratio} |")
    sims = [
        round(100 * p["cpu_s"] / p["wall_s"])
        for side in runs.values()
        for r in side
        for p in r.get("sim_processes", [])
    ]
    lines += ["", f"Simulator processes' CPU % over all runs: {sims}.", ""]
    table = "\n".join(lines)
    print(table)
    out = args.out or RESULTS / f"scale-side-by-side-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(
        json.dumps(
            {"when": time.strftime("%Y-%m-%d %H:%M"), "baseline_ref": args.baseline_ref,
             "n": n, "window_s": args.window, "runs": runs}, indent=1,
        ) + "\n"
    )  # fmt: skip
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
