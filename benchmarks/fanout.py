"""SSH fan-out (issue 18): `dtlaunch check` and a launch on many loopback hosts.

One invocation starts, for each size N, ceil(N/16) real OpenSSH sshds (one sshd
listens on at most 16 addresses), N loopback "hosts" 127.0.1.1, 127.0.1.2, ...
(127.0.2.0 is the 256th), one ssh_config and known_hosts that reach them all,
and measures, one after the other on this machine:

    check       `dtlaunch check -H HOSTFILE --ssh-concurrency C` (wall time of the
                command, its start-up included; every host must pass)
    sequential  a loop of `ssh HOST PYTHON -c PROBE` one host after the other,
                PROBE doing what check does on a host: Python version, `import
                dtlaunch` and its version, the workdir, two free ports
    pdsh        `pdsh -R ssh -f C -w ^HOSTFILE PYTHON -c PROBE` (Debian's pdsh;
                installed with apt-get when missing and we are root, else the
                column says why it is not available)
    launch      `dtlaunch run -H HOSTFILE --nproc-per-node 1` of a worker that
                only sleeps: seconds from the command's start to the last of the
                N workers' `running` events in events.jsonl (their wall time); the
                job is then stopped with SIGTERM, which is timed too

Targets at N=256: check <= 10 s and >= 5x faster than the sequential loop;
launch to all running <= 30 s.

    python benchmarks/fanout.py [--quick] [--sizes 64,256] [--concurrency 64]
                                [--out FILE.json] [--keep]

--quick: N=16 only (one sshd), for `make test-slow`. Writes JSON and the Markdown
table beside it (default benchmarks/results/fanout[.quick].json). Wrap full runs
in `flock /tmp/dtlaunch-bench.lock` when others measure on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.jobrun import timed_run  # noqa: E402
from dtlaunch.config import DEFAULT_SSH_CONCURRENCY  # noqa: E402
from dtlaunch.version import __version__  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SIZES = (64, 256)
QUICK_SIZES = (16,)
HOSTS_PER_SSHD = 16
TARGET_CHECK_S = 10.0
TARGET_CHECK_SPEEDUP = 5.0
TARGET_LAUNCH_S = 30.0
TARGET_AT = 256
STEP_TIMEOUT_S = 600.0
MARKER = "DTLAUNCH-PROBE "
# Debian's bash sources ~/.bashrc for every command sshd runs (when SHLVL < 1);
# this machine's root ~/.bashrc runs `pyenv init` (about 0.16 s and 0.18 s of CPU
# per remote command), the same for every column. Sessions as a fresh cluster
# login would have them: sshd hands the command's shell SHLVL=1. --login-rc
# measures with the bashrc as it is.
LEAN_SHELL = ("SetEnv SHLVL=1",)

# What `dtlaunch check` verifies on a host, in one Python run per host.
PROBE = """\
import json, os, socket, sys
r = {"python": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    import dtlaunch
    r["dtlaunch"] = dtlaunch.__version__
except Exception as e:
    r["error"] = repr(e)
r["workdir"] = os.path.isdir(sys.argv[1])
socks = [socket.socket() for _ in range(int(sys.argv[2]))]
for s in socks:
    s.bind(("", 0))
    s.listen(1)
r["ports"] = [s.getsockname()[1] for s in socks]
print("DTLAUNCH-PROBE " + json.dumps(r))
"""

WORKER = """\
import time
while True:  # until the job is stopped (SIGTERM)
    time.sleep(60)
"""


def addresses(n: int) -> list[str]:
    """N loopback addresses from 127.0.1.1 on (the 256th is 127.0.2.0)."""
    return [f"127.0.{1 + i // 256}.{i % 256}" for i in range(1, n + 1)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """N loopback hosts behind ceil(N/16) sshds, and the files that reach them."""

    hosts: list[str]
    sshds: int
    ssh_config: Path
    hostfile: Path  # `dtlaunch` hostfile, one single-slot host a line
    plain_hosts: Path  # one address a line, for pdsh -w ^FILE
    work: Path  # the workdir on every host (loopback: one folder)
    env: dict[str, str]
    python: str  # the interpreter the hosts run (--python; niced with --remote-nice)


@contextlib.contextmanager
def loopback_fleet(
    n: int, *, keep: bool, login_rc: bool = False, remote_nice: int = 0
) -> Iterator[Fleet]:
    """Start the sshds for ``n`` hosts; everything is stopped and removed on exit
    (the run directories are kept if ``keep``). Unless ``login_rc``, the remote
    bash skips ~/.bashrc (see LEAN_SHELL)."""
    from tests.sshd import start_sshd

    hosts = addresses(n)
    with contextlib.ExitStack() as stack:
        sshd_root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fanout-sshd-")))
        work = Path(tempfile.mkdtemp(prefix=f"fanout-{n}-"))
        if not keep:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
        blocks, known = [], []
        for index in range(0, n, HOSTS_PER_SSHD):
            group = hosts[index : index + HOSTS_PER_SSHD]
            server = start_sshd(
                sshd_root / f"sshd-{index // HOSTS_PER_SSHD}",
                group,
                extra_config=() if login_rc else LEAN_SHELL,
            )
            stack.callback(server.stop)
            known += [server.host_key_line(address) for address in group]
            blocks.append(
                f"Host {' '.join(group)}\n"
                f"    Port {server.port}\n"
                "    User root\n"
                f"    IdentityFile {server.client_key}\n"
                "    IdentitiesOnly yes\n"
                f"    UserKnownHostsFile {sshd_root / 'known_hosts'}\n"
                "    StrictHostKeyChecking yes\n"
                "    BatchMode yes\n"
            )
        (sshd_root / "known_hosts").write_text("".join(f"{line}\n" for line in known))
        config = sshd_root / "ssh_config"
        config.write_text("".join(blocks))
        hostfile = work / "hosts"
        hostfile.write_text("".join(f"{h} slots=1\n" for h in hosts))
        plain = work / "hosts.plain"
        plain.write_text("".join(f"{h}\n" for h in hosts))
        env = dict(os.environ, PYTHONUNBUFFERED="1", DTLAUNCH_SSH_CONFIG=str(config))
        env.pop("DTLAUNCH_HOSTS", None)
        python = sys.executable
        if remote_nice:
            wrapper = work / "python-nice.sh"
            wrapper.write_text(f'#!/bin/sh\nexec nice -n {remote_nice} {python} "$@"\n')
            wrapper.chmod(0o755)
            python = str(wrapper)
        yield Fleet(
            hosts=hosts,
            sshds=math.ceil(n / HOSTS_PER_SSHD),
            ssh_config=config,
            hostfile=hostfile,
            plain_hosts=plain,
            work=work,
            env=env,
            python=python,
        )


# ------------------------------------------------------------------ columns


def probe_command(fleet: Fleet) -> str:
    return shlex.join([fleet.python, "-c", PROBE, str(fleet.work), "2"])


def probe_ok(text: str) -> bool:
    """One probe's output line says what check would call a pass."""
    _, _, payload = text.partition(MARKER)
    try:
        report = json.loads(payload)
    except ValueError:
        return False
    return (
        report.get("dtlaunch") == __version__
        and report.get("workdir") is True
        and len(report.get("ports", [])) == 2
    )


def run_check(fleet: Fleet, concurrency: int) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "dtlaunch", "check", "-H", str(fleet.hostfile),
        "--python", fleet.python, "--workdir", str(fleet.work),
        "--ssh-concurrency", str(concurrency),
    ]  # fmt: skip
    code, output, wall = timed_run(argv, fleet.env, timeout_s=STEP_TIMEOUT_S, cwd=fleet.work)
    n = len(fleet.hosts)
    ok = code == 0 and f"{n} of {n} hosts OK" in output
    return {"s": round(wall, 2), "ok": ok, "detail": "" if ok else output[-2000:]}


def run_sequential(fleet: Fleet) -> dict[str, Any]:
    command = probe_command(fleet)
    failed: list[str] = []
    start = time.monotonic()
    for host in fleet.hosts:
        done = subprocess.run(
            ["ssh", "-F", str(fleet.ssh_config), host, command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0 or not probe_ok(done.stdout):
            failed.append(f"{host}: exit {done.returncode} {done.stderr.strip()[-200:]}")
    wall = time.monotonic() - start
    return {"s": round(wall, 2), "ok": not failed, "detail": "; ".join(failed[:5])}


def pdsh_available() -> tuple[str | None, str]:
    """(the pdsh path, "") or (None, why not)."""
    found = shutil.which("pdsh")
    if found:
        return found, ""
    if os.geteuid() != 0:
        return None, "pdsh not installed (not root: `apt-get install pdsh` to add the column)"
    print("installing pdsh (apt-get install -y pdsh)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "pdsh"]
    for argv in (install, ["apt-get", "update", "-qq"], install):
        subprocess.run(argv, env=env, capture_output=True, check=False, timeout=600)
        found = shutil.which("pdsh")
        if found:
            return found, ""
    return None, "pdsh not installed and `apt-get install pdsh` failed"


def run_pdsh(fleet: Fleet, pdsh: str, concurrency: int) -> dict[str, Any]:
    env = dict(fleet.env, PDSH_SSH_ARGS=f"-F {fleet.ssh_config} -x %h", PDSH_RCMD_TYPE="ssh")
    argv = [
        pdsh, "-R", "ssh", "-f", str(concurrency), "-w", f"^{fleet.plain_hosts}",
        probe_command(fleet),
    ]  # fmt: skip
    code, output, wall = timed_run(argv, env, timeout_s=STEP_TIMEOUT_S, cwd=fleet.work)
    passed = {
        line.split(":", 1)[0] for line in output.splitlines() if MARKER in line and probe_ok(line)
    }
    ok = code == 0 and passed == set(fleet.hosts)
    missing = sorted(set(fleet.hosts) - passed)
    detail = "" if ok else f"exit {code}; {len(missing)} host(s) without a pass; {output[-1500:]}"
    return {"s": round(wall, 2), "ok": ok, "detail": detail}


def _running(events: Path) -> tuple[dict[int, float], str]:
    """rank -> wall time of its first `running` event; and the job_end status, if any."""
    running: dict[int, float] = {}
    ended = ""
    with contextlib.suppress(FileNotFoundError), events.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.endswith("\n"):
                break  # being written
            event = json.loads(line)
            if event["kind"] == "running" and event["role"] == "worker":
                running.setdefault(int(event["rank"]), float(event["wall"]))
            elif event["kind"] == "job_end":
                ended = str(event.get("status", "ended"))
    return running, ended


def run_launch(fleet: Fleet, concurrency: int, *, limit_s: float) -> dict[str, Any]:
    """`dtlaunch run` of N single-slot hosts to all workers running, then a stop."""
    n = len(fleet.hosts)
    worker = fleet.work / "sleeper.py"
    worker.write_text(WORKER)
    run_dir = fleet.work / "run"
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "-H", str(fleet.hostfile),
        "--nproc-per-node", "1", "--python", fleet.python, "--workdir", str(fleet.work),
        "--run-dir", str(run_dir), "--output", "none", "--ssh-concurrency", str(concurrency),
        str(worker),
    ]  # fmt: skip
    events = run_dir / "events.jsonl"
    result: dict[str, Any] = {"ok": False}
    with (fleet.work / "run.log").open("wb") as log:
        began = time.time()
        proc = subprocess.Popen(
            argv, env=fleet.env, cwd=fleet.work, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            running: dict[int, float] = {}
            ended = ""
            while time.time() - began < limit_s and proc.poll() is None:
                running, ended = _running(events)
                if len(running) == n or ended:
                    break
                time.sleep(0.1)
            result["running"] = len(running)
            if len(running) == n:
                result["all_running_s"] = round(max(running.values()) - began, 2)
                result["first_running_s"] = round(min(running.values()) - began, 2)
                result["ok"] = True
            else:
                if ended:
                    why = f"job ended ({ended})"
                elif proc.poll() is not None:
                    why = "dtlaunch run exited"
                else:
                    why = f"not all running after {limit_s:g} s"
                result["detail"] = f"{len(running)} of {n} workers running: {why}"
        finally:
            stop_began = time.monotonic()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _dump_stacks(proc.pid, fleet.work / "stop-stacks.txt")
                    proc.wait(timeout=150)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                result["ok"] = False
                result["detail"] = (
                    f"{result.get('detail', '')}; dtlaunch run did not stop within 180 s of "
                    f"SIGTERM (killed; {_stop_leftovers(run_dir)} agent/worker processes of "
                    "its run stopped by the benchmark)"
                )
            result["stop_s"] = round(time.monotonic() - stop_began, 2)
    with contextlib.suppress(OSError, ValueError):
        result["status"] = json.loads((run_dir / "summary.json").read_text())["status"]
    if not result["ok"]:
        tail = (fleet.work / "run.log").read_text(errors="replace")[-1500:]
        result["detail"] = f"{result.get('detail', '')} (exit {proc.returncode}); {tail}"
    return result


def _stop_leftovers(run_dir: Path) -> int:
    """SIGTERM, then SIGKILL, the processes of this run (their titles carry
    ``run=<id>``) that a supervisor killed mid-stop leaves behind; how many."""
    try:
        tag = f"run={json.loads((run_dir / 'job.json').read_text())['run_id']}"
    except (OSError, ValueError, KeyError):
        return 0

    def ours() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if tag in (entry / "cmdline").read_bytes().decode(errors="replace"):
                        found.append(int(entry.name))
        return found

    left = ours()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(5)
    return len(left)


def _dump_stacks(pid: int, out: Path) -> None:
    """py-spy's view of a supervisor that does not stop, for the post-mortem."""
    spy = Path(sys.executable).parent / "py-spy"
    if spy.exists():
        with out.open("w") as sink:
            subprocess.run(
                [str(spy), "dump", "--pid", str(pid)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                check=False,
                timeout=60,
            )


# ------------------------------------------------------------------ results


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return round(slow / fast, 2) if slow and fast else None


def summarize(sizes: dict[int, dict[str, Any]], *, concurrency: int, pdsh: str) -> dict[str, Any]:
    for row in sizes.values():
        # A skipped column is None.
        check = row["check"]["s"] if (row.get("check") or {}).get("ok") else None
        seq = row["sequential"]["s"] if (row.get("sequential") or {}).get("ok") else None
        pd = row["pdsh"]["s"] if (row.get("pdsh") or {}).get("ok") else None
        row["check_speedup_vs_sequential"] = _ratio(seq, check)
        row["check_speedup_vs_pdsh"] = _ratio(pd, check)
    targets: dict[str, bool] = {}
    at = sizes.get(TARGET_AT)
    if at is not None:
        check_s = at["check"]["s"] if at["check"]["ok"] else math.inf
        targets[f"check_{TARGET_AT}_le_{TARGET_CHECK_S:g}s"] = check_s <= TARGET_CHECK_S
        speedup = at["check_speedup_vs_sequential"] or 0.0
        targets[f"check_{TARGET_AT}_ge_{TARGET_CHECK_SPEEDUP:g}x_sequential"] = (
            speedup >= TARGET_CHECK_SPEEDUP
        )
        launch = at["launch"].get("all_running_s") if at["launch"]["ok"] else None
        targets[f"launch_{TARGET_AT}_le_{TARGET_LAUNCH_S:g}s"] = (
            launch is not None and launch <= TARGET_LAUNCH_S
        )
    return {
        "benchmark": "fanout",
        "dtlaunch": __version__,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ssh": _ssh_version(),
        },
        "concurrency": concurrency,
        "pdsh": pdsh or "available",
        "sizes": {str(n): row for n, row in sorted(sizes.items())},
        "targets": targets,
    }


def _ssh_version() -> str:
    done = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).strip()


def _cell(column: dict[str, Any] | None, key: str = "s") -> str:
    if column is None:
        return "n/a"
    value = column.get(key)
    if column.get("detail") == "skipped":
        return "skipped"
    if not column.get("ok") or value is None:
        return "FAILED"
    return f"{value:.1f} s"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def render_markdown(results: dict[str, Any]) -> str:
    c = results["concurrency"]
    lines = [
        f"# SSH fan-out: `dtlaunch check` and launch on loopback hosts (dtlaunch "
        f"{results['dtlaunch']})",
        "",
        f"{results['machine']['cpus']} CPUs, Python {results['machine']['python']}, "
        f"{results['machine']['ssh']}; 16 hosts per sshd; concurrency {c} for dtlaunch "
        f"and pdsh. pdsh: {results['pdsh']}. Remote login shell: "
        f"{'~/.bashrc sourced' if results.get('login_rc') else 'without ~/.bashrc (SHLVL=1)'}; "
        f"remote side (probes, agents, workers) at nice {results.get('remote_nice', 0)}.",
        "",
        f"| hosts | sshds | dtlaunch check | sequential ssh | pdsh -f {c} | check vs sequential "
        "| check vs pdsh | launch to all running | stop |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, row in results["sizes"].items():
        launch = row["launch"]
        lines.append(
            f"| {n} | {row['sshds']} | {_cell(row['check'])} | {_cell(row['sequential'])} "
            f"| {_cell(row.get('pdsh'))} | {_times(row['check_speedup_vs_sequential'])} "
            f"| {_times(row['check_speedup_vs_pdsh'])} "
            f"| {_cell(launch, 'all_running_s')} | {launch.get('stop_s', '-')} s |"
        )
    if results["targets"]:
        lines += ["", "Targets:", ""]
        lines += [
            f"- {name}: {'met' if met else 'NOT met'}" for name, met in results["targets"].items()
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]),
    )
    parser.add_argument("--quick", action="store_true", help="16 hosts only (one sshd)")
    parser.add_argument("--sizes", help="host counts, e.g. 64,256 (default)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_SSH_CONCURRENCY,
        help=f"--ssh-concurrency of dtlaunch and pdsh -f (default {DEFAULT_SSH_CONCURRENCY})",
    )
    parser.add_argument(
        "--remote-nice",
        type=int,
        default=0,
        help="run what the hosts run (probes, agents, workers) under nice N, as if the "
        "hosts had CPUs of their own: the local client and supervisor keep theirs",
    )
    parser.add_argument(
        "--login-rc", action="store_true", help="let the remote bash source ~/.bashrc"
    )
    parser.add_argument("--skip", default="", help="columns to leave out, e.g. sequential,pdsh")
    parser.add_argument(
        "--out", type=Path, help="JSON file (default benchmarks/results/fanout[.quick].json)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    opts = parser.parse_args(argv)
    if opts.quick and opts.sizes:
        parser.error("--quick runs 16 hosts; give --sizes without it")
    try:
        sizes = tuple(int(v) for v in opts.sizes.split(",")) if opts.sizes else None
    except ValueError:
        sizes = ()
    if sizes is not None and (not sizes or not all(1 <= n <= 1000 for n in sizes)):
        parser.error(f"--sizes {opts.sizes!r}: give host counts from 1 to 1000, comma-separated")
    opts.sizes = sizes or (QUICK_SIZES if opts.quick else SIZES)
    if opts.concurrency < 1:
        parser.error(f"--concurrency {opts.concurrency}: give 1 or more")
    opts.skip = {s.strip() for s in opts.skip.split(",") if s.strip()}
    if opts.out is None:
        opts.out = RESULTS / ("fanout.quick.json" if opts.quick else "fanout.json")
    if opts.out.suffix != ".json":
        parser.error(f"--out {opts.out}: give a .json file (the Markdown table goes beside it)")
    return opts


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the job and the sshds are stopped


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    pdsh, pdsh_missing = (None, "skipped") if "pdsh" in opts.skip else pdsh_available()
    began = time.monotonic()
    sizes: dict[int, dict[str, Any]] = {}
    c = opts.concurrency
    for n in opts.sizes:
        with loopback_fleet(
            n, keep=opts.keep, login_rc=opts.login_rc, remote_nice=opts.remote_nice
        ) as fleet:
            print(f"{n} hosts on {fleet.sshds} sshd(s), work in {fleet.work}", flush=True)
            row: dict[str, Any] = {"sshds": fleet.sshds}
            row["check"] = run_check(fleet, c)
            print(f"  check       {_cell(row['check'])}", flush=True)
            if "sequential" not in opts.skip:
                row["sequential"] = run_sequential(fleet)
                print(f"  sequential  {_cell(row['sequential'])}", flush=True)
            else:
                row["sequential"] = {"ok": False, "detail": "skipped"}
            row["pdsh"] = run_pdsh(fleet, pdsh, c) if pdsh else None
            print(f"  pdsh        {_cell(row['pdsh'])} {pdsh_missing}", flush=True)
            if "launch" not in opts.skip:
                row["launch"] = run_launch(fleet, c, limit_s=STEP_TIMEOUT_S)
            else:
                row["launch"] = {"ok": False, "detail": "skipped"}
            launch = row["launch"]
            print(
                f"  launch      {_cell(launch, 'all_running_s')} to all running, "
                f"stop {launch.get('stop_s', '-')} s {launch.get('detail', '')[:500]}",
                flush=True,
            )
            for name in ("check", "sequential", "pdsh"):
                if row.get(name) and not row[name]["ok"] and row[name].get("detail"):
                    print(f"  {name} FAILED: {row[name]['detail'][:800]}", flush=True)
            sizes[n] = row
    results = summarize(sizes, concurrency=c, pdsh=pdsh_missing)
    results["remote_nice"] = opts.remote_nice
    results["login_rc"] = opts.login_rc
    results["bench_wall_s"] = round(time.monotonic() - began, 1)
    md = render_markdown(results)
    print(md)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(results, indent=2) + "\n")
    md_path = opts.out.with_suffix(".md")
    md_path.write_text(md)
    print(f"wrote {opts.out} and {md_path} ({results['bench_wall_s']:.0f} s)")
    columns_ok = all(
        row[name]["ok"]
        for row in sizes.values()
        for name in ("check", "sequential", "launch")
        if name not in opts.skip
    )
    return 0 if columns_ok and all(results["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
