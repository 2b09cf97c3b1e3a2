"""Real jobs over a real OpenSSH sshd on 127.0.0.1-3, three "hosts"."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from dtlaunch.wire.keys import load_run_keys
from tests.jobs import (
    REPO,
    SCRIPTS,
    alive,
    events,
    hostfile,
    kind,
    run,
    started,
    summary,
    wait_for_event,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_torchrun_env_and_allreduce_across_three_ssh_hosts(sshd, tmp_path):
    # Spelled as a DeepSpeed/mpirun user would: --hostfile, --exclude, -np. Nothing
    # listens on the excluded host, so the job would fail if it were contacted.
    hosts = hostfile(
        sshd,
        tmp_path / "hosts",
        [
            f"{sshd.addresses[0]} slots=2 gpus=2",
            "127.0.0.99 slots=8",
            f"{sshd.addresses[1]} slots=1",
            f"{sshd.addresses[2]} slots=1",
        ],
    )
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    result = run(
        [
            "run",
            "--hostfile",
            str(hosts),
            "--exclude",
            "127.0.0.99",
            "-np",
            "4",
            "--run-dir",
            str(run_dir),
            str(SCRIPTS / "torchrun_env.py"),
            str(out),
        ],
        env=sshd.env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    expected = {  # rank: (host, local_rank, local_world_size, group_rank)
        0: ("127.0.0.1", 0, 2, 0),
        1: ("127.0.0.1", 1, 2, 0),
        2: ("127.0.0.2", 0, 1, 1),
        3: ("127.0.0.3", 0, 1, 2),
    }
    for rank, (host, local_rank, local_world, group_rank) in expected.items():
        report = json.loads((out / f"{rank}.json").read_text())
        env = report["env"]
        assert report["missing"] == []
        assert report["allreduce"] == [1.0] * 4
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(local_rank)
        assert env["LOCAL_WORLD_SIZE"] == str(local_world)
        assert env["GROUP_RANK"] == str(group_rank)
        # gpus=2 on the first host: DeepSpeed's contract, the others declare none.
        assert env["CUDA_VISIBLE_DEVICES"] == ("0,1" if host == "127.0.0.1" else None)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["DTLAUNCH_KEYS"].startswith(str(Path.home() / ".cache" / "dtlaunch"))
        assert f"[worker{rank}@{host}] rank {rank} ok" in result.stdout
    spawns = [e for e in events(run_dir) if e["kind"] == "spawn"]
    assert {e["rank"]: e["host"] for e in spawns} == {r: h for r, (h, *_) in expected.items()}
    assert summary(run_dir)["status"] == "succeeded"
    # The remote agents' own logs come back over the SSH channel.
    for addr in sshd.addresses:
        assert (run_dir / "logs" / f"agent-{addr}.log").stat().st_size > 0


def test_sigkilled_worker_mid_run_is_restarted_and_the_job_completes(sshd, tmp_path):
    hosts = hostfile(sshd, tmp_path / "hosts")
    run_dir = tmp_path / "run"
    args = [
        "run",
        "-H",
        str(hosts),
        "--workers",
        "3",
        "--run-dir",
        str(run_dir),
        str(REPO / "examples" / "train_allreduce.py"),
        "--steps",
        "80",
        "--step-time",
        "0.05",
        "--checkpoint",
        str(tmp_path / "ckpt.pt"),
    ]
    with started(args, env=sshd.env(), log=tmp_path / "console.log") as job:
        running = wait_for_event(
            run_dir, kind("running", rank=1), timeout=60, what="worker-1 running"
        )
        wait_until(
            lambda: "step   20" in job.output(), timeout=60, what="training to reach step 20"
        )
        os.kill(running["pid"], signal.SIGKILL)
        code = job.wait(timeout=120)
        output = job.output()
    assert code == 0, output
    data = summary(run_dir)
    assert data["status"] == "succeeded"
    restarted = {(r["rank"], r["host"]) for r in data["restarts"]}
    assert restarted == {
        (0, "127.0.0.1"),
        (1, "127.0.0.2"),
        (2, "127.0.0.3"),
    }  # same ranks, same hosts
    assert data["failures"][0]["rank"] == 1 and data["failures"][0]["reason"] == "killed by SIGKILL"
    assert "restart=1 resuming at step" in output
    assert "done: final loss" in output


def _secrets(run_dir: Path) -> list[bytes]:
    keys = load_run_keys(run_dir / "keys")
    return [keys.client.secret, keys.server.secret]


def _cmdlines() -> list[bytes]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes())
            except OSError:
                continue
    return out


def test_no_secret_in_any_cmdline_and_dtlaunch_stop_cleans_every_host(sshd, tmp_path):
    hosts = hostfile(sshd, tmp_path / "hosts")
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run",
        "-H",
        str(hosts),
        "--workers",
        "3",
        "--kill-grace",
        "2",
        "--run-dir",
        str(run_dir),
        str(SCRIPTS / "sleeper.py"),
        str(out),
    ]
    with started(args, env=sshd.env(), log=tmp_path / "console.log") as job:
        wait_until(lambda: len(list(out.glob("worker-*.json"))) == 3, timeout=60, what="3 workers")
        secrets = _secrets(run_dir)
        assert all(len(s) == 40 for s in secrets)
        for cmdline in _cmdlines():
            for secret in secrets:
                assert secret not in cmdline
        pids = [p for f in out.glob("*.json") for p in json.loads(f.read_text())["pids"]]
        assert len(pids) == 6 and all(alive(*p) for p in pids)
        t0 = time.monotonic()
        stop = run(["stop", str(run_dir)], env={})
        assert stop.returncode == 0, stop.stderr
        assert job.wait(timeout=15) == 1
        wait_until(
            lambda: not any(alive(*p) for p in pids),
            timeout=15 - (time.monotonic() - t0),
            what="job processes gone",
        )
    data = summary(run_dir)
    assert data["status"] == "stopped"
    assert any(e["kind"] == "command" for e in events(run_dir))


def test_unknown_host_key_stops_the_job_with_the_fix(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    # Only two of the three hosts are known: the third must be refused, not trusted.
    known.write_text("".join(sshd.host_key_line(a) + "\n" for a in sshd.addresses[:2]))
    config = sshd.write_client_config(tmp_path / "ssh_config", known_hosts=known)
    run_dir = tmp_path / "run"
    result = run(
        [
            "run",
            "-H",
            str(hostfile(sshd, tmp_path / "hosts")),
            "--workers",
            "3",
            "--run-dir",
            str(run_dir),
            str(SCRIPTS / "sleeper.py"),
            str(tmp_path),
            "5",
        ],
        env={"DTLAUNCH_SSH_CONFIG": str(config)},
        timeout=60,
    )
    assert result.returncode == 1
    data = summary(run_dir)
    assert data["status"] == "failed"
    root = data["failures"][0]
    assert (root["host"], root["role"], root["retryable"]) == ("127.0.0.3", "agent", False)
    assert "ssh-keyscan" in root["error"]
    assert "127.0.0.3" in result.stderr and "ssh-keyscan" in result.stderr
    # No worker ever started: the job fails before anything runs on the known hosts.
    assert not [e for e in events(run_dir) if e["kind"] == "running"]


def test_wrong_python_on_the_hosts_is_a_clear_error(sshd, tmp_path):
    run_dir = tmp_path / "run"
    result = run(
        [
            "run",
            "-H",
            str(hostfile(sshd, tmp_path / "hosts")),
            "--python",
            "/nonexistent/python3",
            "--run-dir",
            str(run_dir),
            "x.py",
        ],
        env=sshd.env(),
        timeout=60,
    )
    assert result.returncode == 1
    assert "--python" in summary(run_dir)["failures"][0]["error"]


def _python_wrapper(path: Path, prelude: str) -> Path:
    """A --python that runs ``prelude`` (shell) first, then this interpreter."""
    path.write_text(f'#!/bin/sh\n{prelude}\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


def _probe_processes() -> list[int]:
    """Processes still waiting as a probed, never started agent."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any("DTLAUNCH-AGENT-PROBE" in part for part in proc.info["cmdline"] or ()):
            found.append(proc.pid)
    return found


@pytest.mark.parametrize("problem", ["workdir", "version"])
def test_a_host_that_cannot_run_the_agent_is_refused_with_the_fix(sshd, tmp_path, problem):
    """One session per host probes, then becomes the agent; a host the probe
    refuses gets the reason and the fix, and its waiting process ends."""
    fake = tmp_path / "fake"
    (fake / "dtlaunch").mkdir(parents=True)
    (fake / "dtlaunch" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    python = sys.executable
    workdir = str(tmp_path)
    if problem == "workdir":
        workdir = str(tmp_path / "missing")
        expected = f"workdir {workdir} does not exist. Fix: create it or pass --workdir"
    else:
        python = str(_python_wrapper(tmp_path / "py", f"export PYTHONPATH={fake}"))
        expected = "is not importable by" + f" {python} (version 0.0.1). Fix: pip install"
    run_dir = tmp_path / "run"
    result = run(
        ["run", "-H", str(hostfile(sshd, tmp_path / "hosts")), "--python", python,
         "--workdir", workdir, "--run-dir", str(run_dir), "x.py"],
        env=sshd.env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    errors = [f["error"] for f in summary(run_dir)["failures"]]
    assert errors and all(expected in e for e in errors), errors
    wait_until(lambda: not _probe_processes(), timeout=15, what="the refused probes to exit")


def test_an_agent_that_cannot_import_fails_the_launch_with_the_import_error(sshd, tmp_path):
    """The probe imports the agent before its bootstrap line comes; a failed
    import passes the probe (the version is right) and is raised once the line
    says to start: the launch fails with the error, not a silent agent."""
    from dtlaunch import __version__

    broken = tmp_path / "broken"
    (broken / "dtlaunch").mkdir(parents=True)
    (broken / "dtlaunch" / "__init__.py").write_text(f"__version__ = {__version__!r}\n")
    python = _python_wrapper(tmp_path / "py", f"export PYTHONPATH={broken}")
    run_dir = tmp_path / "run"
    result = run(
        ["run", "-H", str(hostfile(sshd, tmp_path / "hosts")), "--python", str(python),
         "--workdir", str(tmp_path), "--run-dir", str(run_dir), "x.py"],
        env=sshd.env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    errors = [f["error"] for f in summary(run_dir)["failures"]]
    assert errors and all("No module named 'dtlaunch.agent'" in e for e in errors), errors
    wait_until(lambda: not _probe_processes(), timeout=15, what="the failed agents to exit")


def test_what_a_login_shell_prints_before_the_probe_is_skipped(sshd, tmp_path):
    noisy = _python_wrapper(tmp_path / "py", "echo 'Welcome!'; echo '{not the probe}'")
    run_dir = tmp_path / "run"
    script = tmp_path / "ok.py"
    script.write_text("print('trained')\n")
    result = run(
        ["run", "-H", str(hostfile(sshd, tmp_path / "hosts")), "--python", str(noisy),
         "--workdir", str(tmp_path), "--run-dir", str(run_dir), str(script)],
        env=sshd.env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary(run_dir)["status"] == "succeeded"


def test_ps_mode_places_servers_by_quota_and_sets_ps_lite_env(sshd, tmp_path):
    hosts = hostfile(
        sshd,
        tmp_path / "hosts",
        [
            f"{sshd.addresses[0]} slots=1 servers=1",
            f"{sshd.addresses[1]} slots=1",
            f"{sshd.addresses[2]} slots=1",
        ],
    )
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    result = run(
        [
            "run",
            "-H",
            str(hosts),
            "--workers",
            "2",
            "--servers",
            "1",
            "--ps-server",
            "script",  # ps-lite style: the servers run the script too
            "--kill-grace",
            "2",
            "--run-dir",
            str(run_dir),
            str(SCRIPTS / "ps_env.py"),
            str(out),
        ],
        env=sshd.env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    placed = {(e["role"], e["rank"]): e["host"] for e in events(run_dir) if e["kind"] == "spawn"}
    assert placed == {
        ("server", 0): "127.0.0.1",
        ("worker", 0): "127.0.0.2",
        ("worker", 1): "127.0.0.3",
    }
    # The script server's lifetime (ps-lite's): it serves until every worker has
    # finished, then the job stops it (SIGTERM, SIGKILL after --kill-grace).
    exits = {(e["role"], e["rank"]): e for e in events(run_dir) if e["kind"] == "exit"}
    assert exits["server", 0]["requested"]
    assert exits["server", 0]["mono"] >= max(exits["worker", r]["mono"] for r in (0, 1))
    server = json.loads((out / "server-0.json").read_text())
    assert (server["DMLC_ROLE"], server["DMLC_SERVER_ID"], server["ROLE_NAME"]) == (
        "server",
        "0",
        "server",
    )
    for rank in (0, 1):
        worker = json.loads((out / f"worker-{rank}.json").read_text())
        assert worker["DMLC_ROLE"] == "worker" and worker["DMLC_WORKER_ID"] == str(rank)
        assert (worker["DMLC_NUM_WORKER"], worker["DMLC_NUM_SERVER"]) == ("2", "1")
        assert worker["DMLC_PS_ROOT_URI"] == server["DMLC_PS_ROOT_URI"]
    data = summary(run_dir)
    assert (data["status"], data["mode"], data["servers"]) == ("succeeded", "ps", 1)
    # The server was stopped on purpose when the workers finished: not a failure.
    assert data["failures"] == []
