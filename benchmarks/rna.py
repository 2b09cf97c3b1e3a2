"""RNA (randomized non-blocking allreduce, Middleware '20, §7-8): time to a target
loss against BSP, with injected random delays (issue 15).

One invocation runs, one after the other on this machine, ``benchmarks/rna_train.py``
(an MLP on a seeded synthetic classification task; see its docstring) with 8
workers on 8 loopback "hosts" (127.0.0.2-9, one slot each, a real sshd) in these
columns, per scenario:

    none      BSP allreduce under dtlaunch (--policy none; the trainer's synchronous step)
    torchrun  the same script under real torchrun (static equal partition by RANK)
    nd        dtlaunch --policy nd (AntDT-ND: batch-size balancing; no spare host)
    rna       dtlaunch --policy rna, its defaults (probes=2, staleness=8)
    rna-h     hierarchical RNA (§4): the same policy with --servers 1 (one built-in
              server on a ninth loopback host, 127.0.0.10), split=0.3 and windows of
              2/4 s: the workers are split into groups by iteration time, each runs
              RNA inside and exchanges through the server after every round

Every iteration is a balanced 50 ms of "compute" (the MLP's real forward and
backward, stretched by a sleep to 50 ms: the device time of a real model, the
same on every worker) plus the injected delay of the scenario (§8.1: "we
introduce system delay randomly ... on each process"), drawn from a per-rank
seeded RNG, so every column sees the same delays. Scenarios:

    a  uniform 0-50 ms on all 8 workers
    b  mixed: 0-50 ms on ranks 0-3, 50-100 ms on ranks 4-7 (groups A and B)
    c  no injected delay

Same script, data (32,000 records, one epoch: 250 BSP steps), initial model,
optimizer (SGD, lr 0.02, momentum 0.9) and global batch (128: 16 records per
worker and step) in every column; RNA scales the rate by contributors / 8 per
round itself, and (``momentum=auto``, its default) fades the momentum out for
gradients a round or more old, at the same step ``lr / (1 - momentum)``.

Time to target. Each job's training clock starts at its first global update
(rank 0's model changes for the first time: BSP's first step, RNA's first round;
start-up, imports and group formation are before it and reported apart, as the
wall time from launch). Rank 0 keeps a copy of its model every 50 ms (under RNA:
the newest global model it has) and evaluates them after training on a fixed
subset of the training set (4096 records). The target loss of a scenario is the
loss of the ``none`` column's curve at 60 % of its training time (interpolated),
fixed from that run before the others of the scenario are measured; a column's
time to target is the first time its curve is at or below it (interpolated
between copies). 60 %, not later: there the curve still falls steeply (a
copy-to-copy wobble of the loss moves the crossing by little), and a method
that needs more records per unit of loss (stale or averaged gradients; RNA
Table 4: 24 % more iterations than Horovod for ResNet50) still has 40 % of the
data left to get there.

Targets (the issue's, after RNA Fig. 6 and Table 3):

- a: none / rna time to target >= 1.7
- b: none / rna-h time to target >= 1.8
- c: rna's time to target <= 1.05 x none's
- a, b, c: rna's final test accuracy >= none's - 0.5 points; b: rna-h's too

split=0.3, not the paper's 1 (split while the slowest worker's mean iteration
time exceeds the fastest's by more than the mean): b's groups average ~75 and
~125 ms an iteration, zeta / v = 0.5, which the paper's rule keeps in one
group; its groups A and B in Fig. 6 "M" are split by construction.

    python benchmarks/rna.py [--quick] [--scenarios a,b,c] [--repeats N] [--out FILE.json] [--keep]

--quick: scenario a only (unless --scenarios), 100 steps instead of 250.
--repeats N: run each column N times per scenario and report medians.
Writes benchmarks/results/rna.json and rna.md (rna.quick.* with --quick); exits
1 when a counted target is missed or a run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.jobrun import loopback_sshd, timed_run  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SCRIPT = REPO / "benchmarks" / "rna_train.py"
WORKERS = 8
HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 2 + WORKERS))
SERVER_HOST = f"127.0.0.{2 + WORKERS}"  # rna-h's parameter server
COLUMNS = ("none", "torchrun", "nd", "rna", "rna-h")
RUN_COLUMNS = COLUMNS
RNA_COLUMNS = ("rna", "rna-h")
RNA_POLICY = "rna"
RNA_H_POLICY = "rna:split=0.3,l_trans=2,l_per=4"
TARGET_FRACTION = 0.6  # the target loss: none's loss at this share of its training time
TARGET_SPEEDUP_A = 1.7
TARGET_SPEEDUP_H = 1.8
TARGET_NO_DELAY = 1.05
TARGET_ACC_POINTS = 0.005
CONTROL_INTERVAL_S = 1.0
RUN_TIMEOUT_S = 600.0
DISCUSSION = "## Discussion"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    delay_ms: tuple[float, float]
    slow_ranks: tuple[int, ...] = ()
    slow_delay_ms: tuple[float, float] = (50.0, 100.0)

    def script_args(self) -> list[str]:
        args = ["--delay-ms", f"{self.delay_ms[0]:g},{self.delay_ms[1]:g}"]
        if self.slow_ranks:
            args += ["--slow-ranks", ",".join(map(str, self.slow_ranks))]
            args += ["--slow-delay-ms", f"{self.slow_delay_ms[0]:g},{self.slow_delay_ms[1]:g}"]
        return args


SCENARIOS = {
    "a": Scenario("a", "uniform 0-50 ms delay on all 8 workers", (0.0, 50.0)),
    "b": Scenario(
        "b", "mixed: 0-50 ms on ranks 0-3, 50-100 ms on ranks 4-7", (0.0, 50.0), (4, 5, 6, 7)
    ),
    "c": Scenario("c", "no injected delay", (0.0, 0.0)),
}


@dataclass(frozen=True, slots=True)
class Workload:
    records: int = 32_000  # 250 steps at the global batch
    epochs: int = 1
    test_records: int = 16_000
    eval_records: int = 4096
    global_batch: int = 128
    shard_size: int = 64  # 4 local batches: a short tail after nd's ADJUST_BS
    lr: float = 0.02
    momentum: float = 0.9
    seed: int = 1
    snapshot_s: float = 0.05
    compute_ms: float = 50.0

    @property
    def steps(self) -> int:
        return self.records * self.epochs // self.global_batch

    def script_args(self) -> list[str]:
        return [
            "--records", str(self.records), "--epochs", str(self.epochs),
            "--test-records", str(self.test_records), "--eval-records", str(self.eval_records),
            "--global-batch", str(self.global_batch), "--shard-size", str(self.shard_size),
            "--lr", f"{self.lr:g}", "--momentum", f"{self.momentum:g}",
            "--seed", str(self.seed), "--snapshot-s", f"{self.snapshot_s:g}",
            "--compute-ms", f"{self.compute_ms:g}",
        ]  # fmt: skip


FULL = Workload()
QUICK = Workload(records=12_800)


@dataclass(slots=True)
class Outcome:
    scenario: str
    column: str
    ok: bool
    wall_s: float
    ranks: list[dict[str, Any]] = field(default_factory=list)
    rna: dict[str, Any] | None = None  # from events.jsonl (--policy rna)
    actions: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def rank0(self) -> dict[str, Any]:
        return next((r for r in self.ranks if r.get("rank") == 0), {})

    def origin(self) -> float | None:
        r0 = self.rank0
        return r0.get("first_update") or r0.get("loop_start")

    def curve(self) -> list[tuple[float, float]]:
        """(seconds since the first global update, loss) of rank 0's copies."""
        t0 = self.origin()
        if t0 is None:
            return []
        return [(t - t0, loss) for t, _, loss in self.rank0.get("curve", []) if t >= t0]

    def train_s(self) -> float | None:
        t0, end = self.origin(), self.rank0.get("end")
        return end - t0 if t0 is not None and end is not None else None


# ------------------------------------------------------------------ runs


@contextlib.contextmanager
def loopback_cluster(keep: bool) -> Iterator[tuple[Path, dict[str, str], Path]]:
    """sshd on 127.0.0.2-10, a hostfile of one worker slot on each of 127.0.0.2-9
    (``hosts``) and one with 127.0.0.10's slot for a server beside it
    (``hosts-ps``, rna-h's), a scratch dir."""
    with loopback_sshd((*HOSTS, SERVER_HOST), name="rna", keep=keep) as (server, root, env):
        hostfile = server.write_hostfile(root / "hosts", [f"{h} slots=1" for h in HOSTS])
        server.write_hostfile(
            root / "hosts-ps",
            [*(f"{h} slots=1" for h in HOSTS), f"{SERVER_HOST} slots=1 servers=1"],
        )
        yield hostfile, env, root


def run_column(
    workload: Workload,
    scenario: Scenario,
    column: str,
    *,
    hostfile: Path,
    env: dict,
    work: Path,
    rna_policy: str = RNA_POLICY,
    rna_h_policy: str = RNA_H_POLICY,
) -> Outcome:
    out = work / f"{scenario.name}-{column}-{time.monotonic_ns()}"
    script_args = [*workload.script_args(), *scenario.script_args(), "--out", str(out / "ranks")]
    run_dir = out / "run"
    if column == "torchrun":
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(WORKERS), str(SCRIPT), "--torchrun", *script_args,
            "--job-start", repr(time.time()),
        ]  # fmt: skip
        run_env = {k: v for k, v in env.items() if not k.startswith("DTLAUNCH_")}
        run_env["OMP_NUM_THREADS"] = "1"
    else:
        hierarchical = column == "rna-h"
        argv = [
            sys.executable, "-m", "dtlaunch", "run",
            "-H", str(hostfile.with_name("hosts-ps") if hierarchical else hostfile),
            "--workers", str(WORKERS), *(["--servers", "1"] if hierarchical else []),
            "--run-dir", str(run_dir), "--output", "none",
            "--policy", {"rna": rna_policy, "rna-h": rna_h_policy}.get(column, column),
            "--control-interval", f"{CONTROL_INTERVAL_S:g}",
            "--env", "OMP_NUM_THREADS=1", "--workdir", str(REPO),
            str(SCRIPT), *script_args,
        ]  # fmt: skip
        run_env = env
    try:
        code, output, wall = timed_run(argv, run_env, timeout_s=RUN_TIMEOUT_S, cwd=REPO)
    except Exception as err:  # the timeout: the job was stopped
        return Outcome(scenario.name, column, False, RUN_TIMEOUT_S, error=repr(err))
    ranks = []
    for path in sorted((out / "ranks").glob("rank-*.json")):
        with contextlib.suppress(OSError, ValueError):
            ranks.append(json.loads(path.read_text()))
    outcome = Outcome(scenario.name, column, code == 0 and len(ranks) == WORKERS, wall, ranks)
    if column != "torchrun":
        summary: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            summary = json.loads((run_dir / "summary.json").read_text())
        outcome.actions = summary.get("actions", {}) or {}
        outcome.ok = outcome.ok and summary.get("status") == "succeeded"
        if column in RNA_COLUMNS:
            outcome.rna = rna_stats(run_dir, outcome)
    if not outcome.ok:
        outcome.error = output[-3000:]
    return outcome


def rna_stats(run_dir: Path, outcome: Outcome) -> dict[str, Any]:
    """Rounds, contributions and staleness from the run's ``rna_*`` events."""
    events = []
    with contextlib.suppress(OSError):
        for line in (run_dir / "events.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    reports = [e for e in events if e.get("kind") == "rna_rounds"]
    rounds = sum(int(e.get("rounds", 0)) for e in reports)
    per_rank: dict[int, int] = {}
    rounds_of: dict[int, int] = {}  # a rank's group's rounds (several groups under rna-h)
    for e in reports:
        for member, count in zip(e.get("members", []), e.get("contributions", []), strict=False):
            per_rank[int(member)] = per_rank.get(int(member), 0) + int(count)
            rounds_of[int(member)] = rounds_of.get(int(member), 0) + int(e.get("rounds", 0))
    sampled = [s for e in reports for s in e.get("sampled", [])]
    stale = [int(v) for s in sampled for v in s.get("staleness", [])]
    comm = [float(s.get("comm_s", 0.0)) for s in sampled]
    contributors = [len(s.get("contributors", [])) for s in sampled]
    responses = [float(e["response_s"]) for e in events if e.get("kind") == "rna_round"]
    groups = [e for e in events if e.get("kind") == "rna_group"]
    formed = next((e for e in groups if e.get("phase") == "formed"), None)
    t0, end = outcome.origin(), outcome.rank0.get("end")
    train = end - t0 if t0 is not None and end is not None else None
    first_join = next((e.get("wall") for e in groups if e.get("phase") == "opening"), None)
    partitions = [e for e in events if e.get("kind") == "rna_partition" and "refused" not in e]
    exchanges = [e for e in events if e.get("kind") == "rna_exchange"]
    return {
        "rounds": rounds,
        "groups": partitions[-1]["groups"] if partitions else None,
        "partitioned_at_s": round(partitions[0]["wall"] - t0, 2)
        if partitions and t0 is not None
        else None,
        "exchanges": max((int(e.get("exchanges", 0)) for e in exchanges), default=0),
        "exchange_s_median": round(statistics.median(float(e["seconds"]) for e in exchanges), 5)
        if exchanges
        else None,
        "rounds_per_s": round(rounds / train, 2) if train else None,
        "contributors_per_round": round(sum(per_rank.values()) / rounds, 2) if rounds else None,
        "share_by_rank": {
            r: round(c / rounds_of[r], 3) for r, c in sorted(per_rank.items()) if rounds_of[r]
        },
        "sampled_rounds": len(sampled),
        "sampled_contributors_mean": round(statistics.mean(contributors), 2)
        if contributors
        else None,
        "staleness_mean": round(statistics.mean(stale), 2) if stale else None,
        "staleness_max": max(stale) if stale else None,
        "staleness_hist": {str(v): stale.count(v) for v in sorted(set(stale))},
        "comm_s_median": round(statistics.median(comm), 5) if comm else None,
        "probe_response_s_median": round(statistics.median(responses), 5) if responses else None,
        "groups_formed": sum(1 for e in groups if e.get("phase") == "formed"),
        "group_opened_wall": first_join,
        "group_formed_wall": formed.get("wall") if formed else None,
    }


# ------------------------------------------------------------------ analysis


def loss_at(curve: list[tuple[float, float]], when: float) -> float | None:
    """The curve's loss at ``when`` (linear between copies)."""
    if not curve:
        return None
    for (t1, l1), (t2, l2) in itertools.pairwise(curve):
        if t1 <= when <= t2:
            return l1 if t2 == t1 else l1 + (l2 - l1) * (when - t1) / (t2 - t1)
    return curve[-1][1] if when >= curve[-1][0] else curve[0][1]


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first time the curve is at or below ``target`` (linear between copies)."""
    previous: tuple[float, float] | None = None
    for t, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return t
            t1, l1 = previous
            return t1 + (t - t1) * (l1 - target) / (l1 - loss)
        previous = (t, loss)
    return None


def target_from(outcome: Outcome) -> float | None:
    train = outcome.train_s()
    if not outcome.ok or not train:
        return None
    return loss_at(outcome.curve(), TARGET_FRACTION * train)


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _r(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if value is not None else None


def row(outcomes: list[Outcome], target: float | None) -> dict[str, Any]:
    """One column of one scenario: medians over its runs."""
    good = [o for o in outcomes if o.ok]
    ttt = [time_to(o.curve(), target) if target is not None else None for o in good]
    r0 = [o.rank0 for o in good]
    steps = [
        float(r["version"]) if o.column in RNA_COLUMNS else float(r["steps"])
        for o, r in zip(good, r0, strict=True)
    ]
    rna = [o.rna for o in good if o.rna]
    return {
        "runs": len(outcomes),
        "ok": len(good),
        "time_to_target_s": _r(_median(ttt) if all(t is not None for t in ttt) else None, 2),
        "time_to_target_runs": [_r(t, 2) for t in ttt],
        "train_s": _r(_median([o.train_s() for o in good]), 2),
        "wall_s": _r(_median([o.wall_s for o in good]), 1),
        "final_loss": _r(_median([r.get("final_loss") for r in r0]), 4),
        "test_acc": _r(_median([r.get("test_acc") for r in r0]), 4),
        "global_steps": _median(steps),
        "rounds_per_s": _r(_median([s.get("rounds_per_s") for s in rna]), 1) if rna else None,
        "contributors_per_round": _r(_median([s.get("contributors_per_round") for s in rna]), 2)
        if rna
        else None,
        "model_spread": _r(
            _median(
                [
                    max(r["final_loss"] for r in o.ranks) - min(r["final_loss"] for r in o.ranks)
                    for o in good
                ]
            ),
            6,
        ),
    }


def summarize(
    workload: Workload, scenarios: list[Scenario], outcomes: list[Outcome], quick: bool
) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    targets: dict[str, dict[str, Any]] = {}
    for sc in scenarios:
        mine = [o for o in outcomes if o.scenario == sc.name]
        base = [o for o in mine if o.column == "none"]
        target = _median([target_from(o) for o in base])
        cols: dict[str, Any] = {"target_loss": _r(target, 5)}
        for column in COLUMNS:
            runs = [o for o in mine if o.column == column]
            if runs:
                cols[column] = row(runs, target)
        none_t = (cols.get("none") or {}).get("time_to_target_s")
        ref = next((o for o in base if o.ok), None)
        for column in RUN_COLUMNS:
            entry = cols.get(column)
            if entry and none_t and entry.get("time_to_target_s"):
                entry["none_over_this"] = round(none_t / entry["time_to_target_s"], 3)
            if entry and ref is not None and entry.get("final_loss") is not None:
                # Sample efficiency: how far into its run (~ its data) none first
                # got to this column's final loss (1.0 or more: as good as none).
                reached = time_to(ref.curve(), entry["final_loss"])
                train = ref.train_s()
                entry["none_share_at_this_final_loss"] = (
                    round(reached / train, 3) if reached is not None and train else None
                )
        table[sc.name] = cols
        targets.update(judge(sc.name, cols))
    return {
        "mode": "quick" if quick else "full",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "workers": WORKERS,
        "workload": {**asdict(workload), "steps": workload.steps},
        "scenarios": {sc.name: asdict(sc) for sc in scenarios},
        "target_rule": f"none's loss at {TARGET_FRACTION:.0%} of its training time",
        "control_interval_s": CONTROL_INTERVAL_S,
        "table": table,
        "targets": targets,
        "runs": [
            {
                "scenario": o.scenario,
                "column": o.column,
                "ok": o.ok,
                "wall_s": round(o.wall_s, 2),
                "train_s": _r(o.train_s(), 3),
                "time_to_target_s": _r(time_to(o.curve(), table[o.scenario]["target_loss"]), 3)
                if table[o.scenario]["target_loss"] is not None
                else None,
                "startup_s": _r(o.origin() - o.rank0["job_start"], 2)
                if o.origin() and o.rank0.get("job_start")
                else None,
                "rna": o.rna,
                "actions": o.actions,
                "ranks": [{k: v for k, v in r.items() if k != "curve"} for r in o.ranks],
                "curve": _thin([[round(t, 3), round(loss, 5)] for t, loss in o.curve()]),
                "error": o.error or None,
            }
            for o in outcomes
        ],
    }


def _thin(points: list[list[float]], keep: int = 150) -> list[list[float]]:
    """At most about ``keep`` points of a curve for the JSON, the last one kept."""
    step = max(1, len(points) // keep)
    return points[::step] + ([points[-1]] if points and (len(points) - 1) % step else [])


def judge(name: str, cols: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's targets that apply to scenario ``name``; status PASS or MISS
    (NOT RUN: a column the run left out)."""
    none, rna, rna_h = cols.get("none") or {}, cols.get("rna") or {}, cols.get("rna-h")
    out: dict[str, dict[str, Any]] = {}

    def put(key: str, value: float | None, goal: str, passed: bool | None) -> None:
        status = "NOT RUN" if passed is None else "PASS" if passed else "MISS"
        out[f"{name}: {key}"] = {"value": value, "goal": goal, "status": status}

    speed = rna.get("none_over_this")
    if name == "a":
        put("none/rna time to target", speed, f">= {TARGET_SPEEDUP_A}",
            bool(speed and speed >= TARGET_SPEEDUP_A))  # fmt: skip
    if name == "b":
        speed_h = (rna_h or {}).get("none_over_this")
        put("none/rna-h time to target", speed_h, f">= {TARGET_SPEEDUP_H}",
            None if rna_h is None else bool(speed_h and speed_h >= TARGET_SPEEDUP_H))  # fmt: skip
        if rna_h is not None:
            acc_h = rna_h.get("test_acc")
            gap_h = round(none["test_acc"] - acc_h, 4) if none.get("test_acc") and acc_h else None
            put("none - rna-h test accuracy", gap_h, f"<= {TARGET_ACC_POINTS}",
                gap_h is not None and gap_h <= TARGET_ACC_POINTS)  # fmt: skip
    if name == "c":
        ratio = _r(1 / speed, 3) if speed else None
        put("rna/none time to target", ratio, f"<= {TARGET_NO_DELAY}",
            bool(ratio and ratio <= TARGET_NO_DELAY))  # fmt: skip
    if none.get("test_acc") is not None and rna.get("test_acc") is not None:
        gap = round(none["test_acc"] - rna["test_acc"], 4)
        put("none - rna test accuracy", gap, f"<= {TARGET_ACC_POINTS}", gap <= TARGET_ACC_POINTS)
    else:
        put("none - rna test accuracy", None, f"<= {TARGET_ACC_POINTS}", False)
    return out


# ------------------------------------------------------------------ report


def _f(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def table_lines(results: dict[str, Any]) -> list[str]:
    head = (
        "| scenario | column | time to target s | none / column | train s | wall s "
        "| final loss | none's run share at that loss | test acc | global steps | rounds/s "
        "| contributors/round |"
    )
    lines = [head, "|" + "---|" * 12]
    for name, cols in results["table"].items():
        label = f"{name} (target {_f(cols['target_loss'], '{:.4f}')})"
        for column in COLUMNS:
            entry = cols.get(column)
            if entry is None:
                continue
            ttt = entry["time_to_target_s"]
            ttt_text = _f(ttt) if ttt is not None else "not reached"
            if entry["ok"] < entry["runs"]:
                ttt_text += f" ({entry['runs'] - entry['ok']} failed)"
            lines.append(
                f"| {label} | {column} | {ttt_text} | {_f(entry.get('none_over_this'), '{:.2f}x')} "
                f"| {_f(entry['train_s'])} | {_f(entry['wall_s'], '{:.1f}')} "
                f"| {_f(entry['final_loss'], '{:.4f}')} "
                f"| {_f(entry.get('none_share_at_this_final_loss'), '{:.0%}')} "
                f"| {_f(entry['test_acc'], '{:.2%}')} "
                f"| {_f(entry['global_steps'], '{:.0f}')} | {_f(entry['rounds_per_s'], '{:.1f}')} "
                f"| {_f(entry['contributors_per_round'])} |"
            )
    return lines


def target_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for key, t in results["targets"].items():
        lines.append(f"- {key} = {_f(t['value'], '{:g}')} (goal {t['goal']}): {t['status']}")
    return lines


SENSITIVITY_FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def sensitivity(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """none / rna time to target for other target rules (none's loss at other shares
    of its run), from the curves in the JSON (thinned, a few copies a second), so
    the choice of 60 % can be judged. Medians over repeats. Not judged."""
    out: dict[str, dict[str, float | None]] = {}
    for name in results["table"]:
        runs = [r for r in results["runs"] if r["scenario"] == name and r["ok"]]
        nones = [r for r in runs if r["column"] == "none"]
        rnas = [r for r in runs if r["column"] == "rna"]
        row: dict[str, float | None] = {}
        for share in SENSITIVITY_FRACTIONS:
            targets = [loss_at([tuple(p) for p in r["curve"]], share * r["train_s"]) for r in nones]
            target = _median(targets)
            if target is None or not rnas:
                row[f"{share:g}"] = None
                continue
            t_none = _median([time_to([tuple(p) for p in r["curve"]], target) for r in nones])
            t_rna = [time_to([tuple(p) for p in r["curve"]], target) for r in rnas]
            ok = t_none and all(t is not None for t in t_rna)
            row[f"{share:g}"] = round(t_none / _median(t_rna), 3) if ok else None
        out[name] = row
    return out


def sensitivity_lines(results: dict[str, Any]) -> list[str]:
    table = sensitivity(results)
    shares = [f"{s:g}" for s in SENSITIVITY_FRACTIONS]
    lines = [
        "| scenario | " + " | ".join(f"target at {float(s):.0%}" for s in shares) + " |",
        "|" + "---|" * (len(shares) + 1),
    ]
    for name, row in table.items():
        cells = [_f(row[s], "{:.2f}x") if row[s] is not None else "not reached" for s in shares]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def render_text(results: dict[str, Any]) -> str:
    return "\n".join([*table_lines(results), "", *target_lines(results)])


def write_results(results: dict[str, Any], path: Path) -> Path:
    """The JSON and the Markdown beside it; a ``## Discussion`` section already in
    that Markdown (written by hand after a run) is kept at its end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    md = path.with_suffix(".md")
    discussion = ""
    with contextlib.suppress(OSError):
        old = md.read_text()
        if DISCUSSION in old:
            discussion = old[old.index(DISCUSSION) :]
    w = results["workload"]
    setup = (
        f"{results['workers']} workers on loopback hosts 127.0.0.2-9 (one slot each, a real "
        f"sshd), {results['cpus']} CPUs. MLP 32-64-64-8 on a seeded teacher-network "
        f"classification task ({w['records']} training records x {w['epochs']} epoch(s) = "
        f"{w['steps']} BSP steps, global batch {w['global_batch']}, shards of "
        f"{w['shard_size']}; test split {w['test_records']}), SGD lr {w['lr']:g} momentum "
        f"{w['momentum']:g} in every column; rna: --policy "
        f"{results.get('rna_policy', RNA_POLICY)} (defaults: probes=2, staleness=8, "
        "momentum=auto); "
        f"rna-h: --servers 1 (on 127.0.0.10) --policy "
        f"{results.get('rna_h_policy', RNA_H_POLICY)}; "
        f"nd with its defaults; --control-interval {results['control_interval_s']:g} s. "
        f"Target loss: {results['target_rule']}. Times from the first global update "
        "(rank 0's model); wall s = launch to exit."
    )
    scen = "; ".join(f"{k}: {SCENARIOS[k].title}" for k in results["table"])
    text = [
        f"# RNA benchmark ({results['mode']}, {results['date']}) (benchmarks/rna.py)",
        "",
        setup,
        "",
        f"Scenarios: {scen}.",
        "",
        *table_lines(results),
        "",
        "## Targets",
        "",
        *target_lines(results),
        "",
        "## none / rna time to target under other target rules",
        "",
        "The target loss as none's loss at other shares of its training time (not judged; "
        "from the curves in the JSON, a few copies a second, so within a few % of the "
        "table).",
        "",
        *sensitivity_lines(results),
        "",
    ]
    if discussion:
        text += [discussion.rstrip(), ""]
    md.write_text("\n".join(text))
    return md


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]),
    )
    parser.add_argument("--quick", action="store_true", help="scenario a, 100 steps")
    parser.add_argument("--scenarios", help="comma-separated subset of a,b,c")
    parser.add_argument("--columns", help="comma-separated subset of none,torchrun,nd,rna,rna-h")
    parser.add_argument("--repeats", type=int, default=1, help="runs per column (medians)")
    parser.add_argument("--out", type=Path, help="JSON file (default benchmarks/results/rna.json)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--render", type=Path, help="only rewrite the Markdown of this JSON (no runs)"
    )
    parser.add_argument("--lr", type=float, help="diagnosis: another rate, for every column")
    parser.add_argument(
        "--momentum", type=float, help="diagnosis: another momentum, for every column"
    )
    parser.add_argument(
        "--rna-policy", default=RNA_POLICY, help=f"the rna column's (default {RNA_POLICY})"
    )
    parser.add_argument(
        "--rna-h-policy", default=RNA_H_POLICY, help=f"the rna-h column's (default {RNA_H_POLICY})"
    )
    opts = parser.parse_args(argv)
    names = (
        opts.scenarios.split(",") if opts.scenarios else (["a"] if opts.quick else ["a", "b", "c"])
    )
    if not set(names) <= set(SCENARIOS):
        parser.error(f"--scenarios {opts.scenarios!r}: choose from a,b,c")
    opts.scenario_list = [SCENARIOS[n] for n in names]
    cols = opts.columns.split(",") if opts.columns else list(RUN_COLUMNS)
    if not set(cols) <= set(RUN_COLUMNS):
        parser.error(f"--columns {opts.columns!r}: choose from {','.join(RUN_COLUMNS)}")
    if "none" not in cols:
        parser.error("--columns must include none: it sets the target loss")
    opts.column_list = [c for c in RUN_COLUMNS if c in cols]
    if opts.repeats < 1:
        parser.error("--repeats must be 1 or more")
    if opts.out is None:
        opts.out = RESULTS / ("rna.quick.json" if opts.quick else "rna.json")
    return opts


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _say(o: Outcome) -> None:
    r0 = o.rank0
    state = "ok" if o.ok else f"FAILED: {o.error[-600:]}"
    extra = ""
    if o.rna:
        extra = (
            f" rounds={o.rna['rounds']} ({o.rna['rounds_per_s']}/s, "
            f"{o.rna['contributors_per_round']} contributors/round, "
            f"staleness mean {o.rna['staleness_mean']})"
        )
        if o.rna.get("groups"):
            extra += (
                f" groups={o.rna['groups']} at {o.rna['partitioned_at_s']} s, "
                f"{o.rna['exchanges']} exchanges (median {o.rna['exchange_s_median']} s)"
            )
    print(
        f"  {o.scenario} {o.column:<8} wall {o.wall_s:6.1f} s train {_f(o.train_s())} s "
        f"loss {_f(r0.get('final_loss'), '{:.4f}')} acc {_f(r0.get('test_acc'), '{:.4f}')} "
        f"steps {r0.get('steps')} version {r0.get('version')}{extra} "
        f"actions={o.actions or {}} {state}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.render:
        results = json.loads(opts.render.read_text())
        print(render_text(results))
        print(f"wrote {write_results(results, opts.render)}")
        return 0
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    workload = QUICK if opts.quick else FULL
    if opts.lr is not None:
        workload = replace(workload, lr=opts.lr)
    if opts.momentum is not None:
        workload = replace(workload, momentum=opts.momentum)
    outcomes: list[Outcome] = []
    began = time.monotonic()
    with loopback_cluster(opts.keep) as (hostfile, env, work):
        if opts.keep:
            print(f"run directories: {work}", flush=True)
        for sc in opts.scenario_list:
            print(f"scenario {sc.name}: {sc.title}", flush=True)
            for column in opts.column_list:  # none first: it sets the target
                for _ in range(opts.repeats):
                    outcome = run_column(
                        workload, sc, column, hostfile=hostfile, env=env, work=work,
                        rna_policy=opts.rna_policy, rna_h_policy=opts.rna_h_policy,
                    )  # fmt: skip
                    _say(outcome)
                    outcomes.append(outcome)
                if column == "none":
                    target = _median([target_from(o) for o in outcomes if o.scenario == sc.name])
                    print(f"  {sc.name} target loss: {_f(target, '{:.4f}')}", flush=True)
    results = summarize(workload, opts.scenario_list, outcomes, opts.quick)
    results["bench_wall_s"] = round(time.monotonic() - began, 1)
    results["repeats"] = opts.repeats
    results["rna_policy"] = opts.rna_policy
    results["rna_h_policy"] = opts.rna_h_policy
    print(render_text(results))
    md = write_results(results, opts.out)
    print(f"wrote {opts.out} and {md} ({results['bench_wall_s']:.0f} s)")
    counted = [t for t in results["targets"].values() if t["status"] != "NOT RUN"]
    ok = all(o.ok for o in outcomes) and all(t["status"] == "PASS" for t in counted)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
