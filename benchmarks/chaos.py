"""Chaos: real jobs hit by random faults at random instants, counted.

Each trial runs a real ``dtlaunch run`` (local agent, real processes, ZeroMQ,
WAL) of one job kind (``dds``, ``ps``, ``allreduce``: ``chaos_worker.py``)
and injects one fault kind ``--faults`` times, each at a random instant from
the job's first second on:

- ``kill-worker`` / ``kill-server`` / ``kill-agent``: SIGKILL of one such process
- ``stop-worker`` / ``stop-server`` / ``stop-agent``: SIGSTOP for 1-4 s, then SIGCONT
- ``kill-supervisor``: SIGKILL of the supervisor, then ``dtlaunch run --resume``
- ``stop-supervisor``: SIGSTOP of the supervisor for 1-4 s, then SIGCONT
- ``cut-agent-2s`` / ``cut-agent-30s``: the network link of a host that runs
  workers is cut for 2 s or 30 s (``--plan`` or ``--net``). These trials run over
  SSH on three hosts in network namespaces (``tests/netns.py``: sshd in each, a
  veth pair to a bridge; the cut takes the link down); the third host is a
  ``spare``. A host cut off past its SSH keepalives is lost, its workers restart
  on the spare, and when the link comes back its stale processes are stopped
  (``fenced``) so that no rank runs twice; the table counts the fenced attempts.

Every trial is bounded (``--bound`` seconds per supervisor run): a run that
does not end in time is a *hang*, stopped and counted. After each trial the
ledger (the record ids every attempt of every rank trained, flushed before
``job.step()``) gives the records *lost* (never trained; none allowed) and the
*duplicates* (trained again after a fault: the at-least-once price), and
no process of the trial may be left behind. *Recovery* is what the faults cost:
the trial's wall time less the median fault-free time of its job kind (measured
in the same run), per fault.

    python benchmarks/chaos.py --trials 24 --faults 1          # quick look
    python benchmarks/chaos.py --faults-total 2000 --out benchmarks/results/chaos.json

Prints a table per fault kind and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/netns.py: the namespace hosts of the cut faults
WORKER = Path(__file__).resolve().parent / "chaos_worker.py"

JOBS: dict[str, dict[str, Any]] = {
    # records, shard, global batch, step seconds, extra run options
    "dds": {"records": 600, "shard": 20, "batch": 20, "step": 0.02, "opts": []},
    "ps": {"records": 600, "shard": 20, "batch": 20, "step": 0.02, "opts": ["--servers", "2"]},
    "allreduce": {"records": 600, "shard": 20, "batch": 20, "step": 0.02, "opts": []},
}
FAULTS: dict[str, tuple[str, ...]] = {
    "dds": ("kill-worker", "stop-worker", "kill-agent", "stop-agent", "kill-supervisor",
            "stop-supervisor"),
    "ps": ("kill-worker", "kill-server", "stop-server", "kill-supervisor"),
    "allreduce": ("kill-worker", "stop-worker", "kill-supervisor"),
}  # fmt: skip
NET_FAULTS = ("cut-agent-2s", "cut-agent-30s")  # every job kind; need root and ip netns
NET_HOSTS = ("slots=2", "slots=2", "slots=2 spare")
NET_INTERFACE = "dtlnet0"  # tests/netns.py's INTERFACE, for torch.distributed's Gloo
# Long enough that a 30 s cut ends with the agent still running (so it is fenced
# on its return), short enough that an agent cut off at the job's end stops soon.
NET_ORPHAN_TIMEOUT_S = 35.0
WORKERS = 2
STOP = threading.Event()  # set when the harness is interrupted: every lane stops


@dataclass
class Trial:
    job: str
    fault: str
    planned: int
    injected: int = 0
    supervisor_runs: int = 0
    succeeded: bool = False
    hung: bool = False
    lost: int = 0
    duplicates: int = 0
    left_behind: int = 0
    fenced: int = 0  # stale attempts stopped when a cut-off host came back
    wall_s: float = 0.0
    detail: str = ""
    instants: list[float] = field(default_factory=list)


def run_options(job: str, run_dir: Path, ledger: Path, hostfile: Path | None = None) -> list[str]:
    spec = JOBS[job]
    hosts: list[str] = []
    if hostfile is not None:
        hosts = ["-H", str(hostfile), "--orphan-timeout", str(NET_ORPHAN_TIMEOUT_S)]
        hosts += ["--env", f"GLOO_SOCKET_IFNAME={NET_INTERFACE}"]
    return [
        "run", *hosts, "--workers", str(WORKERS), *spec["opts"], "--run-dir", str(run_dir),
        "--dataset-size", str(spec["records"]), "--shard-size", str(spec["shard"]),
        "--global-batch", str(spec["batch"]), "--epochs", "1",
        "--max-restarts", "50", "--restart-scope", "process" if job != "allreduce" else "group",
        "--heartbeat-interval", "0.5", "--dead-after", "4", "--kill-grace", "2",
        "--stall-timeout", "30", "--output", "none",
        str(WORKER), job, str(ledger), str(spec["step"]),
    ]  # fmt: skip


def start(argv: list[str], log: Path, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra_env}
    env.pop("DTLAUNCH_HOSTS", None)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dtlaunch", *argv],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def cut_targets(cluster: Any) -> list[str]:
    """The namespace hosts a cut may hit: those running a worker or a server."""
    found = []
    for address in cluster.addresses:
        for pid in cluster.pids(address):
            try:
                cmd = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if "chaos_worker.py" in cmd or "dtlaunch.ps" in cmd:
                found.append(address)
                break
    return found


def targets(supervisor: subprocess.Popen[bytes], fault: str) -> list[psutil.Process]:
    """The live processes a fault may hit, found in the supervisor's tree."""
    role = fault.split("-")[1]
    if role == "supervisor":
        return [psutil.Process(supervisor.pid)]
    try:
        tree = psutil.Process(supervisor.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in tree:
        try:
            cmd = " ".join(proc.cmdline())
            if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED):
                continue
        except psutil.Error:
            continue
        wanted = {
            "agent": "dtlaunch.agent" in cmd,
            "server": "dtlaunch.ps" in cmd and "chaos_worker" not in cmd,
            "worker": "chaos_worker.py" in cmd,
        }
        if wanted.get(role, False):
            found.append(proc)
    return found


def ledger_counts(ledger: Path) -> collections.Counter[int]:
    counts: collections.Counter[int] = collections.Counter()
    for path in ledger.glob("*.txt"):
        for line in path.read_text().splitlines():
            counts.update(int(x) for x in line.split())
    return counts


class Tree:
    """Every process a trial's supervisors started, seen while it ran, so that any
    left behind at the end (an orphaned agent, a worker) is found by pid."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}  # pid -> create time

    def look(self, supervisor: subprocess.Popen[bytes]) -> None:
        try:
            root = psutil.Process(supervisor.pid)
            for proc in [root, *root.children(recursive=True)]:
                self.seen.setdefault(proc.pid, proc.create_time())
        except psutil.Error:
            pass

    def alive(self) -> list[psutil.Process]:
        out = []
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except psutil.Error:
                continue
        return out


def run_trial(job: str, fault: str, faults: int, rng: random.Random, bound_s: float,
              window_s: float, workdir: Path) -> Trial:  # fmt: skip
    if not fault.startswith("cut-"):
        return _run_trial(job, fault, faults, rng, bound_s, window_s, workdir, None)
    from tests.netns import running_cluster

    with running_cluster(len(NET_HOSTS)) as cluster:
        return _run_trial(job, fault, faults, rng, bound_s, window_s, workdir, cluster)


def _run_trial(job: str, fault: str, faults: int, rng: random.Random, bound_s: float,
               window_s: float, workdir: Path, cluster: Any) -> Trial:  # fmt: skip
    trial = Trial(job=job, fault=fault, planned=faults)
    run_dir, ledger, log = workdir / "run", workdir / "ledger", workdir / "console.log"
    ledger.mkdir(parents=True)
    hostfile, env = None, {}
    if cluster is not None:
        hostfile = workdir / "hosts"
        lines = zip(cluster.addresses, NET_HOSTS, strict=True)
        hostfile.write_text("".join(f"{address} {keys}\n" for address, keys in lines))
        env = cluster.env()
    started = time.monotonic()
    options = run_options(job, run_dir, ledger, hostfile)
    supervisor = start(options, log, env)
    tree = Tree()
    trial.supervisor_runs = 1
    # Random instants from launch on; each next one a random gap after the last
    # fault, so several faults spread over the job instead of piling up at the
    # instant its first process appears.
    # A lone fault falls within the job's usual run time, not after it ends.
    gap = window_s if faults <= 1 else 2.0 * window_s / faults
    due = [rng.uniform(0.3, max(0.4, gap))] if faults else []
    run_started = started
    try:
        while True:
            if STOP.is_set():
                raise KeyboardInterrupt
            tree.look(supervisor)
            if supervisor.poll() is not None:
                if trial.fault == "kill-supervisor" and supervisor.returncode == -signal.SIGKILL:
                    # Killed before job.json: nothing ran; the same command starts it.
                    resumable = (run_dir / "job.json").exists()
                    again = ["run", "--resume", str(run_dir)] if resumable else options
                    supervisor = start(again, log, env)
                    trial.supervisor_runs += 1
                    run_started = time.monotonic()
                    continue
                break
            now = time.monotonic()
            if now - run_started > bound_s:
                trial.hung = True
                trial.detail = (
                    f"no end within {bound_s:.0f} s of supervisor run {trial.supervisor_runs}"
                )
                break
            if due and now - started >= due[0]:
                if cluster is not None:
                    hosts = cut_targets(cluster)
                    hit: list[Any] = [(cluster, address) for address in hosts]
                else:
                    hit = targets(supervisor, fault)
                if hit:
                    victim = rng.choice(hit)
                    trial.instants.append(round(now - started, 2))
                    trial.injected += 1
                    inject(victim, fault, rng)
                    due = (
                        [time.monotonic() - started + rng.uniform(0.2, max(0.3, gap))]
                        if trial.injected < faults
                        else []
                    )
                    continue
            time.sleep(0.05)
    except BaseException:  # interrupted: nothing of this trial may outlive the harness
        for proc in tree.alive():
            if proc.pid != supervisor.pid:
                proc.kill()
        raise
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGCONT)
            supervisor.send_signal(signal.SIGTERM)
            try:
                supervisor.wait(30)
            except subprocess.TimeoutExpired:
                supervisor.kill()
                supervisor.wait()
    trial.wall_s = time.monotonic() - started
    trial.succeeded = supervisor.returncode == 0 and not trial.hung
    counts = ledger_counts(ledger)
    records = JOBS[job]["records"]
    if trial.succeeded:
        trial.lost = sum(1 for r in range(records) if counts[r] == 0)
    trial.duplicates = sum(counts.values()) - len(counts)
    trial.fenced = sum(1 for e in run_events(run_dir) if e.get("kind") == "fenced")
    trial.left_behind = count_left_behind(tree, cluster)
    if not trial.succeeded and not trial.detail:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        trial.detail = " | ".join(tail)[-400:]
    return trial


def run_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def count_left_behind(tree: Tree, cluster: Any) -> int:
    """Processes of the trial still alive once the supervisor has ended: none
    may be. The supervisor stops every agent and process before it exits; allow
    a beat for the kernel to reap them. An agent that was cut off when the job
    ended cannot be told to stop: it stops its processes by itself after the
    orphan timeout, which bounds the wait for the namespace hosts."""
    deadline = time.monotonic() + 5.0
    while (left := tree.alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    stray: list[int] = []
    if cluster is not None:
        deadline = time.monotonic() + NET_ORPHAN_TIMEOUT_S + 10.0
        while (stray := [p for a in cluster.addresses for p in cluster.pids(a)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
    for proc in left:  # never leave them to the next trial
        try:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        except psutil.Error:
            pass
    return len(left) + len(stray)  # (the namespace's are killed with the cluster)


def inject(victim: Any, fault: str, rng: random.Random) -> None:
    kind = fault.split("-", 1)[0]
    if kind == "cut":
        cluster, address = victim
        cluster.cut(address)
        try:
            time.sleep(float(fault.rpartition("-")[2].rstrip("s")))
        finally:
            cluster.heal(address)
        return
    try:
        if kind == "kill":
            victim.send_signal(signal.SIGKILL)
        else:
            victim.send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(1.0, 4.0))
            victim.send_signal(signal.SIGCONT)
    except psutil.NoSuchProcess:
        pass  # it ended on its own meanwhile: the fault still counts as tried


def baseline_key(job: str, fault: str) -> str:
    """Cut trials run over SSH on namespace hosts: their own fault-free time."""
    return f"{job}@netns" if fault.startswith("cut-") else job


def summarise(trials: list[Trial], baseline: dict[str, float]) -> dict[str, Any]:
    by_kind: dict[str, dict[str, Any]] = {}
    for name in sorted({f"{t.job}:{t.fault}" for t in trials}):
        group = [t for t in trials if f"{t.job}:{t.fault}" == name]
        base = baseline_key(group[0].job, group[0].fault)
        recoveries = [
            max(0.0, t.wall_s - baseline[base]) / t.injected
            for t in group
            if t.succeeded and t.injected and base in baseline
        ]
        by_kind[name] = {
            "runs": len(group),
            "faults": sum(t.injected for t in group),
            "succeeded": sum(t.succeeded for t in group),
            "hung": sum(t.hung for t in group),
            "records_lost": sum(t.lost for t in group),
            "duplicates": sum(t.duplicates for t in group),
            "left_behind": sum(t.left_behind for t in group),
            "fenced": sum(t.fenced for t in group),
            "median_recovery_s": round(statistics.median(recoveries), 2) if recoveries else None,
        }
    return by_kind


def totals_of(trials: list[Trial]) -> dict[str, int]:
    return {
        "trials": len(trials),
        "faults": sum(t.injected for t in trials),
        "succeeded": sum(t.succeeded for t in trials),
        "hung": sum(t.hung for t in trials),
        "records_lost": sum(t.lost for t in trials),
        "left_behind": sum(t.left_behind for t in trials),
    }


def write_results(
    args: argparse.Namespace, trials: list[Trial], baseline: dict[str, float], *, partial: bool
) -> None:
    result = {
        "partial": partial,  # true: the run was stopped before its planned end
        "machine": {"cpus": os.cpu_count()},
        "args": {k: str(v) for k, v in vars(args).items()},
        "baseline_s": {k: round(v, 2) for k, v in baseline.items()},
        "by_fault": summarise(trials, baseline),
        "totals": totals_of(trials),
        "trials": [asdict(t) for t in trials],
    }
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out)


def markdown(result: dict[str, Any]) -> str:
    """The README's table from a results file."""
    rows = [
        "| job: fault | runs | faults | succeeded | hung | records lost | trained twice "
        "| left behind | fenced | median recovery (s/fault) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in result["by_fault"].items():
        rows.append(
            f"| {name} | {row['runs']} | {row['faults']} | {row['succeeded']} | {row['hung']} "
            f"| {row['records_lost']} | {row['duplicates']} | {row['left_behind']} "
            f"| {row.get('fenced', 0)} "
            f"| {row['median_recovery_s'] if row['median_recovery_s'] is not None else '-'} |"
        )
    t = result["totals"]
    rows.append(
        f"| **all** | {t['trials']} | {t['faults']} | {t['succeeded']} | {t['hung']} "
        f"| {t['records_lost']} | | {t['left_behind']} | | |"
    )
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=12, help="trials (faulted jobs)")
    parser.add_argument("--faults", type=int, default=1, help="faults per trial")
    parser.add_argument("--faults-total", type=int, default=0,
                        help="run trials until this many faults were injected")  # fmt: skip
    parser.add_argument("--jobs", default="dds,ps,allreduce")
    parser.add_argument("--baseline", type=int, default=1, help="fault-free runs per job kind")
    parser.add_argument("--bound", type=float, default=120.0, help="seconds per supervisor run")
    parser.add_argument(
        "--plan", default="", help="job:fault,... e.g. dds:kill-agent,ps:kill-server"
    )
    parser.add_argument("--net", action="store_true",
                        help=f"add the cuts {NET_FAULTS} to every job kind's turn")  # fmt: skip
    parser.add_argument("--keep-failed", type=Path, default=None,
                        help="copy the run dir of every failed or hung trial here")  # fmt: skip
    parser.add_argument("--parallel", type=int, default=1,
                        help="trials at once (recovery then includes contention)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None,
                        help="print a results file as a Markdown table and exit")  # fmt: skip
    args = parser.parse_args()
    if args.report is not None:
        print(markdown(json.loads(args.report.read_text())), end="")
        return 0

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # each trial stops its supervisor on the way out

    signal.signal(signal.SIGTERM, interrupted)
    rng = random.Random(args.seed)
    jobs = [j for j in args.jobs.split(",") if j]
    # Job kinds take turns, each going through its fault kinds: a short run
    # still covers every job kind.
    kinds = {job: FAULTS[job] + (NET_FAULTS if args.net else ()) for job in FAULTS}
    rounds = max(len(kinds[job]) for job in jobs)
    plan = [(job, kinds[job][r % len(kinds[job])]) for r in range(rounds) for job in jobs]
    if args.plan:
        plan = [(item.partition(":")[0], item.partition(":")[2]) for item in args.plan.split(",")]
        unknown = [
            f"{j}:{f}" for j, f in plan if j not in FAULTS or f not in FAULTS[j] + NET_FAULTS
        ]
        if unknown:
            parser.error(
                f"--plan: unknown {', '.join(unknown)}; choose from {FAULTS} "
                f"and, for every job kind, {NET_FAULTS}"
            )
        jobs = sorted({job for job, _ in plan})
    trials: list[Trial] = []
    baseline: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="dtlaunch-chaos-") as tmp:
        root = Path(tmp)
        # One fault-free kind per baseline: "none-none" locally, "cut-none-0s" over
        # SSH on the namespace hosts (the cut trials' setting, cut for 0 s).
        needed = {baseline_key(job, fault): (job, fault) for job, fault in plan}
        for key, (job, fault) in sorted(needed.items()):
            walls = []
            clean_fault = "cut-none-0s" if fault.startswith("cut-") else "none-none"
            for i in range(args.baseline):
                workdir = root / f"base-{key.replace('@', '-')}-{i}"
                clean = run_trial(job, clean_fault, 0, rng, args.bound, 1.0, workdir)
                if not clean.succeeded:
                    print(f"fault-free {key} run failed: {clean.detail}", file=sys.stderr)
                    return 1
                walls.append(clean.wall_s)
            if walls:  # --baseline 0: no recovery figures, faults within the first 3 s
                baseline[key] = statistics.median(walls)
                print(f"baseline {key}: {baseline[key]:.1f} s", flush=True)
        lock = threading.Lock()
        next_index = [0]

        def lane(number: int) -> None:
            # One lane replays the seed's sequence; more lanes each have their own.
            lane_rng = rng if args.parallel == 1 else random.Random(args.seed * 1000 + number)
            while not STOP.is_set():
                with lock:
                    enough = (
                        sum(t.injected for t in trials) >= args.faults_total
                        if args.faults_total
                        else next_index[0] >= args.trials
                    )
                    if enough:
                        return
                    index = next_index[0]
                    next_index[0] += 1
                job, fault = plan[index % len(plan)]
                base = baseline_key(job, fault)
                window = max(1.0, 0.8 * baseline[base]) if base in baseline else 3.0
                faults = 1 if fault.startswith("cut-") else args.faults  # a cut is long
                workdir = root / f"t{index}"
                trial = run_trial(job, fault, faults, lane_rng, args.bound, window, workdir)
                with lock:
                    record(index, trial, workdir)

        def record(index: int, trial: Trial, workdir: Path) -> None:
            trials.append(trial)
            state = "ok" if trial.succeeded else ("HUNG" if trial.hung else "FAILED")
            if state != "ok" and args.keep_failed is not None:
                shutil.copytree(
                    workdir, args.keep_failed / f"{workdir.name}-{trial.job}-{trial.fault}"
                )
            print(
                f"[{index:4d}] {trial.job:9s} {trial.fault:15s} x{trial.injected} "
                f"at {trial.instants} -> {state} {trial.wall_s:.1f}s lost={trial.lost} "
                f"dup={trial.duplicates} left={trial.left_behind} fenced={trial.fenced} "
                f"{trial.detail if state != 'ok' else ''}",
                flush=True,
            )
            if args.out is not None:  # a long run stopped early still leaves its figures
                write_results(args, trials, baseline, partial=True)

        if args.parallel == 1:
            lane(0)
        else:
            lanes = [threading.Thread(target=lane, args=(n,)) for n in range(args.parallel)]
            for thread in lanes:
                thread.start()
            try:
                for thread in lanes:
                    while thread.is_alive():
                        thread.join(0.5)
            except BaseException:
                STOP.set()  # each lane stops its trial's processes on the way out
                for thread in lanes:
                    thread.join()
                raise
    table = summarise(trials, baseline)
    print(f"\n{'job:fault':28s} runs faults ok hung lost dups left recovery_s")
    for name, row in table.items():
        print(
            f"{name:28s} {row['runs']:4d} {row['faults']:6d} {row['succeeded']:2d} "
            f"{row['hung']:4d} {row['records_lost']:4d} {row['duplicates']:4d} "
            f"{row['left_behind']:4d} {row['median_recovery_s']}"
        )
    totals = totals_of(trials)
    print(f"\ntotals: {totals}")
    if args.out is not None:
        write_results(args, trials, baseline, partial=False)
    ok = totals["hung"] == 0 and totals["records_lost"] == 0 and totals["left_behind"] == 0
    return 0 if ok and totals["succeeded"] == totals["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
