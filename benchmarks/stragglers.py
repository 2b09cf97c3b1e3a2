"""AntDT Table III: JCT of BSP vs AntDT-ND as straggler intensity grows.

One invocation runs, one after the other on this machine, examples/synthetic.py
with 8 workers on 8 loopback "hosts" (127.0.0.2-9, a real sshd, two spare hosts
127.0.0.10-11 for KILL_RESTART) in these columns:

    none      plain BSP under dtlaunch (--policy none)
    torchrun  the same workload under real torchrun (static equal partition)
    lb-bsp    batch-size balancing only (LB-BSP)
    nd        AntDT-ND: ADJUST_BS for transient, KILL_RESTART for persistent stragglers
    ideal     no injection, --policy none (one run, shared by every intensity)
    backup    (full runs) BACKUP_WORKERS b=1 (Fig. 10's BW column): PS mode, 1 server

and, in a full run, the server side of Table III: the same workload in PS mode
(--servers 2, BSP), one server persistently slowed by 4 s x intensity per step
(scaled like the rest), under none and nd (which moves it to a spare host),
beside the PS ideal.

Stragglers follow AntDT §VII-A-4, times scaled down (see ``Scenario``): transient
(each host disturbed with probability 0.3 per period, for its first half, sleeping
1.5 s x intensity per step) plus one persistent straggler (4 s x intensity per
step), both bound to hosts, so a KILL_RESTART onto a spare host escapes the
persistent one. Seeded coins: every column sees the same pattern. JCT is, as in
AntDT, the training time from its start to its end (rank 0's loop); the wall time
from launch to exit (start-up included) is recorded beside it.

    python benchmarks/stragglers.py [--quick] [--intensities 0.8] [--out FILE.json] [--keep]
    python benchmarks/stragglers.py --scenarios [--quick] [--only NAME,...]

--scenarios: the scenario matrix of ``benchmarks/straggler_scenarios.py`` instead
(slow hosts with several workers, fixed vs proportional slowness, a straggler
that appears mid-run or recovers, no spare host); its options follow it.

--quick: intensity 0.8 only, the worker side's five columns. --intensities: the
full run's every column and check at those intensities only, jobs full length
(writes stragglers.partial.json). The full run adds
0.1-0.5, the overhead check (nd vs none without stragglers, target 0.5 %), the
backup column and the server side. Targets at 0.8 (issue 13): --quick, nd <=
1.10 x ideal and >= 2.0x faster than none; full length, <= 1.06 x ideal and >=
2.1x (workers); nd >= 2.0x faster than none (servers). Writes JSON (``jct_s``:
intensity -> column -> s; ``server.jct_s`` likewise) and the Markdown tables
beside it (benchmarks/results/).

Beside the ideal the tables give the *floor* (``oracle_floor``): the training
time of an oracle that has the persistent straggler on a spare from the first
step and balances every transient one perfectly at once. The ideal run has no
transient stragglers, which nothing removes, so ratios to the ideal bottom out
at floor / ideal, and none / floor is the most any policy can gain over none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.jobrun import loopback_sshd, timed_run  # noqa: E402
from benchmarks.stragglers_report import (  # noqa: E402
    COLUMNS,
    render_markdown,
    render_text,
    table_rows,
    write_results,
)
from dtlaunch.inject import injected_delay, parse_injections  # noqa: E402

__all__ = ["render_markdown", "table_rows"]  # also used by tests, beside main()

RESULTS = REPO / "benchmarks" / "results"
SYNTHETIC = REPO / "examples" / "synthetic.py"
INTENSITIES = (0.1, 0.3, 0.5, 0.8)
QUICK_INTENSITIES = (0.8,)
WORKERS = 8
WORKER_HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 2 + WORKERS))
SPARE_HOSTS = ("127.0.0.10", "127.0.0.11")
SERVER_HOSTS = WORKER_HOSTS[:2]  # PS mode: server 0 and 1 beside workers 0 and 1
SERVER_STRAGGLER_HOST = SERVER_HOSTS[1]
TARGET_SERVER_SPEEDUP = 2.0
# nd at intensity 0.8 (issue 13): --quick within 1.10x the ideal and 2.0x faster
# than none; full length within 1.06x and 2.1x (AntDT: +104.5 %).
TARGET_ND_VS_IDEAL = {"quick": 1.10, "full": 1.06}
TARGET_ND_SPEEDUP = {"quick": 2.0, "full": 2.1}
TARGET_OVERHEAD = 0.005
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """AntDT's worker-side straggler experiment, scaled down for one machine.

    AntDT (Table III) fits an ideal BPT of ~2.7 s, a persistent delay of
    ~4 s x intensity and transient sleeps of 1.5 s x intensity. Per-step times
    are divided by ``time_scale``; the transient period is shortened further so
    that a job of tens of seconds still sees it switch on and off.
    """

    time_scale: float = 10.0
    global_batch: int = 256  # 32 records per worker and step
    capacity: float = 120.0  # samples/s: BPT = 32 / 120 = 0.267 s (AntDT ~2.7 s / 10)
    # Small shards, one prefetched: a worker shrunk by ADJUST_BS holds little at the
    # end, when the others wait for it (prefetch 0 stalls batches across shards).
    shard_size: int = 64
    prefetch: int = 1
    # 400 steps (~2 min ideal): the fixed cost of detecting and replacing the
    # persistent straggler (~3 s) stays a small part of the job, as in AntDT's
    # hour-long runs; shorter jobs mostly measure that start-up.
    steps: int = 400
    persistent_host: str = WORKER_HOSTS[3]  # AntDT's w3
    persistent_s: float = 4.0  # x intensity / time_scale
    transient_sleep_s: float = 1.5  # x intensity / time_scale
    transient_prob: float = 0.3
    period_s: float = 20.0
    duration_s: float = 10.0
    seed: int = 7
    # A decision every step or so: a transient episode lasts ~35 steps here, and
    # each round of balancing that waits for the next decision costs steps.
    control_interval_s: float = 0.25
    # Both balance alike (windows of ~3 steps, a plan 2 steps ahead, 2 % margin;
    # a worker may go down to 2 records: a step that loses a fixed 0.32 s is
    # slow at any batch, so the less it carries the better until it is replaced);
    # nd also replaces persistent stragglers (3 s window) on a free spare host.
    nd: str = (
        "nd:lambda=1.5,l_trans=1,l_per=3,apply_after=2,margin=0.02,min_batch=2,"
        "restart_cost=4,cooldown=10"
    )
    lb_bsp: str = "lb-bsp:l_trans=1,l_per=3,apply_after=2,margin=0.02,min_batch=2"
    backup: str = "backup:b=1"
    server_delay_s: float = 4.0  # AntDT's persistent straggler, x intensity / time_scale

    @property
    def dataset_size(self) -> int:
        return self.steps * self.global_batch

    def injections(self, intensity: float) -> list[str]:
        """The ``--inject`` specs at ``intensity`` (none at 0)."""
        if intensity <= 0:
            return []
        hosts = ",".join(WORKER_HOSTS + SPARE_HOSTS)  # a spare host may be contended too
        delay = self.persistent_s * intensity / self.time_scale
        sleep = self.transient_sleep_s / self.time_scale
        return [
            f"persistent:role=worker,hosts={self.persistent_host},delay={delay:.4g}",
            f"transient:role=worker,hosts={hosts},prob={self.transient_prob:g},"
            f"period={self.period_s:g},duration={self.duration_s:g},sleep={sleep:.4g},"
            f"intensity={intensity:g}",
        ]

    def server_injections(self, intensity: float) -> list[str]:
        """One server, persistently slow (AntDT §VII-B-1b), bound to its host."""
        if intensity <= 0:
            return []
        delay = self.server_delay_s * intensity / self.time_scale
        return [f"persistent:role=server,hosts={SERVER_STRAGGLER_HOST},delay={delay:.4g}"]

    def script_args(self) -> list[str]:
        return [
            "--dataset-size", str(self.dataset_size), "--shard-size", str(self.shard_size),
            "--global-batch", str(self.global_batch), "--capacity", f"{self.capacity:g}",
            "--seed", str(self.seed), "--prefetch", str(self.prefetch),
        ]  # fmt: skip


FULL = Scenario()
QUICK = Scenario(steps=44, period_s=12.0, duration_s=6.0)


def transient_pattern(scenario: Scenario, intensity: float, windows: int) -> dict[str, list[int]]:
    """Which worker hosts the seeded transient coins disturb, per period (what every
    column sees), for the report."""
    # All specs, in order: a spec's coin depends on its index in the list. The
    # transient part is what the others (no coins) leave unexplained.
    specs = parse_injections(scenario.injections(intensity))
    steady = tuple(s for s in specs if s.kind != "transient")
    rng, period = random.Random(scenario.seed), scenario.period_s

    def transient(host: str, window: int) -> int:
        kw: dict[str, Any] = dict(role="worker", rank=0, host=host, now=window * period,
                                  step_compute_s=0.0, rng=rng)  # fmt: skip
        return int(injected_delay(specs, **kw) > injected_delay(steady, **kw) + 1e-9)

    return {h: [transient(h, w) for w in range(windows)] for h in WORKER_HOSTS + SPARE_HOSTS}


def oracle_floor(
    scenario: Scenario, intensity: float, ideal_s: float, start_s: float | None = None
) -> float:
    """The training time no policy can beat at ``intensity``: an oracle's.

    The oracle has the persistent straggler's worker on a spare host from the
    first step at no cost (the better of the two spares: they see different
    transient coins) and balances every step perfectly, at once, with batch
    sizes as fine as it likes: with ``k`` workers each losing ``d`` seconds a
    step, BSP's step is at best ``(B / c + k x d) / N`` plus the communication
    (``B``: the global batch, ``c``: a worker's samples/s, ``N``: workers). The
    ideal run's step gives the communication. The transient coins fall on the
    job's clock, which the training reaches after the start-up: ``start_s``, as
    the run measured it (None: the smallest floor over start-ups of 0-30 s; it
    moves the quick run's by several per cent). Why it is reported: the ideal
    column has no transient stragglers at all, which no policy can remove, so
    this, not the ideal, is where a ratio to the ideal bottoms out.
    """
    step_ideal = ideal_s / scenario.steps
    per_worker = scenario.global_batch / WORKERS
    comm = max(0.0, step_ideal - per_worker / scenario.capacity)
    delay = scenario.transient_sleep_s / scenario.time_scale * intensity
    windows = math.ceil((30.0 + 3 * ideal_s) / scenario.period_s) + 1
    pattern = transient_pattern(scenario, intensity, windows)
    best = math.inf
    for spare in SPARE_HOSTS:
        hosts = [h for h in WORKER_HOSTS if h != scenario.persistent_host] + [spare]
        for offset in [start_s] if start_s is not None else (k * 0.5 for k in range(61)):
            t = offset
            for _ in range(scenario.steps):
                window = int(t // scenario.period_s)
                on = t - window * scenario.period_s < scenario.duration_s
                slow = sum(pattern[h][window] for h in hosts) if on else 0
                t += (scenario.global_batch / scenario.capacity + slow * delay) / WORKERS + comm
            best = min(best, t - offset)
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    column: str
    intensity: float
    jct_s: float  # wall time, launch to exit
    train_s: float | None  # rank 0's loop, from the script's last line
    ok: bool
    detail: dict[str, Any]


def _synthetic_line(text: str) -> dict[str, float]:
    match = re.search(r"synthetic: jct_s=(\S+) train_s=(\S+) steps=(\d+) records=(\d+)", text)
    if not match:
        return {}
    names = ("jct_s", "train_s", "steps", "records")
    return {k: float(v) for k, v in zip(names, match.groups(), strict=True)}


@dataclass(frozen=True, slots=True)
class Cluster:
    """The loopback hosts: hostfiles for 0, 1 and 2 servers, their env, a scratch dir."""

    hostfiles: dict[int, Path]
    env: dict[str, str]
    work: Path


def run_dtlaunch(scenario: Scenario, column: str, si: float, *, cluster: Cluster) -> Outcome:
    """One dtlaunch job of ``column`` at straggler intensity ``si``.

    Columns ``server:*`` are the server side (PS mode, 2 servers, a server
    straggler); ``backup`` is PS mode with 1 server; the rest are allreduce.
    """
    side, _, name = column.rpartition(":")
    servers = 2 if side == "server" else 1 if name == "backup" else 0
    policy = {"nd": scenario.nd, "lb-bsp": scenario.lb_bsp, "backup": scenario.backup}.get(
        name, "none"
    )
    injections = scenario.server_injections(si) if side else scenario.injections(si)
    run_dir = cluster.work / f"{column.replace(':', '-')}-{si:g}-{time.monotonic_ns()}"
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "-H", str(cluster.hostfiles[servers]),
        "--workers", str(WORKERS), "--servers", str(servers),
        "--run-dir", str(run_dir), "--output", "none", "--policy", policy,
        "--control-interval", f"{scenario.control_interval_s:g}", "--env", "OMP_NUM_THREADS=1",
        "--workdir", str(REPO),
    ]  # fmt: skip
    for spec in injections:
        argv += ["--inject", spec]
    argv += [str(SYNTHETIC), *scenario.script_args(), *(["--ps"] if servers else [])]
    env = cluster.env
    returncode, output, wall = timed_run(argv, env, timeout_s=RUN_TIMEOUT_S, cwd=REPO)
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((run_dir / "summary.json").read_text())
    line: dict[str, float] = {}
    for log in sorted((run_dir / "logs").glob("worker-0*.log")):
        line = _synthetic_line(log.read_text(errors="replace")) or line
    ok = returncode == 0 and summary.get("status") == "succeeded"
    detail = {
        "policy": policy,
        "summary_jct_s": summary.get("jct_s"),
        "actions": summary.get("actions", {}),
        "restarts": [
            {k: r.get(k) for k in ("rank", "host", "at_s", "reason")}
            for r in summary.get("restarts", [])
        ],
        "duplicate_records": summary.get("duplicate_records"),
        "steps": line.get("steps"),
        # when the training began on the job's clock (the transient coins' clock)
        "start_s": round(line["jct_s"] - line["train_s"], 3) if line else None,
    }
    if not ok:
        detail["error"] = output[-2000:]
    train = line.get("train_s")
    return Outcome(column=column, intensity=si, jct_s=wall, train_s=train, ok=ok, detail=detail)


def run_torchrun(scenario: Scenario, intensity: float, *, env: dict[str, str]) -> Outcome:
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(WORKERS), str(SYNTHETIC), "--torchrun", *scenario.script_args(),
        "--hosts", ",".join(WORKER_HOSTS), "--job-start", repr(time.time()),
    ]  # fmt: skip
    for spec in scenario.injections(intensity):
        argv += ["--inject", spec]
    returncode, output, wall = timed_run(argv, env, timeout_s=RUN_TIMEOUT_S, cwd=REPO)
    line = _synthetic_line(output)
    detail: dict[str, Any] = {"steps": line.get("steps")}
    if returncode != 0:
        detail["error"] = output[-2000:]
    return Outcome(
        column="torchrun", intensity=intensity, jct_s=wall, train_s=line.get("train_s"),
        ok=returncode == 0, detail=detail,
    )  # fmt: skip


@contextlib.contextmanager
def loopback_cluster(keep: bool) -> Iterator[Cluster]:
    """A real sshd on 127.0.0.2-11 and hostfiles: one worker slot on each of 8
    hosts, 2 spares, and for PS mode a server slot beside workers 0 (and 1);
    run directories go to a scratch folder (kept if ``keep``)."""
    with loopback_sshd(WORKER_HOSTS + SPARE_HOSTS, name="stragglers", keep=keep) as (
        server,
        root,
        env,
    ):
        hostfiles = {}
        for servers in (0, 1, 2):
            with_server = SERVER_HOSTS[:servers]
            lines = [
                f"{h} slots=2 servers=1" if h in with_server else f"{h} slots=1"
                for h in WORKER_HOSTS
            ]
            lines += [f"{h} slots=1 spare" for h in SPARE_HOSTS]
            hostfiles[servers] = server.write_hostfile(root / f"hosts-{servers}", lines)
        yield Cluster(hostfiles=hostfiles, env=env, work=root)


# ------------------------------------------------------------------ results


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(
    scenario: Scenario,
    outcomes: list[Outcome],
    *,
    quick: bool,
    overhead: dict[str, Any] | None,
    partial: bool = False,
) -> dict[str, Any]:
    """The JSON document: ``jct_s`` maps intensity -> column -> seconds; a full
    run adds ``server`` (the server side, likewise)."""
    # JCT as AntDT measures it: "the training time from the start to the end of
    # the training" (rank 0's loop); wall time from launch, start-up included, is
    # kept beside it (8 processes importing torch on 2 cores take 15-25 s).
    server_side = [o for o in outcomes if o.column.startswith("server:")]
    everything, outcomes = outcomes, [o for o in outcomes if o not in server_side]
    ideal = [o for o in outcomes if o.column == "ideal" and o.ok]
    ideal_train = [o.train_s for o in ideal if o.train_s]
    ideal_s = statistics.median(ideal_train) if ideal_train else None
    ideal_wall = [o.jct_s for o in ideal]
    intensities = sorted({o.intensity for o in outcomes if o.column != "ideal"})
    jct: dict[str, dict[str, float | None]] = {}
    train: dict[str, dict[str, float | None]] = {}
    for si in intensities:
        key = f"{si:g}"
        backup = [c for c in ("backup",) if any(o.column == c for o in outcomes)]
        jct[key] = {c: None for c in (*COLUMNS, *backup)}
        train[key] = {c: None for c in (*COLUMNS, *backup)}
        for o in outcomes:
            if o.intensity == si and o.column != "ideal" and o.ok:
                jct[key][o.column] = round(o.train_s, 2) if o.train_s else None
                train[key][o.column] = round(o.jct_s, 2)
        jct[key]["ideal"] = round(ideal_s, 2) if ideal_s else None
        train[key]["ideal"] = round(statistics.median(ideal_wall), 2) if ideal_wall else None
    starts = {f"{o.intensity:g}": o.detail.get("start_s") for o in outcomes if o.column == "nd"}
    floor = {
        k: round(oracle_floor(scenario, float(k), ideal_s, starts.get(k)), 2) if ideal_s else None
        for k in jct
    }
    speedup = {k: _ratio(v["none"], v["nd"]) for k, v in jct.items()}
    vs_ideal = {k: _ratio(v["nd"], v["ideal"]) for k, v in jct.items()}
    top = f"{max(intensities):g}" if intensities else None
    length = "quick" if quick else "full"
    vs_ideal_target, speedup_target = TARGET_ND_VS_IDEAL[length], TARGET_ND_SPEEDUP[length]
    nd_ideal, nd_speed = (vs_ideal.get(top or ""), speedup.get(top or ""))
    targets = {
        f"nd_vs_ideal_at_{top}<={vs_ideal_target}": bool(nd_ideal)
        and nd_ideal <= vs_ideal_target,
        f"nd_speedup_over_none_at_{top}>={speedup_target}": bool(nd_speed)
        and nd_speed >= speedup_target,
    }  # fmt: skip
    server = _server_side(server_side) if server_side else None
    if server is not None:
        speed = server["speedup"].get(top or "")
        targets[f"server_nd_speedup_over_none_at_{top}>={TARGET_SERVER_SPEEDUP}"] = bool(
            speed and speed >= TARGET_SERVER_SPEEDUP
        )
    if overhead is not None:
        targets[f"nd_overhead_without_stragglers<={TARGET_OVERHEAD:.1%}"] = bool(
            overhead["jct_ratio"] and overhead["jct_ratio"] - 1 <= TARGET_OVERHEAD
        )
    return {
        "mode": "quick" if quick else "partial" if partial else "full",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "jct_s": jct,  # training time (the paper's JCT)
        "wall_s": train,  # launch to exit, start-up included
        "speedup_nd_over_none": speedup,
        "nd_over_ideal": vs_ideal,
        # the oracle's training time (oracle_floor) and the ratios it bounds
        "floor_s": floor,
        "floor_over_ideal": {k: _ratio(f, jct[k]["ideal"]) for k, f in floor.items()},
        "none_over_floor": {k: _ratio(jct[k]["none"], f) for k, f in floor.items()},
        "overhead": overhead,
        "server": server,
        "targets": targets,
        "scenario": {**asdict(scenario), "dataset_size": scenario.dataset_size},
        "injections": {f"{si:g}": scenario.injections(si) for si in intensities},
        "server_injections": {f"{si:g}": scenario.server_injections(si) for si in intensities},
        "transient_pattern": transient_pattern(scenario, max(intensities or [0.8]), 6),
        "runs": [
            {
                "column": o.column,
                "intensity": o.intensity,
                "jct_s": round(o.jct_s, 3),
                "train_s": o.train_s,
                "ok": o.ok,
                **o.detail,
            }
            for o in everything
        ],
    }


def _server_side(outcomes: list[Outcome]) -> dict[str, Any]:
    """The server table: intensity -> none / nd / ideal (training seconds), nd's speedup."""
    ideal = [o.train_s for o in outcomes if o.column == "server:ideal" and o.ok and o.train_s]
    ideal_s = round(statistics.median(ideal), 2) if ideal else None
    jct: dict[str, dict[str, float | None]] = {}
    for si in sorted({o.intensity for o in outcomes if o.column != "server:ideal"}):
        row: dict[str, float | None] = {"none": None, "nd": None, "ideal": ideal_s}
        for o in outcomes:
            if o.intensity == si and o.column != "server:ideal" and o.ok and o.train_s:
                row[o.column.removeprefix("server:")] = round(o.train_s, 2)
        jct[f"{si:g}"] = row
    return {
        "jct_s": jct,
        "speedup": {k: _ratio(v["none"], v["nd"]) for k, v in jct.items()},
        "nd_over_ideal": {k: _ratio(v["nd"], v["ideal"]) for k, v in jct.items()},
    }


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]),
    )
    parser.add_argument("--quick", action="store_true", help="intensity 0.8 only, shorter job")
    parser.add_argument(
        "--out", type=Path, help="JSON file (default benchmarks/results/stragglers[.quick].json)"
    )
    parser.add_argument(
        "--overhead-pairs",
        type=int,
        help="none/nd runs without stragglers for the overhead check (default: 2, quick 0)",
    )
    parser.add_argument(
        "--intensities",
        help="full-length jobs at these intensities only, e.g. 0.8 or 0.3,0.8 (default: "
        "0.1,0.3,0.5,0.8; writes stragglers.partial.json unless --out is given)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--scenarios", action="store_true", help="the scenario matrix (straggler_scenarios.py)"
    )
    opts = parser.parse_args(argv)
    if opts.overhead_pairs is not None and opts.overhead_pairs < 0:
        parser.error("--overhead-pairs must be 0 or more")
    if opts.intensities is not None and opts.quick:
        parser.error("--intensities is for full-length jobs; --quick runs 0.8 only")
    opts.intensities = _intensities(parser, opts.intensities)
    if opts.out is None:
        name = "stragglers.quick.json" if opts.quick else "stragglers.json"
        if opts.intensities != INTENSITIES:
            name = "stragglers.partial.json"
        opts.out = RESULTS / name
    if opts.out.suffix != ".json":
        parser.error(f"--out {opts.out}: give a .json file (the Markdown table goes beside it)")
    if opts.overhead_pairs is None:
        opts.overhead_pairs = 0 if opts.quick else 2
    return opts


def _intensities(parser: argparse.ArgumentParser, text: str | None) -> tuple[float, ...]:
    if text is None:
        return INTENSITIES
    try:
        values = tuple(sorted({float(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        values = ()
    if not values or not all(0 < v <= 1 for v in values):
        parser.error(f"--intensities {text!r}: give numbers in (0, 1], comma-separated")
    return values


def _say(o: Outcome) -> None:
    state = "ok" if o.ok else f"FAILED: {o.detail.get('error', '')[-300:]}"
    more = f" train {o.train_s or 0:.1f} s actions={o.detail.get('actions') or {}}"
    print(f"  SI {o.intensity:g} {o.column:<8} {o.jct_s:6.1f} s{more} {state}", flush=True)


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the job and the sshd are stopped


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--scenarios" in args:
        from benchmarks.straggler_scenarios import main as scenarios

        return scenarios([a for a in args if a != "--scenarios"])
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    scenario = QUICK if opts.quick else FULL
    intensities = QUICK_INTENSITIES if opts.quick else opts.intensities
    outcomes: list[Outcome] = []
    began = time.monotonic()
    with loopback_cluster(opts.keep) as cluster:
        if opts.keep:
            print(f"run directories: {cluster.work}", flush=True)

        def dt(column: str, si: float) -> Outcome:
            outcome = run_dtlaunch(scenario, column, si, cluster=cluster)
            _say(outcome)
            return outcome

        # No stragglers: ideal (= none without injection), and nd beside it for the overhead.
        base = [dt("ideal", 0.0)]
        nd_clean: list[Outcome] = []
        for _ in range(opts.overhead_pairs):
            nd_clean.append(dt("nd", 0.0))
            base.append(dt("ideal", 0.0))
        outcomes += base
        overhead = _overhead(base, nd_clean) if nd_clean else None
        for si in intensities:
            outcomes += [dt("none", si), run_torchrun(scenario, si, env=cluster.env)]
            _say(outcomes[-1])
            outcomes += [dt("lb-bsp", si), dt("nd", si)]
            if not opts.quick:
                outcomes.append(dt("backup", si))
        if not opts.quick:
            outcomes.append(dt("server:ideal", 0.0))
            for si in intensities:
                outcomes += [dt("server:none", si), dt("server:nd", si)]
    results = summarize(
        scenario,
        outcomes,
        quick=opts.quick,
        overhead=overhead,
        partial=not opts.quick and intensities != INTENSITIES,
    )
    results["bench_wall_s"] = round(time.monotonic() - began, 1)
    print(render_text(results))
    md = write_results(results, opts.out)
    print(f"wrote {opts.out} and {md} ({results['bench_wall_s']:.0f} s)")
    ok = all(o.ok for o in outcomes) and all(results["targets"].values())
    return 0 if ok else 1


def _overhead(none_runs: list[Outcome], nd_runs: list[Outcome]) -> dict[str, Any]:
    """nd / none without stragglers: medians, so one noisy run does not decide."""

    def med(values: list[float | None]) -> float | None:
        vals = [v for v in values if v is not None and math.isfinite(v)]
        return statistics.median(vals) if vals else None

    # JCT = training time, as in the table; wall time (start-up included) beside it.
    none_w = med([o.jct_s for o in none_runs if o.ok])
    nd_w = med([o.jct_s for o in nd_runs if o.ok])
    none_t = med([o.train_s for o in none_runs if o.ok])
    nd_t = med([o.train_s for o in nd_runs if o.ok])
    return {
        "pairs": len(nd_runs),
        "none_jct_s": [o.train_s for o in none_runs],
        "nd_jct_s": [o.train_s for o in nd_runs],
        "jct_ratio": _ratio(nd_t, none_t),
        "wall_ratio": _ratio(nd_w, none_w),
        "nd_actions": [o.detail.get("actions") for o in nd_runs],
    }


if __name__ == "__main__":
    sys.exit(main())
