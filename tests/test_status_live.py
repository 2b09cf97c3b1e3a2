"""``dtlaunch status`` against a real running job: live, read-only, in tmux, after the end.

One job for the whole module (three workers, worker 2 an injected straggler,
policy nd with short windows), kept running by a step-time file until the last
test speeds it up to its end.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import uuid

import pytest
import zmq.asyncio

from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.wire.keys import load_run_keys
from dtlaunch.wire.messages import Hello, StatusReply, StatusRequest, StopJob
from dtlaunch.wire.sockets import Dealer
from tests.jobs import REPO, SCRIPTS, dtlaunch_argv, events, job_env, run, started, wait_until
from tests.test_dds_jobs import dataset_args

pytestmark = pytest.mark.integration

WORKER = str(SCRIPTS / "dds_worker.py")
POLICY = "nd:l_trans=2,l_per=6,min_reports=3"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    base = tmp_path_factory.mktemp("status")
    ledger = base / "ledger"
    ledger.mkdir()
    step_file = base / "step"
    step_file.write_text("0.03")
    run_dir = base / "run"
    args = [
        "run", "--workers", "3", "--run-dir", str(run_dir), "--policy", POLICY,
        "--control-interval", "0.5", "--inject", "persistent:role=worker,ranks=2,delay=0.1",
        "--output", "none", *dataset_args(60000, 100, 1, 30),
        WORKER, str(ledger), f"@{step_file}",
    ]  # fmt: skip
    with started(args, env={}, log=base / "supervisor.log") as proc:
        wait_until(
            lambda: {e["rank"] for e in events(run_dir) if e["kind"] == "reports"} == {0, 1, 2},
            timeout=60,
            what="step reports of all three workers",
        )
        yield run_dir, step_file, proc


def status(*args, timeout=60.0):
    return run(["status", *args], env={"COLUMNS": "100"}, timeout=timeout)


def status_json(run_dir):
    result = status(str(run_dir), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def poll_json(run_dir, pred, *, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        snap = status_json(run_dir)
        if pred(snap):
            return snap
        if time.monotonic() > deadline:
            raise AssertionError(f"no status with {what} within {timeout}s; last: {snap}")
        time.sleep(0.5)


def straggler_of(snap, rank):
    return next(n["straggler"] for n in snap["nodes"] if n["rank"] == rank)


def test_json_shows_the_live_job_progressing_with_the_straggler(job):
    run_dir, _, _ = job
    first = poll_json(
        run_dir,
        lambda s: s["shards_done"] > 0 and straggler_of(s, 2),
        timeout=60,
        what="shards done and worker 2 flagged",
    )
    assert (first["source"], first["phase"], first["note"]) == ("live", "running", "")
    assert first["policy"] == POLICY
    assert first["shards_total"] == 600
    workers = {n["rank"]: n for n in first["nodes"] if n["role"] == "worker"}
    assert set(workers) == {0, 1, 2}
    assert all(n["host"] == "localhost" for n in workers.values())
    assert "straggler" in workers[2]["straggler"] and "lambda 1.5" in workers[2]["straggler"]
    assert "injected 0.1 s/step" in workers[2]["straggler"]
    assert workers[0]["straggler"] == workers[1]["straggler"] == ""
    assert workers[0]["recent_bpt_s"] and workers[0]["bpt_s"] > 0
    assert workers[2]["bpt_s"] > 2 * workers[0]["bpt_s"]
    second = poll_json(
        run_dir,
        lambda s: s["shards_done"] > first["shards_done"] and s["actions"],
        timeout=30,
        what="more shards done and an action",
    )
    assert second["elapsed_s"] > first["elapsed_s"]
    assert second["throughput"] > 0 and second["eta_s"] is not None
    action = second["actions"][-1]
    assert action["action"] in ("ADJUST_BS", "KILL_RESTART") and action["reason"]


def test_once_prints_a_plain_frame_with_the_straggler_highlighted(job):
    run_dir, _, _ = job
    deadline = time.monotonic() + 60
    while True:
        result = status(str(run_dir), "--once")
        assert result.returncode == 0, result.stderr
        if "*worker-2" in result.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = result.stdout
    assert "\x1b[" not in out  # not a terminal: no colour
    assert "running" in out and "shards" in out and "/600" in out
    for rank in (0, 1):
        assert f" worker-{rank} " in out
    assert "*worker-2" in out
    assert "Stragglers" in out and "worker 2 (localhost):" in out
    assert "Last actions" in out and ("ADJUST_BS" in out or "KILL_RESTART" in out)


@pytest.mark.parametrize("socket", ["status", "job"])
def test_status_clients_can_watch_but_not_steer(job, socket):
    """On their own socket status clients get answers to status requests and
    nothing else; on the job's socket a status identity gets nothing at all."""
    run_dir, _, proc = job
    run = RunDir.open(run_dir)
    endpoint = str(run.supervisor()["status_endpoint" if socket == "status" else "endpoint"])

    async def talk():
        ctx = zmq.asyncio.Context()
        try:
            keys = load_run_keys(run.keys)
            async with Dealer(ctx, endpoint, keys.peer(), b"status:test") as dealer:
                await dealer.send(
                    Hello(role="control", run_id=run.spec().run_id, host="", pid=os.getpid(),
                          version="x")
                )  # fmt: skip
                await dealer.send(StopJob(reason="a status client must not stop a job"))
                await dealer.send(StatusRequest(request_id=5, run_id=run.spec().run_id))
                answers = []
                while (answer := await dealer.recv(timeout=5.0)) is not None:
                    answers.append(answer)
                    if isinstance(answer, StatusReply):
                        break
                return answers
        finally:
            ctx.destroy(linger=0)

    answers = asyncio.run(talk())
    if socket == "status":
        # Neither a Welcome nor an Ack: only the reply to the StatusRequest.
        assert [type(a) for a in answers] == [StatusReply]
        assert answers[0].request_id == 5 and answers[0].snapshot.phase == "running"
    else:
        assert answers == []
    time.sleep(1.0)
    assert proc.proc.poll() is None
    assert not [e for e in events(run_dir) if e["kind"] in ("command", "stop_requested")]


@pytest.mark.parametrize(("key", "code"), [("q", 0), ("C-c", 130)], ids=["q", "ctrl-c"])
def test_live_screen_in_tmux_shows_the_job_and_quits(job, tmp_path, key, code):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (make sshd-deps installs it when run as root)")
    run_dir, _, _ = job
    run_id = RunDir.open(run_dir).spec().run_id
    # A server of its own per test: `kill-server` returns before the old server has
    # exited, and a new session on the same socket name then meets the dying server
    # ("server exited unexpectedly") when both parameters run in one pytest worker.
    socket = f"dtlaunch-status-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    rc_file, stty_file = tmp_path / "rc", tmp_path / "stty"
    env = job_env({"TERM": "xterm-256color"})
    env.pop("COLUMNS")  # the pane's own size must rule
    command = " ".join(dtlaunch_argv("status", str(run_dir)))
    tmux = ["tmux", "-L", socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "status", "-x", "80", "-y", "24",
         f"cd {REPO} && {command}; echo $? > {rc_file}.tmp; stty -a > {stty_file}; "
         f"mv {rc_file}.tmp {rc_file}; sleep 60"],
        check=True, env=env,
    )  # fmt: skip
    try:

        def pane():
            return subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", "status"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip

        deadline = time.monotonic() + 30
        while "worker-2" not in (screen := pane()):
            assert time.monotonic() < deadline, f"no status screen in tmux:\n{screen}"
            time.sleep(0.2)
        assert run_id in screen
        assert "running" in screen and "worker-0" in screen and "q quits" in screen
        lines = screen.rstrip("\n").splitlines()
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        subprocess.run([*tmux, "send-keys", "-t", "status", key], check=True)
        wait_until(rc_file.exists, timeout=15, what=f"dtlaunch status to exit on {key}")
        assert rc_file.read_text().strip() == str(code)
        assert "worker-0" not in pane()  # the screen was restored
        modes = stty_file.read_text().split()
        assert "icanon" in modes and "echo" in modes  # the terminal was restored
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, capture_output=True)


def test_after_the_end_status_comes_from_the_event_log(job):
    run_dir, step_file, proc = job
    step_file.write_text("0")
    assert proc.wait(timeout=120) == 0, proc.output()
    snap = status_json(run_dir)
    assert (snap["source"], snap["phase"], snap["status"]) == ("events", "done", "succeeded")
    assert snap["shards_done"] == snap["shards_total"] == 600
    assert "job ended (succeeded)" in snap["note"]
    workers = {n["rank"]: n for n in snap["nodes"]}
    assert {n["proc_state"] for n in workers.values()} == {"succeeded"}
    assert sum(n["shards_done"] for n in workers.values()) == 600
    assert any(a["action"] == "END" and a["target"] == "succeeded" for a in snap["actions"])
    out = status(str(run_dir), "--once").stdout
    assert "succeeded" in out and "job ended (succeeded): shown from the event log" in out
    # Default RUN_DIR: the newest run under ./runs of the working directory.
    runs = run_dir.parent / "runs"
    runs.mkdir(exist_ok=True)
    (runs / run_dir.name).symlink_to(run_dir)
    result = subprocess.run(
        [*dtlaunch_argv("status", "--once")], cwd=run_dir.parent, env=job_env({}),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert RunDir.open(run_dir).spec().run_id in result.stdout


def test_a_silent_supervisor_falls_back_to_the_event_log(job, tmp_path):
    """A job without summary whose supervisor does not answer (it died)."""
    run_dir, _, proc = job
    assert proc.wait(timeout=120) == 0
    copy = tmp_path / "crashed"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("LOCK"))
    (copy / "summary.json").unlink()
    result = status(str(copy), "--json", "--timeout", "0.5")
    assert result.returncode == 0, result.stderr
    snap = json.loads(result.stdout)
    assert snap["source"] == "events"
    assert "did not answer within 0.5 s" in snap["note"]
    assert snap["shards_done"] == 600 and len(snap["nodes"]) == 3
