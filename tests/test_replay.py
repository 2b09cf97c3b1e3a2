"""``dtlaunch replay``: the timeline of real runs, ``--json``, ``--follow``, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dtlaunch.events import Event
from dtlaunch.ui.timeline import (
    TimelineBuilder,
    rank_ranges,
    render_summary,
    timeline_lines,
    to_plain,
)
from tests.jobs import SCRIPTS, dtlaunch_argv, events, job_env, read_line, run, started, wait_until

pytestmark = pytest.mark.integration

DDS_JOB = ["--dataset-size", "2000", "--shard-size", "100", "--global-batch", "20"]


def _dds_args(run_dir: Path, ledger: Path, step: str) -> list[str]:
    ledger.mkdir(parents=True, exist_ok=True)
    return ["run", "--workers", "2", "--run-dir", str(run_dir), *DDS_JOB,
            str(SCRIPTS / "dds_worker.py"), str(ledger), step]  # fmt: skip


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("quick")
    result = run(_dds_args(base / "run", base / "ledger", "0.005"), env={})
    assert result.returncode == 0, result.stderr
    return base / "run"


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 1 SIGKILLs itself on its first attempt; the group restarts once."""
    base = tmp_path_factory.mktemp("killed")
    args = ["run", "--workers", "3", "--run-dir", str(base / "run"),
            str(SCRIPTS / "flaky.py"), str(base), "sigkill", "1", "1"]  # fmt: skip
    result = run(args, env={})
    assert result.returncode == 0, result.stderr
    return base / "run"


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return run(["replay", *args], env={}, timeout=60)


def _lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


def test_replay_prints_phases_and_summary(quick_run: Path) -> None:
    result = _replay(str(quick_run))
    assert result.returncode == 0, result.stderr
    lines = _lines(result.stdout)
    run_id = json.loads((quick_run / "job.json").read_text())["run_id"]
    expected_in_order = [
        f"start job {run_id}: 2 workers, 0 servers, allreduce mode, embedded on localhost",
        "agents launch agent on localhost",
        "agents agent up on localhost",
        "spawn worker 0..1 on localhost",
        "running worker 0..1 on localhost",
        "exit worker 0..1 on localhost finished (exit 0)",
        "decision succeeded: all workers finished",
        "end job succeeded",
        "summary",
        "status succeeded (all workers finished)",
        "shards 20/20 done, 2000 records, 0 duplicates",
        "restarts 0",
        "failures 0",
    ]
    found = [next((i for i, line in enumerate(lines) if want in line), -1)
             for want in expected_in_order]  # fmt: skip
    assert -1 not in found, (expected_in_order[found.index(-1)], result.stdout)
    assert found == sorted(found), result.stdout
    assert lines[0].startswith("+0.000s start")
    # Routine lines are folded: one spawn line for both workers, not one per process.
    assert sum(" spawn " in f" {line} " for line in lines) == 1


def test_replay_shows_failure_and_restarts_with_host_role_rank(killed_run: Path) -> None:
    result = _replay(str(killed_run))
    assert result.returncode == 0, result.stderr
    out = "\n".join(_lines(result.stdout))
    assert "FAILURE worker 1 on localhost (attempt 0): killed by SIGKILL [retryable]" in out
    assert "restart worker 1 on localhost (attempt 1): killed by SIGKILL" in out
    assert "restart worker 0,2 on localhost (attempt 1): group restart after worker-1 failed" in out
    assert "exit worker 0,2 on localhost stopped on request: killed by SIGTERM" in out
    assert "spawn worker 0..2 on localhost (attempt 1)" in out
    assert "restarts 3: worker 0 x1, worker 1 x1, worker 2 x1" in out
    assert "failures 1; root cause: worker 1 on localhost (attempt 0): killed by SIGKILL" in out
    # The failure line replaces the exit line of the same process.
    assert "worker 1 on localhost exited" not in out
    # Time stamps are relative to the first event and never go backwards.
    stamps = [float(line.split("s ", 1)[0][1:]) for line in _lines(result.stdout)
              if line.startswith("+")]  # fmt: skip
    assert stamps == sorted(stamps) and stamps[0] == 0.0


def test_replay_json_is_the_event_log(killed_run: Path) -> None:
    result = _replay(str(killed_run), "--json")
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    assert parsed == events(killed_run)
    assert [e["kind"] for e in parsed].count("restart") == 3


def test_replay_tolerates_a_torn_last_line(killed_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copy(killed_run / "job.json", copy / "job.json")
    lines = (killed_run / "events.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "restart")
    # A supervisor killed in the middle of a write: no job_end, no summary.
    (copy / "events.jsonl").write_text("".join(lines[: cut + 1]) + lines[cut + 1][:25])
    result = _replay(str(copy))
    assert result.returncode == 0, result.stderr
    out = "\n".join(_lines(result.stdout))
    assert "FAILURE worker 1 on localhost" in out
    assert "status unknown: no job_end and no summary.json" in out
    assert "dtlaunch run --resume" in out
    assert "malformed event line" in result.stderr
    parsed = json.loads(_replay(str(copy), "--json").stdout)
    assert len(parsed) == cut + 1


def _a_file(path: Path) -> Path:
    path.write_text("not a run directory")
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "is not a dtlaunch run directory"),
        (lambda p: _a_file(p / "f.txt"), "is not a directory"),
    ],
)
def test_bad_run_dirs_exit_2_naming_the_fix(tmp_path: Path, make, message) -> None:
    result = _replay(str(make(tmp_path)))
    assert result.returncode == 2
    err = " ".join(result.stderr.split())
    assert message in err and "runs/" in err


def test_job_without_events_and_follow_with_json_exit_2(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text("{}")
    result = _replay(str(tmp_path))
    assert result.returncode == 2
    assert "replay --follow" in " ".join(result.stderr.split())
    result = _replay(str(tmp_path), "--follow", "--json")
    assert result.returncode == 2
    assert "--follow and --json" in result.stderr


def test_follow_prints_events_as_they_come_and_exits_after_the_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = _dds_args(run_dir, tmp_path / "ledger", "0.03")  # 100 steps: about 3 s
    with started(args, env={}, log=tmp_path / "job.log") as job:
        wait_until(lambda: (run_dir / "events.jsonl").exists(), timeout=30, what="events.jsonl")
        with subprocess.Popen(
            dtlaunch_argv("replay", "--follow", str(run_dir)),
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as follow:
            try:
                first = read_line(follow, time.monotonic() + 30, "replay --follow")
                # Printed while the job still runs: the log has no job_end yet.
                assert "start" in first and "job" in first
                assert job.proc.poll() is None
                assert not any(e["kind"] == "job_end" for e in events(run_dir))
                out, err = follow.communicate(timeout=60)
            finally:
                if follow.poll() is None:
                    follow.kill()
                    follow.communicate()
        assert follow.returncode == 0, err
        assert job.wait(timeout=30) == 0
    text = "\n".join(_lines(first + out))
    assert "end job succeeded" in text
    assert "shards 20/20 done" in text
    assert text.index("running worker 0..1") < text.index("end job succeeded")
    # Following a finished run prints it all and returns at once.
    again = _replay("--follow", str(run_dir))
    assert again.returncode == 0
    assert "end job succeeded" in "\n".join(_lines(again.stdout))


def test_follow_stops_on_ctrl_c(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = _dds_args(run_dir, tmp_path / "ledger", "0.3")  # about 30 s: outlives the test
    with started(args, env={}, log=tmp_path / "job.log"):
        wait_until(lambda: (run_dir / "events.jsonl").exists(), timeout=30, what="events.jsonl")
        with subprocess.Popen(
            dtlaunch_argv("replay", "-f", str(run_dir)),
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # As from a terminal: a test run started in the background (`make test &`)
            # ignores SIGINT, and its children would inherit that.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        ) as follow:
            try:
                read_line(follow, time.monotonic() + 30, "replay --follow")
                os.kill(follow.pid, signal.SIGINT)
                _, err = follow.communicate(timeout=10)
            finally:
                if follow.poll() is None:
                    follow.kill()
                    follow.communicate()
        assert follow.returncode == 130, err
        assert "Traceback" not in err


def _event(kind: str, wall: float, host: str = "", role: str = "", rank: int = -1, **data):
    return Event(kind=kind, mono=wall, wall=1000.0 + wall, host=host, role=role, rank=rank,
                 data=data)  # fmt: skip


def test_big_jobs_fold_routine_lines_per_group() -> None:
    hosts = [f"node{i}" for i in range(8)]
    evs = [_event("job_start", 0.0, workers=64, hosts=hosts, mode="allreduce")]
    evs += [_event("agent_up", 0.1, host=h) for h in hosts]
    evs += [_event("spawn", 0.2, host=hosts[r // 8], role="worker", rank=r) for r in range(64)]
    evs += [_event("running", 0.3, host=hosts[r // 8], role="worker", rank=r) for r in range(64)]
    evs.append(_event("heartbeat_lost", 5.0, host="node3", role="agent", silent_s=3.1))
    evs.append(_event("heartbeat_recovered", 6.5, host="node3", role="agent"))
    texts = [f"{line.label} {line.text}" for line in timeline_lines(evs)]
    assert texts[1:] == [
        "agents agent up on 8 hosts",
        "spawn worker 0..63 on 8 hosts",
        "running worker 0..63 on 8 hosts",
        "lost heartbeat lost: agent on node3 silent for 3.1s",
        "recovered heartbeat back: agent on node3",
    ]
    assert rank_ranges([5, 0, 1, 2, 3, 9, 10]) == "0..3,5,9..10"


def test_server_reports_and_injected_delays_are_summed_and_a_server_move_is_told() -> None:
    evs = [_event("job_start", 0.0, workers=2, servers=2, hosts=["a", "b"], mode="ps")]
    for t in range(1, 4):
        update = {"version": [t], "update_s": [0.3], "injected_s": [0.25], "t": [float(t)]}
        evs.append(_event("server_reports", float(t), role="server", rank=1, **update))
        evs.append(_event("injected", float(t), role="server", rank=1, delay_s=0.25, steps=[t]))
    evs.append(_event("ps_move", 4.0, role="server", rank=1, phase="begin", target_host="c",
                      to_endpoint="tcp://c:5"))  # fmt: skip
    evs.append(_event("ps_move", 5.0, role="server", rank=1, phase="moved", version=9,
                      pause_s=0.01))  # fmt: skip
    evs.append(_event("ps_move", 5.5, role="server", rank=1, phase="done", all_redirected=True))
    builder = TimelineBuilder()
    lines = [line for e in evs for line in builder.add(e)] + builder.flush()
    texts = [f"{line.label} {line.text}" for line in lines]
    assert texts[1:] == [
        "ps move server 1: fresh server on c (tcp://c:5)",
        "ps move server 1: blocks handed over at version 9, the workers paused 0.01s",
        "ps move server 1: old server stopped (every worker redirected)",
    ]
    text = to_plain(render_summary(builder, None))
    assert "reported by server: 1: 3" in text and "straggler delay: server 1: 0.8s" in text


def test_a_decision_reads_as_one_short_line_of_what_a_person_compares() -> None:
    inputs = {
        "now": 24077.7, "l_trans": 1.0, "lambda": 1.5,
        "bpt_short": {"3": 0.3241, "0": 0.111, "1": 0.0959, "2": 0.11},
        "current_sizes": {"0": 17, "1": 14, "2": 17, "3": 16},
        "solver_sizes": {"0": 19, "1": 20, "2": 19, "3": 6},
        "throughput": {"0": 140.1, "1": 121.7, "2": 140.7, "3": 130.1},
    }  # fmt: skip
    decided = _event("decision", 1.0, policy="nd", action="ADJUST_BS",
                     reason="transient straggler worker 3 (lambda 1.5)", inputs=inputs,
                     sizes={"0": 19, "1": 20, "2": 19, "3": 6}, apply_at_step=5)  # fmt: skip
    quiet = _event("decision", 2.0, policy="custom", action=None, reason="nothing to do",
                   inputs={"bpt_short": "not a dict"})  # fmt: skip
    builder = TimelineBuilder()
    lines = [line for e in (decided, quiet) for line in builder.add(e)] + builder.flush()
    assert [line.text for line in lines] == [
        "ADJUST_BS (nd): transient straggler worker 3 (lambda 1.5); "
        "BPT w0 0.111 w1 0.0959 w2 0.11 w3 0.324 s; batch 17,14,17,16 -> 19,20,19,6; "
        "apply_at_step=5",
        "no action (custom): nothing to do",
    ]
