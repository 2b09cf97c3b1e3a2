"""PSLD (Chen et al., SoCC '20): ``--policy psld`` beside the alternatives when
parameter servers are slow.

One invocation runs, one after the other on this machine, ``benchmarks/psld_worker.py``
with 4 workers and 4 built-in parameter servers on 4 loopback "hosts" behind a
real sshd (127.0.0.2-5, each ``slots=2 servers=1``: server ``j`` runs on
127.0.0.``2+j``) and a spare host 127.0.0.6 (``slots=2 spare``) that only ``nd``
uses. The model is ~18.6 MB in 16 tensors of skewed sizes (one weight holds
39.5 % of the bytes, the others 4 B to 3.7 MB), cut into 1 MiB blocks
(``--ps-block-bytes 1048576``) that the job places on the servers balanced by
bytes; BSP, Adam on the servers (an update costs a server time per byte it
holds). Every worker trains 8 records a step (global batch 32) for a fixed
number of steps (``--dataset-size steps x 32``) with a real gradient for every
parameter and a 20 ms compute sleep a step. Every column decides every second
(``--control-interval 1``).

A slow server is ``--inject slowdown:role=server,hosts=H,factor=F,link=300M``:
after each update the server makes the pulls wait ``(F - 1) x`` its update
time, and each of its transfers (a pull it answers, a push it takes) ``(F - 1) x
bytes / 300 MiB/s`` after the transfers before it: a server whose link moves
``300/F`` MiB/s where a healthy one moves 300 (about 3x what a server moves on
this machine's loopback under the benchmark's load, so a healthy server's own
transfers cost it a third of that). It is slowed in proportion to the bytes it
holds, in its updates and on its link, as PSLD's slow servers are (§7). Without
``link=`` only the update is stretched, which a step of encrypted transfers
hides (static was 1.1x-2.4x the ideal: no placement could gain the 2.86x PSLD
reports). The slowdown is bound to the host
(contention), not to the rank: ``ranks=3`` would follow server 3 onto the
spare host, and ``nd``, whose remedy is exactly that move, could not escape it.
At the start server 3 runs on 127.0.0.5 and server 2 on 127.0.0.4, so for
``psld`` and ``static`` this is the same as ``ranks=3`` / ``ranks=2,3``.

Scenarios and columns (same data, steps, model and seed in every run):

    a   one server 10x slower (127.0.0.5)
    b   two servers 4x slower (127.0.0.4 and .5)
    c   a transient straggler: 127.0.0.5 10x slower for the middle third of the
        training loop, ``after=`` / ``until=`` (seconds since the job started)
        computed from the ``ideal`` run's loop start and ``train_s``
    d   no straggler: ``static`` and ``psld`` without injection, ``D_PAIRS``
        (3) pairs back to back, alternating; the ratio is the geometric mean
        of the pairs' ratios

    static        --policy none
    proportional  --policy psld:assign=proportional,WINDOWS  (PSLD's strawman, §7.1)
    nd            --policy nd:ND (moves a slow server whole onto the spare host)
    psld          --policy psld:eps=0.1,WINDOWS  (eps 0.1 is the default)
    ideal         --policy none, no injection (first: it calibrates c)

with WINDOWS = ``l_trans=2,l_per=60,settle=3,min_samples=8`` and ND =
``l_trans=2,l_per=10,min_reports=5,restart_cost=1``. Scenario d's ``static`` is
the ``ideal`` configuration again, each run right before one of d's ``psld`` so
that the 2 % comparison is not one of drift over the twenty minutes between
them; for the same reason scenario a's ``psld`` runs right after an ``ideal``
run, ``A_PAIRS`` (3) times before a's other columns, and its psld/ideal is the
geometric mean of those pairs' ratios. The ideal the other ratios use is the
mean of every run of that configuration (one run of it has varied by 13-20 %
from another in one invocation on this 2-core machine: 8 busy processes share
it). In scenario a
psld also runs with eps in {0, 0.05, 0.2, 0.3} (Fig. 19; 0.1 is the psld
column).

Scenario e, servers scaled mid-run (``--scale``, its own results file
``psld-scale.json`` / ``.md``; no straggler, ``--policy none``): ``2`` and ``4``
run 2 and 4 servers throughout; ``2->4`` starts with 2 and, once rank 0 has
trained a third of its steps, ``dtlaunch scale RUN_DIR --servers 4`` adds two on
the free slots (the spare host first); ``4->2`` starts with 4 and removes two
the same way. Reported beside the usual columns: the scale's pause, how long
the step took from the command to the map, and the mean step before and after.

Per run: ``train_s`` (rank 0's training loop, start-up and the final pull
excluded), the wall time from launch to exit, ok (exit 0, summary status
succeeded, a result, no duplicate records unless a worker was restarted: its
unfinished shard is trained again), the policy's actions, the
reassignments (``ps_reassign`` done) with each pause, nd's server moves
(``ps_move``), the final map's bytes per server, the final loss on a fixed
evaluation set, and where the time went: when the first action was decided,
when the last reassignment was done, and rank 0's mean step time before and
after it.

    python benchmarks/psld.py [--quick | --scale] [--steps N] [--only KEY,...]
                              [--out FILE.json] [--keep]

``--quick``: scenario a only with static, psld and ideal, 80 steps instead of
120 (a smoke run for ``make test-slow``, about 3 minutes; its targets are checked
the same way). ``--only a:psld,ideal:ideal`` runs only those runs (debugging).

``static/ideal`` is printed beside the ratios: it is about the most any placement
can gain over ``static`` (no map beats having no slow server at all; a map that
leaves a server idle can beat ``ideal`` by a few % here, one busy process fewer
on two cores), so a target well above it cannot be met by any policy in that
run. The update's part of the injected delay scales its wall-clock time,
which on this oversubscribed machine (8 processes, 2 cores) varies from run to
run; the link's part depends only on the bytes.

Targets (the issue's acceptance): in scenario a, psld >= 2.86x faster than
static (train_s) and <= 1.15x ideal; every reassignment's pause <= 0.5 s (p50
and max over every run of the psld policy: the psld, proportional and eps sweep
runs); with no slow server psld no more than 2 % slower than static. A
reassignment's pause is what it adds to the step: from every source at the
fence (the last export in) to the release, as a whole server's move measures
from its boundary; its hold, from the first source holding, is reported beside
it (a slow source reaches the fence last, and the step waits for it anyway). Writes
JSON and a Markdown table (benchmarks/results/psld.json, psld.md); exits 1 when
a run failed or a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.jobrun import loopback_sshd, timed_run  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
WORKER = REPO / "benchmarks" / "psld_worker.py"
HOSTS = tuple(f"127.0.0.{2 + j}" for j in range(4))  # server j on HOSTS[j]
SPARE = "127.0.0.6"
WORKERS = SERVERS = 4
BATCH_PER_WORKER = 8
GLOBAL_BATCH = BATCH_PER_WORKER * WORKERS
SHARD_SIZE = GLOBAL_BATCH
BLOCK_BYTES = 1 << 20
STEP_S = 0.02
LEARNING_RATE = 3e-4
CONTROL_INTERVAL_S = 1.0
STEPS = 120  # ideal: ~55 s of training (0.46 s a step), ~75 s launch to exit
QUICK_STEPS = 80
WINDOWS = "l_trans=2,l_per=60,settle=3,min_samples=8"
ND_PARAMS = "l_trans=2,l_per=10,min_reports=5,restart_cost=1"
PSLD_EPS = 0.1
SWEEP_EPS = (0.0, 0.05, 0.1, 0.2, 0.3)
RUN_TIMEOUT_S = 900.0

LINK = "300M"  # a healthy server's link, bytes/s: the slowed one's is LINK / factor
SLOW_A = f"slowdown:role=server,hosts={HOSTS[3]},factor=10,link={LINK}"
SLOW_B = f"slowdown:role=server,hosts={HOSTS[2]},{HOSTS[3]},factor=4,link={LINK}"
SCENARIOS = {
    "a": "one server 10x slower",
    "b": "two servers 4x slower",
    "c": "one server 10x slower for the middle third",
    "d": "no straggler",
    "e": "scale-out 2 -> 4 servers mid-run",
}
SLOW_SERVERS = {"a": [3], "b": [2, 3], "c": [3], "d": []}
NOT_BUILT = {"e": "measured on its own: benchmarks/psld.py --scale (psld-scale.md)"}
SCALE_AT = 1 / 3  # of rank 0's steps, when scenario e's scale is asked
COLUMNS = ("static", "proportional", "nd", "psld", "ideal")

TARGET_SPEEDUP = 2.86  # static / psld, scenario a
TARGET_OF_IDEAL = 1.15  # psld / ideal, scenario a
TARGET_PAUSE_S = 0.5  # p50 and max
TARGET_NO_STRAGGLER = 1.02  # psld / static, scenario d
# Scenario d runs this many static/psld pairs, alternating: one run of a
# configuration differed from another by up to 19 % on this oversubscribed
# machine (2 cores, 8 busy processes), so one pair cannot tell a 2 % overhead.
D_PAIRS = 3
# Scenario a's psld/ideal (1.15x, the closest call) the same way: ideal and psld
# alternating, back to back, at the start of the full run.
A_PAIRS = 3


@dataclass(frozen=True, slots=True)
class Spec:
    """One run: its scenario, its column (``eps=E`` for the sweep), policy, injections."""

    scenario: str
    column: str
    policy: str
    inject: tuple[str, ...] = ()
    servers: int = SERVERS
    scale_to: int = 0  # scenario e: the servers asked for mid-run (0: none)
    repeat: int = 0  # a pair's number (keys d:static, d:static#2, ...: scenarios a, d)

    @property
    def key(self) -> str:
        return f"{self.base_key}#{self.repeat + 1}" if self.repeat else self.base_key

    @property
    def base_key(self) -> str:
        return f"{self.scenario}:{self.column}"

    @property
    def psld_policy(self) -> bool:
        return self.policy.startswith("psld")


@dataclass(slots=True)
class Outcome:
    spec: Spec
    ok: bool
    train_s: float | None
    wall_s: float
    detail: dict[str, Any] = field(default_factory=dict)


def psld_policy(eps: float = PSLD_EPS) -> str:
    return f"psld:eps={eps:g},{WINDOWS}"


def d_key(column: str, repeat: int) -> str:
    """The key of scenario d's run of ``column`` in pair ``repeat`` (from 0)."""
    return Spec("d", column, "", repeat=repeat).key


def a_pair_keys(repeat: int) -> tuple[str, str]:
    """The keys of scenario a's pair ``repeat`` (from 0): (ideal, psld)."""
    return Spec("ideal", "ideal", "", repeat=repeat).key, Spec("a", "psld", "", repeat=repeat).key


def column_spec(scenario: str, column: str, inject: tuple[str, ...], *, repeat: int = 0) -> Spec:
    policy = {
        "static": "none",
        "proportional": f"psld:assign=proportional,{WINDOWS}",
        "nd": f"nd:{ND_PARAMS}",
        "psld": psld_policy(),
    }[column]
    return Spec(scenario, column, policy, inject, repeat=repeat)


def transient(ideal: Outcome | None, steps: int) -> str:
    """Scenario c's injection: 127.0.0.5 10x slower for the middle third of the
    ideal run's training loop (seconds since the job started)."""
    start = (ideal.detail.get("loop_start_job_s") if ideal else None) or 10.0
    train = (ideal.train_s if ideal else None) or steps * 0.3
    after, until = start + train / 3, start + 2 * train / 3
    return f"{SLOW_A},after={after:.1f},until={until:.1f}"


# ------------------------------------------------------------------ one run


def run_one(spec: Spec, steps: int, *, hostfile: Path, env: dict[str, str], work: Path) -> Outcome:
    name = spec.key.replace(":", "-").replace("=", "")
    run_dir = work / f"{name}-{time.monotonic_ns()}"
    out = run_dir.with_name(run_dir.name + "-out")
    out.mkdir(parents=True)
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "-H", str(hostfile),
        "--workers", str(WORKERS), "--servers", str(spec.servers), "--run-dir", str(run_dir),
        "--output", "none", "--policy", spec.policy,
        "--dataset-size", str(steps * GLOBAL_BATCH), "--shard-size", str(SHARD_SIZE),
        "--global-batch", str(GLOBAL_BATCH), "--ps-block-bytes", str(BLOCK_BYTES),
        "--control-interval", f"{CONTROL_INTERVAL_S:g}", "--env", "OMP_NUM_THREADS=1",
    ]  # fmt: skip
    for item in spec.inject:
        argv += ["--inject", item]
    argv += ["--workdir", str(REPO), str(WORKER), str(out)]
    argv += ["--step-s", f"{STEP_S:g}", "--lr", f"{LEARNING_RATE:g}"]
    load_before = os.getloadavg()[0]  # other work on the machine shows here
    asked: dict[str, Any] = {}
    scaler = None
    if spec.scale_to:
        at_step = max(1, int(steps * SCALE_AT))
        scaler = threading.Thread(
            target=scale_mid_run, args=(run_dir, at_step, spec.scale_to, env, asked), daemon=True
        )
        scaler.start()
    returncode, output, wall = timed_run(argv, env, timeout_s=RUN_TIMEOUT_S, cwd=REPO)
    if scaler is not None:
        scaler.join(60)
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((run_dir / "summary.json").read_text())
    result: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        result = json.loads((out / "result.json").read_text())
    # A restarted worker's unfinished shard goes back to the queue and is trained
    # again (DDS: at least once): duplicates then are expected. A reassignment
    # or a server move restarts no worker and must leave none.
    worker_restarts = sum(1 for r in summary.get("restarts") or [] if r.get("role") == "worker")
    ok = (
        returncode == 0
        and summary.get("status") == "succeeded"
        and (summary.get("duplicate_records") == 0 or worker_restarts > 0)
        and bool(result)
    )
    detail: dict[str, Any] = {
        "policy": spec.policy,
        "inject": list(spec.inject),
        "exit_code": returncode,
        "status": summary.get("status"),
        "duplicate_records": summary.get("duplicate_records"),
        "restarts": len(summary.get("restarts") or []),
        "worker_restarts": worker_restarts,
        "actions": summary.get("actions", {}),
        "steps": result.get("steps"),
        "final_loss": result.get("final_loss"),
        "loop_start_job_s": result.get("loop_start_job_s"),
        "model_bytes": result.get("model_bytes"),
        "run_dir": str(run_dir),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    with contextlib.suppress(OSError, ValueError):
        detail |= read_events(run_dir, result)
    if spec.scale_to:
        detail["scale_asked"] = asked
        ok = (
            ok and asked.get("exit_code") == 0 and detail.get("scale_done_servers") == spec.scale_to
        )
    if not ok:
        detail["error"] = output[-3000:]
    return Outcome(spec=spec, ok=ok, train_s=result.get("train_s"), wall_s=wall, detail=detail)


def scale_mid_run(
    run_dir: Path, at_step: int, servers: int, env: dict[str, str], asked: dict[str, Any]
) -> None:
    """Scenario e: once rank 0 reported step ``at_step``, ``dtlaunch scale
    --servers``; what it answered goes into ``asked``."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    events = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            for line in events.read_text().splitlines():
                e = json.loads(line)
                if e["kind"] == "reports" and e.get("rank") == 0 and max(e["step"]) >= at_step:
                    argv = [sys.executable, "-m", "dtlaunch", "scale", str(run_dir)]
                    argv += ["--servers", str(servers), "--timeout", "30"]
                    done = subprocess.run(
                        argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=90
                    )
                    asked.update(
                        at_wall=time.time(),
                        exit_code=done.returncode,
                        said=(done.stdout + done.stderr).strip()[-500:],
                    )
                    return
        time.sleep(0.2)


def read_events(run_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The reassignments, moves, maps and decisions of a run, and where its time went."""
    log = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    loop_start = result.get("loop_start_wall")

    def since_loop(event: dict[str, Any]) -> float | None:
        return round(event["wall"] - loop_start, 2) if loop_start else None

    servers_on = {
        e["rank"]: e["host"] for e in log if e["kind"] == "spawn" and e["role"] == "server"
    }
    decisions = [e for e in log if e["kind"] == "decision" and e.get("action")]
    acted = [e for e in decisions if e["action"] in ("REASSIGN_BLOCKS", "KILL_RESTART")]
    reassign = [e for e in log if e["kind"] == "ps_reassign"]
    done = [e for e in reassign if e.get("phase") == "done"]
    moves = [e for e in log if e["kind"] == "ps_move"]
    scaled = [e for e in log if e["kind"] == "ps_scale" and e.get("phase") == "done"]
    asked = [e for e in log if e["kind"] == "scale_servers"]
    maps = [e for e in log if e["kind"] == "ps_placement"]
    final_map = maps[-1] if maps else {}
    info: dict[str, Any] = {
        "server_hosts_at_end": {str(k): v for k, v in sorted(servers_on.items())},
        "reassignments": len(done),
        "reassign_failed": sum(1 for e in reassign if e.get("phase") == "failed"),
        "pauses_s": [e.get("pause_s") for e in done],
        "holds_s": [e.get("hold_s") for e in done],
        "reassign_took_s": [e.get("took_s") for e in done],
        "reassigned_blocks": [e.get("blocks") for e in done],
        "server_moves": [
            {"rank": e["rank"], "pause_s": e.get("pause_s"), "at_s": since_loop(e)}
            for e in moves
            if e.get("phase") == "moved"
        ],
        "map_version": final_map.get("version"),
        "bytes_per_server": final_map.get("bytes_per_server"),
        "first_map_bytes_per_server": maps[0].get("bytes_per_server") if maps else None,
        "decisions": [
            {"at_s": since_loop(e), "action": e["action"], "reason": e.get("reason", "")[:300]}
            for e in acted
        ],
        "first_action_s": since_loop(acted[0]) if acted else None,
        "scale_pauses_s": [e.get("pause_s") for e in scaled],
        "scale_took_s": [
            round(d["wall"] - a["wall"], 3) for a, d in zip(asked, scaled, strict=False)
        ],
        "scale_blocks": [e.get("blocks") for e in scaled],
        "scale_done_servers": scaled[-1]["servers"] if scaled else None,
        "scale_done_s": since_loop(scaled[-1]) if scaled else None,
        "last_reassign_done_s": since_loop(done[-1]) if done else None,
    }
    steps = result.get("step_ends") or []
    if loop_start and steps:
        ends = [t - loop_start for t in steps]
        info["mean_step_s"] = round(ends[-1] / len(ends), 4)
        settled = done or [m for m in moves if m.get("phase") == "moved"] or scaled
        if settled:
            cut = settled[-1]["wall"] - loop_start
            before = [t for t in ends if t <= cut]
            after = [t for t in ends if t > cut]
            if before:
                info["steps_before_last_change"] = len(before)
                info["mean_step_before_s"] = round(before[-1] / len(before), 4)
            if len(after) > 1:
                info["mean_step_after_s"] = round((after[-1] - after[0]) / (len(after) - 1), 4)
    return info


# ------------------------------------------------------------------ results


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


# The runs of the ideal configuration: static placement, no injection, --policy none.
IDEAL_CONFIGURATION = (
    *(a_pair_keys(r)[0] for r in range(A_PAIRS)),
    *(d_key("static", r) for r in range(D_PAIRS)),
)


def geometric_pairs(
    pairs: list[tuple[float | None, float | None]],
) -> tuple[float | None, list[float]]:
    """The geometric mean of the ratios ``a / b`` of pairs run back to back, and
    the ratios (pairs with a failed run left out)."""
    ratios = [r for a, b in pairs if (r := ratio(a, b)) is not None]
    return (round(statistics.geometric_mean(ratios), 4) if ratios else None), ratios


def summarize(outcomes: list[Outcome], steps: int, quick: bool) -> dict[str, Any]:
    by = {o.spec.key: o for o in outcomes}

    def train(key: str) -> float | None:
        o = by.get(key)
        return o.train_s if o and o.ok else None

    # Every run of the ideal configuration (static placement, no straggler,
    # --policy none: ``ideal`` first and d's ``static``) measures the same thing;
    # on this oversubscribed machine one such run varied by 20 % from another in
    # one invocation, so the ideal is their mean, each reported beside it.
    ideal_runs = [t for t in (train(key) for key in IDEAL_CONFIGURATION) if t is not None]
    ideal = statistics.fmean(ideal_runs) if ideal_runs else None
    ratios: dict[str, dict[str, Any]] = {}
    a_runs = [t for k in range(A_PAIRS) if (t := train(a_pair_keys(k)[1])) is not None]
    for sc in ("a", "b", "c"):
        # a: the mean of its psld runs (one per pair) against the other columns
        psld = statistics.fmean(a_runs) if sc == "a" and a_runs else train(f"{sc}:psld")
        ratios[sc] = {
            "static/psld": ratio(train(f"{sc}:static"), psld),
            "psld/ideal": ratio(psld, ideal),
            "proportional/psld": ratio(train(f"{sc}:proportional"), psld),
            "nd/psld": ratio(train(f"{sc}:nd"), psld),
            "static/ideal": ratio(train(f"{sc}:static"), ideal),
        }
    # a's psld/ideal, the target: the geometric mean over its pairs, each pair's
    # ideal and psld run back to back (the mean ideal above is the others' yardstick).
    ratios["a"]["psld/ideal"], ratios["a"]["pairs"] = geometric_pairs(
        [(train(p), train(i)) for i, p in map(a_pair_keys, range(A_PAIRS))]
    )
    ratios["a"]["psld_s"] = round(statistics.fmean(a_runs), 3) if a_runs else None
    ratios["d"] = {}
    # The geometric mean of the pairs' ratios: each pair ran back to back.
    ratios["d"]["psld/static"], ratios["d"]["pairs"] = geometric_pairs(
        [(train(d_key("psld", k)), train(d_key("static", k))) for k in range(D_PAIRS)]
    )
    pauses = [
        p
        for o in outcomes
        if o.spec.psld_policy
        for p in o.detail.get("pauses_s") or []
        if p is not None
    ]
    holds = [
        h
        for o in outcomes
        if o.spec.psld_policy
        for h in o.detail.get("holds_s") or []
        if h is not None
    ]
    pause = {
        "n": len(pauses),
        "p50": round(statistics.median(pauses), 4) if pauses else None,
        "max": round(max(pauses), 4) if pauses else None,
        "hold_p50": round(statistics.median(holds), 4) if holds else None,
        "hold_max": round(max(holds), 4) if holds else None,
    }
    met: dict[str, bool] = {}
    # Targets are judged where their runs ran (--only runs fewer).
    if a_runs and "a:static" in by:
        met["a: static/psld >= 2.86"] = (ratios["a"]["static/psld"] or 0) >= TARGET_SPEEDUP
    if ratios["a"]["pairs"]:
        met["a: psld/ideal <= 1.15"] = (ratios["a"]["psld/ideal"] or 1e9) <= TARGET_OF_IDEAL
    if any(o.spec.psld_policy and o.spec.scenario != "d" for o in outcomes):
        met["pause p50 <= 0.5 s"] = pause["p50"] is not None and pause["p50"] <= TARGET_PAUSE_S
        met["pause max <= 0.5 s"] = pause["max"] is not None and pause["max"] <= TARGET_PAUSE_S
    if "d:psld" in by:
        met["d: psld/static <= 1.02"] = (ratios["d"]["psld/static"] or 1e9) <= TARGET_NO_STRAGGLER
    model_bytes = next(
        (o.detail["model_bytes"] for o in outcomes if o.detail.get("model_bytes")), None
    )
    return {
        "setup": {
            "workers": WORKERS,
            "servers": SERVERS,
            "hosts": list(HOSTS),
            "spare": SPARE,
            "model_bytes": model_bytes,
            "block_bytes": BLOCK_BYTES,
            "global_batch": GLOBAL_BATCH,
            "steps": steps,
            "step_sleep_s": STEP_S,
            "optimizer": f"adam lr={LEARNING_RATE:g}",
            "control_interval_s": CONTROL_INTERVAL_S,
            "psld_windows": WINDOWS,
            "nd_params": ND_PARAMS,
            "quick": quick,
            "machine_cores": os.cpu_count(),
        },
        "scenarios": SCENARIOS,
        "not_built": NOT_BUILT,
        "runs": {
            o.spec.key: {"train_s": o.train_s, "wall_s": round(o.wall_s, 2), "ok": o.ok} | o.detail
            for o in outcomes
        },
        "ideal_s": {
            "mean": round(ideal, 3) if ideal is not None else None,
            "runs": {key: train(key) for key in IDEAL_CONFIGURATION if key in by},
        },
        "ratios": ratios,
        "pause_s": pause,
        "nd_move_pause_s": [
            m["pause_s"] for o in outcomes for m in o.detail.get("server_moves") or []
        ],
        "eps_sweep": {
            f"{eps:g}": train("a:psld" if eps == PSLD_EPS else f"a:eps={eps:g}")
            for eps in SWEEP_EPS
        },
        "targets": {
            "static_over_psld_a": TARGET_SPEEDUP,
            "psld_over_ideal_a": TARGET_OF_IDEAL,
            "pause_s": TARGET_PAUSE_S,
            "psld_over_static_no_straggler": TARGET_NO_STRAGGLER,
        },
        "met": met,
        "all_ok": all(o.ok for o in outcomes),
    }


def _mb(values: Any) -> str:
    if not values:
        return "-"
    items = values.values() if isinstance(values, dict) else values
    return " / ".join(f"{v / 1e6:.1f}" for v in items)


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _pauses(run: dict[str, Any]) -> str:
    pauses = [p for p in run.get("pauses_s") or [] if p is not None]
    moves = [m["pause_s"] for m in run.get("server_moves") or [] if m.get("pause_s") is not None]
    text = ", ".join(f"{p:.3f}" for p in pauses)
    if moves:
        text += ("; " if text else "") + "moves " + ", ".join(f"{p:.3f}" for p in moves)
    return text or "-"


def _actions(run: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((run.get("actions") or {}).items())) or "-"


def render_markdown(result: dict[str, Any]) -> str:
    setup, runs, pause = result["setup"], result["runs"], result["pause_s"]
    lines = [
        "# PSLD: parameter-server load distribution (benchmarks/psld.py)",
        "",
        f"{setup['workers']} workers x {setup['servers']} servers on loopback hosts "
        f"{setup['hosts'][0]}-{setup['hosts'][-1].rsplit('.', 1)[1]} (+ spare {setup['spare']} "
        f"for nd), model {(setup['model_bytes'] or 0) / 1e6:.1f} MB (one tensor 39.5 %), "
        f"{setup['block_bytes'] >> 20} MiB blocks, BSP, {setup['optimizer']} on the servers, "
        f"global batch {setup['global_batch']}, {setup['steps']} steps, "
        f"{setup['step_sleep_s'] * 1000:g} ms compute sleep a step, control interval "
        f"{setup['control_interval_s']:g} s; psld `{setup['psld_windows']}`, nd "
        f"`{setup['nd_params']}`; {setup['machine_cores']} cores."
        + (" Quick run: not the full benchmark." if setup["quick"] else ""),
        "",
        "train s: rank 0's training loop; first action / last change: seconds into the "
        "loop; step before/after: rank 0's mean step before and after the last "
        "reassignment (or server move); bytes per server: the final map, MB.",
        "",
        "| run | train s | wall s | ok | steps | actions | reassign | pauses s | first action s "
        "| last change s | step before / after s | bytes per server MB | final loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, run in runs.items():
        lines.append(
            f"| {key} | {_num(run['train_s'])} | {run['wall_s']:.1f} | "
            f"{'yes' if run['ok'] else 'NO'} | {run.get('steps') or '-'} | {_actions(run)} | "
            f"{run.get('reassignments', '-')} | "
            f"{_pauses(run)} | {_num(run.get('first_action_s'), '.1f')} | "
            f"{_num(run.get('last_reassign_done_s') or _last_move(run), '.1f')} | "
            f"{_num(run.get('mean_step_before_s'), '.3f')} / "
            f"{_num(run.get('mean_step_after_s'), '.3f')} | {_mb(run.get('bytes_per_server'))} | "
            f"{_num(run.get('final_loss'), '.5f')} |"
        )
    ideal = result.get("ideal_s") or {}
    lines += [
        "",
        "## Ratios (train s)",
        "",
        f"ideal: {_num(ideal.get('mean'))} s, the mean of every run of its configuration ("
        + ", ".join(f"{k} {_num(v)}" for k, v in (ideal.get("runs") or {}).items())
        + ").",
        "",
        "| scenario | static/psld | psld/ideal | proportional/psld | nd/psld "
        "| static/ideal (ceiling) |",
        "|---|---|---|---|---|---|",
    ]
    for sc in ("a", "b", "c"):
        r = result["ratios"][sc]
        lines.append(
            f"| {sc}: {SCENARIOS[sc]} | {_num(r['static/psld'], '.3f')} | "
            f"{_num(r['psld/ideal'], '.3f')} | {_num(r['proportional/psld'], '.3f')} | "
            f"{_num(r['nd/psld'], '.3f')} | {_num(r['static/ideal'], '.3f')} |"
        )
    a_pairs = result["ratios"]["a"].get("pairs") or []
    if len(a_pairs) > 1:
        lines += [
            "",
            f"a: psld/ideal is the geometric mean of {len(a_pairs)} pairs run back to back, "
            f"alternating ({', '.join(f'{p:.3f}' for p in a_pairs)}); a's other ratios "
            f"use the mean of its psld runs ({_num(result['ratios']['a'].get('psld_s'))} s).",
        ]
    lines += [
        "",
        f"d: {SCENARIOS['d']}: psld/static = {_num(result['ratios']['d']['psld/static'], '.3f')}"
        + (
            f", the geometric mean of {len(pairs)} pairs run back to back, alternating "
            f"({', '.join(f'{p:.3f}' for p in pairs)})"
            if len(pairs := result["ratios"]["d"].get("pairs") or []) > 1
            else ""
        ),
        "",
        f"e: {SCENARIOS['e']}: {NOT_BUILT['e']}.",
        "",
        f"Reassignment pauses over every psld-policy run: n={pause['n']}, "
        f"p50 {_num(pause['p50'], '.3f')} s, max {_num(pause['max'], '.3f')} s (from every "
        "source at the fence to the release); holds from the first source's hold, which "
        "include waiting for the slowest server to reach the fence: p50 "
        f"{_num(pause.get('hold_p50'), '.3f')} s, max {_num(pause.get('hold_max'), '.3f')} s."
        + (
            f" nd's server moves: {', '.join(f'{p:.3f}' for p in moves)} s."
            if (moves := [p for p in result["nd_move_pause_s"] if p is not None])
            else ""
        ),
    ]
    sweep = result["eps_sweep"]
    if any(v is not None for v in sweep.values()):
        static = runs.get("a:static", {}).get("train_s")
        lines += [
            "",
            "## eps sweep, scenario a (Fig. 19)",
            "",
            "| eps | train s | static / it | reassign | bytes per server MB |",
            "|---|---|---|---|---|",
        ]
        for eps, train in sweep.items():
            key = "a:psld" if float(eps) == PSLD_EPS else f"a:eps={eps}"
            run = runs.get(key, {})
            lines.append(
                f"| {eps} | {_num(train)} | {_num(ratio(static, train), '.3f')} | "
                f"{run.get('reassignments', '-')} | {_mb(run.get('bytes_per_server'))} |"
            )
    lines += ["", "## Targets", ""]
    lines += [f"- {name}: {'met' if ok else 'MISSED'}" for name, ok in result["met"].items()]
    if not result["all_ok"]:
        failed = [k for k, r in runs.items() if not r["ok"]]
        lines.append(f"- runs that failed: {', '.join(failed)}")
    return "\n".join(lines) + "\n"


def _last_move(run: dict[str, Any]) -> float | None:
    moves = run.get("server_moves") or []
    return moves[-1]["at_s"] if moves else None


# ------------------------------------------------------------------ driver


def plan(quick: bool) -> list[Spec | str]:
    """The runs in order; ``"c"`` stands for scenario c's runs, whose injection
    needs the ideal run's times."""
    ideal = Spec("ideal", "ideal", "none")
    if quick:
        return [ideal, *(column_spec("a", c, (SLOW_A,)) for c in ("psld", "static"))]
    return [
        # a's psld right after an ideal run, A_PAIRS times: its 1.15x target is the
        # closest call of the benchmark, and the machine's speed drifts over the
        # minutes a's static run takes (2.5 min, at 10x slow steps).
        *(
            spec
            for k in range(A_PAIRS)
            for spec in (
                Spec("ideal", "ideal", "none", repeat=k),
                column_spec("a", "psld", (SLOW_A,), repeat=k),
            )
        ),
        *(column_spec("a", c, (SLOW_A,)) for c in ("static", "proportional", "nd")),
        *(column_spec("b", c, (SLOW_B,)) for c in ("static", "proportional", "nd", "psld")),
        "c",
        *(
            spec
            for k in range(D_PAIRS)
            for spec in (
                Spec("d", "static", "none", repeat=k),
                Spec("d", "psld", psld_policy(), repeat=k),
            )
        ),
        *(Spec("a", f"eps={e:g}", psld_policy(e), (SLOW_A,)) for e in SWEEP_EPS if e != PSLD_EPS),
    ]


def scale_plan() -> list[Spec]:
    """Scenario e (``--scale``): fixed 2 and 4 servers, and each scaled mid-run."""
    return [
        Spec("e", "2", "none", servers=2),
        Spec("e", "2->4", "none", servers=2, scale_to=4),
        Spec("e", "4", "none", servers=4),
        Spec("e", "4->2", "none", servers=4, scale_to=2),
    ]


def render_scale(outcomes: list[Outcome], steps: int) -> tuple[dict[str, Any], str]:
    """Scenario e's results and their Markdown."""
    runs = {
        o.spec.key: {"train_s": o.train_s, "wall_s": round(o.wall_s, 2), "ok": o.ok} | o.detail
        for o in outcomes
    }
    train = {o.spec.column: o.train_s if o.ok else None for o in outcomes}
    ratios = {
        "2->4 / 2": ratio(train.get("2->4"), train.get("2")),
        "2->4 / 4": ratio(train.get("2->4"), train.get("4")),
        "4->2 / 4": ratio(train.get("4->2"), train.get("4")),
        "4->2 / 2": ratio(train.get("4->2"), train.get("2")),
    }
    result = {
        "scenario": SCENARIOS["e"],
        "setup": {
            "workers": WORKERS,
            "steps": steps,
            "scale_at": round(SCALE_AT, 3),
            "block_bytes": BLOCK_BYTES,
            "machine_cores": os.cpu_count(),
        },
        "runs": runs,
        "ratios": ratios,
        "all_ok": all(o.ok for o in outcomes),
    }
    lines = [
        "# PSLD scenario e: servers scaled while the job trains (benchmarks/psld.py --scale)",
        "",
        f"{WORKERS} workers, the psld benchmark's model ({BLOCK_BYTES >> 20} MiB blocks), BSP, "
        f"{steps} steps, no straggler, `--policy none`; `dtlaunch scale --servers` asked once "
        f"rank 0 trained {SCALE_AT:.0%} of its steps; {os.cpu_count()} cores.",
        "",
        "| run | train s | wall s | ok | restarts | duplicate records | scale pause s "
        "| command to map s | blocks moved | step before / after s | bytes per server MB "
        "| final loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, run in runs.items():
        lines.append(
            f"| {key} | {_num(run['train_s'])} | {run['wall_s']:.1f} | "
            f"{'yes' if run['ok'] else 'NO'} | {run.get('restarts', '-')} | "
            f"{run.get('duplicate_records', '-')} | "
            f"{', '.join(f'{p:.3f}' for p in run.get('scale_pauses_s') or []) or '-'} | "
            f"{', '.join(f'{p:.2f}' for p in run.get('scale_took_s') or []) or '-'} | "
            f"{', '.join(str(b) for b in run.get('scale_blocks') or []) or '-'} | "
            f"{_num(run.get('mean_step_before_s'), '.3f')} / "
            f"{_num(run.get('mean_step_after_s'), '.3f')} | {_mb(run.get('bytes_per_server'))} | "
            f"{_num(run.get('final_loss'), '.5f')} |"
        )
    lines += [
        "",
        "Ratios (train s): " + ", ".join(f"{k} = {_num(v, '.3f')}" for k, v in ratios.items()),
    ]
    if not result["all_ok"]:
        lines.append("- runs that failed: " + ", ".join(k for k, r in runs.items() if not r["ok"]))
    return result, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="scenario a: static, psld, ideal")
    parser.add_argument("--steps", type=int, default=None, help="steps per run")
    parser.add_argument("--only", default="", help="comma-separated run keys (debugging)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--scale", action="store_true", help="scenario e: servers scaled mid-run")
    args = parser.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if args.scale:
        return scale_main(args, steps)
    out = args.out or RESULTS / ("psld.quick.json" if args.quick else "psld.json")
    only = {k for k in args.only.split(",") if k}
    outcomes: list[Outcome] = []
    lines = [f"{h} slots=2 servers=1" for h in HOSTS] + [f"{SPARE} slots=2 spare"]
    with loopback_sshd((*HOSTS, SPARE), name="psld", keep=args.keep) as (server, work, env):
        hostfile = server.write_hostfile(work / "hosts", lines)
        for item in plan(args.quick):
            if item == "c":
                ideal = next((o for o in outcomes if o.spec.key == "ideal:ideal"), None)
                inject = (transient(ideal, steps),)
                specs = [
                    column_spec("c", c, inject) for c in ("static", "proportional", "nd", "psld")
                ]
            else:
                assert isinstance(item, Spec)
                specs = [item]
            for spec in specs:
                if only and spec.key not in only and spec.base_key not in only:
                    continue
                outcome = run_one(spec, steps, hostfile=hostfile, env=env, work=work)
                d = outcome.detail
                print(
                    f"{spec.key}: train {_num(outcome.train_s)} s, wall {outcome.wall_s:.1f} s, "
                    f"ok={outcome.ok}, actions {_actions(d)}, reassign {d.get('reassignments')} "
                    f"pauses {d.get('pauses_s')}, bytes {_mb(d.get('bytes_per_server'))}",
                    flush=True,
                )
                outcomes.append(outcome)
        if args.keep:
            print(f"run directories kept in {work}")
    result = summarize(outcomes, steps, args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(render_markdown(result))
    print(render_markdown(result))
    return 0 if result["all_ok"] and all(result["met"].values()) else 1


def scale_main(args: argparse.Namespace, steps: int) -> int:
    out = args.out or RESULTS / "psld-scale.json"
    outcomes: list[Outcome] = []
    lines = [f"{h} slots=2 servers=1" for h in HOSTS] + [f"{SPARE} slots=2 spare"]
    with loopback_sshd((*HOSTS, SPARE), name="psld-scale", keep=args.keep) as (server, work, env):
        hostfile = server.write_hostfile(work / "hosts", lines)
        for spec in scale_plan():
            outcome = run_one(spec, steps, hostfile=hostfile, env=env, work=work)
            d = outcome.detail
            print(
                f"{spec.key}: train {_num(outcome.train_s)} s, ok={outcome.ok}, "
                f"scale {d.get('scale_asked')}, pauses {d.get('scale_pauses_s')}, "
                f"bytes {_mb(d.get('bytes_per_server'))}",
                flush=True,
            )
            outcomes.append(outcome)
    result, markdown = render_scale(outcomes, steps)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
