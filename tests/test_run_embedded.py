"""Real jobs in embedded mode (local agent subprocess, no SSH): environment, output,
failure classification, restarts and the root-cause report."""

from __future__ import annotations

import json

import pytest

from tests.jobs import SCRIPTS, run, summary

pytestmark = pytest.mark.integration


def test_torchrun_script_runs_unmodified_and_allreduce_is_correct(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    result = run(
        [
            "run",
            "--nproc-per-node",  # torchrun's spelling: on this one host, 3 workers
            "3",
            "--run-dir",
            str(run_dir),
            str(SCRIPTS / "torchrun_env.py"),
            str(out),
        ],
        env={},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads((out / f"{r}.json").read_text()) for r in range(3)]
    for rank, report in enumerate(reports):
        env = report["env"]
        assert report["missing"] == []
        assert report["allreduce"] == [1.0, 1.0, 1.0]
        assert (report["dist_rank"], report["dist_world"]) == (rank, 3)
        assert env["RANK"] == env["ROLE_RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == "0"
        assert env["ROLE_NAME"] == "worker"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == env["DTLAUNCH_RUN_ID"]
        assert env["DTLAUNCH_SUPERVISOR"].startswith("tcp://127.0.0.1:")
    assert len({r["env"]["MASTER_PORT"] for r in reports}) == 1
    assert summary(run_dir)["status"] == "succeeded"
    # Output reached both the log files and the prefixed console.
    assert "[worker0@localhost]" not in (run_dir / "logs" / "worker-0.log").read_text()
    for rank in range(3):
        assert (run_dir / "logs" / f"worker-{rank}.log").exists()


def _flaky(tmp_path, mode, fail_rank, fail_attempts, *extra, columns=200):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    run_dir = tmp_path / "run"
    args = ["run", "--workers", "2", "--run-dir", str(run_dir), *extra]
    args += [str(SCRIPTS / "flaky.py"), str(out), mode, str(fail_rank), str(fail_attempts)]
    return run(args, env={"COLUMNS": str(columns)}), run_dir, out


def test_killed_process_restarts_with_same_rank_and_bumped_restart_count(tmp_path):
    result, run_dir, out = _flaky(tmp_path, "sigkill", 1, 1, "--restart-scope", "process")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((out / "1-1.json").read_text())["rank"] == 1  # attempt 1 of rank 1 ran
    assert not (out / "0-1.json").exists()  # process scope: rank 0 untouched
    data = summary(run_dir)
    assert data["status"] == "succeeded"
    assert [(r["role"], r["rank"]) for r in data["restarts"]] == [("worker", 1)]
    assert "SIGKILL" in data["restarts"][0]["reason"]
    log = (run_dir / "logs" / "worker-1.log").read_text()
    assert "attempt 0" in log and "attempt 1" in log  # all attempts in one file


def test_group_scope_restarts_every_worker(tmp_path):
    result, run_dir, out = _flaky(tmp_path, "runtime", 0, 1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "0-1.json").exists() and (out / "1-1.json").exists()
    assert sorted(r["rank"] for r in summary(run_dir)["restarts"]) == [0, 1]


@pytest.mark.parametrize(
    ("mode", "error"),
    [("import", "ModuleNotFoundError"), ("argparse", "unrecognized arguments")],
)
def test_unretryable_failure_stops_the_job_at_once_with_a_root_cause_table(tmp_path, mode, error):
    # At 80 columns, the error stays one readable line (not folded into a strip).
    result, run_dir, out = _flaky(tmp_path, mode, 1, 5, "--max-restarts", "3", columns=80)
    assert result.returncode == 1
    assert not (out / "1-1.json").exists()  # never restarted
    data = summary(run_dir)
    assert data["status"] == "failed"
    assert data["restarts"] == []
    root = [f for f in data["failures"] if f["root_cause"]]
    assert len(root) == 1 and root[0]["rank"] == 1 and not root[0]["retryable"]
    assert error in root[0]["error"]
    assert "root cause" in result.stderr and error in result.stderr
    report = result.stderr[result.stderr.index("root cause first") :].splitlines()
    assert all(len(line) <= 80 for line in report), report
    assert any(line.strip().startswith(root[0]["error"][:60]) for line in report), report
    assert "localhost" in result.stderr


def test_restarts_exhausted_fails_with_the_traceback_in_the_report(tmp_path):
    result, run_dir, out = _flaky(
        tmp_path, "runtime", 1, 99, "--max-restarts", "1", "--restart-scope", "process"
    )
    assert result.returncode == 1
    assert (out / "1-1.json").exists() and not (out / "1-2.json").exists()
    data = summary(run_dir)
    assert data["status"] == "failed"
    assert len(data["restarts"]) == 1
    assert [f["attempt"] for f in data["failures"]] == [0, 1]
    assert any(
        "RuntimeError: deliberate failure" in line for line in data["failures"][-1]["traceback"]
    )
    assert "RuntimeError" in result.stderr


def test_missing_script_is_unretryable(tmp_path):
    result = run(["run", "--run-dir", str(tmp_path / "run"), str(tmp_path / "nope.py")], env={})
    assert result.returncode == 1
    data = summary(tmp_path / "run")
    assert data["failures"][0]["reason"] == "script not found"


@pytest.mark.parametrize(
    ("output", "shown", "hidden"),
    [
        ("all", ["[worker0@localhost] rank 0 done", "[worker1@localhost] rank 1 done"], []),
        ("none", [], ["[worker0@", "[worker1@"]),
        ("1", ["[worker1@localhost] rank 1 done"], ["[worker0@"]),
    ],
)
def test_console_output_selection(tmp_path, output, shown, hidden):
    result, run_dir, _ = _flaky(tmp_path, "sigkill", 9, 0, "--output", output)
    assert result.returncode == 0, result.stderr
    for text in shown:
        assert text in result.stdout
    for text in hidden:
        assert text not in result.stdout
    # Log files get everything whatever the console shows.
    for rank in range(2):
        assert f"rank {rank} done" in (run_dir / "logs" / f"worker-{rank}.log").read_text()
