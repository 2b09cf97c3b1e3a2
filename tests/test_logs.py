"""``dtlaunch logs``: a real run's logs with console prefixes, selection, attempts,
--grep, --follow of a running job, and bad input; the reader's edge cases in-process."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dtlaunch.cli import app
from dtlaunch.errors import ConfigError
from dtlaunch.ui.logs import RunLogs, Selection, follow_logs, parse_selection
from tests.jobs import SCRIPTS, dtlaunch_argv, job_env, read_line, run, started, wait_until

pytestmark = pytest.mark.integration
runner = CliRunner()

# What the supervisor writes when an attempt starts (supervisor/output.py).
MARKER = (
    "=== dtlaunch: {proc} attempt {attempt} on {host} pid 4{attempt} at 2026-01-01 00:00:00 ==="
)


@pytest.fixture(scope="module")
def restarted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-worker job whose worker 1 was SIGKILLed in attempt 0: both
    workers were restarted (a group restart) and printed in both attempts."""
    base = tmp_path_factory.mktemp("logs")
    (base / "out").mkdir()
    args = ["run", "--workers", "2", "--run-dir", str(base / "run"),
            str(SCRIPTS / "flaky.py"), str(base / "out"), "sigkill", "1", "1"]  # fmt: skip
    result = run(args, env={})
    assert result.returncode == 0, result.stderr
    return base / "run"


def _logs(*args: str) -> subprocess.CompletedProcess[str]:
    """``dtlaunch logs ARGS`` through the installed entry point, as a user runs it."""
    return run(["logs", *args], env={}, timeout=30)


def _logs_in_process(*args: str) -> tuple[int, str, str]:
    """The same command in this process: for the many small cases, where starting
    Python again for each would cost a second apiece."""
    result = runner.invoke(app, ["logs", *args])
    assert "Traceback" not in result.stderr, result.stderr
    return result.exit_code, result.stdout, " ".join(result.stderr.split())


def _texts(stdout: str) -> list[str]:
    """The printed lines without their prefixes (headers and blank lines left out)."""
    return [line.split("] ", 1)[1] for line in stdout.splitlines() if line.startswith("[")]


def test_every_worker_is_shown_with_console_prefixes_one_after_another(
    restarted_run: Path,
) -> None:
    result = _logs(str(restarted_run))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    logs = restarted_run / "logs"
    assert lines[0] == f"==> worker 0: {logs / 'worker-0.log'} <=="
    second = lines.index(f"==> worker 1: {logs / 'worker-1.log'} <==")
    assert lines[second - 1] == ""  # a blank line between two processes
    worker0, worker1 = lines[1 : second - 1], lines[second + 1 :]
    assert [worker0[1], *worker0[3:]] == [
        "[worker0@localhost] rank 0 attempt 0",
        "[worker0@localhost] rank 0 attempt 1",
        "[worker0@localhost] rank 0 done",
    ]
    for attempt, marker in enumerate((worker0[0], worker0[2])):
        assert marker.startswith(
            f"[worker0@localhost] === dtlaunch: worker-0 attempt {attempt} on localhost pid "
        )
    assert all(line.startswith("[worker1@localhost] ") for line in worker1)
    assert "[worker1@localhost] rank 1 done" in worker1
    assert not any("agent" in line for line in lines)  # agents only when asked for


def test_role_and_rank_select_the_logs(restarted_run: Path) -> None:
    one = _logs(str(restarted_run), "worker", "1")
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    assert all(line.startswith("[worker1@localhost] ") for line in lines)  # no header
    assert [text for text in _texts(one.stdout) if "===" not in text] == [
        "rank 1 attempt 0",
        "rank 1 attempt 1",
        "rank 1 done",
    ]
    code, out, err = _logs_in_process(str(restarted_run), "agent")
    assert code == 0, err
    lines = out.splitlines()
    assert lines and all(line.startswith("[agent@localhost] ") for line in lines)
    assert any("started worker-1 attempt 1" in line for line in lines)


def test_attempt_shows_one_attempt_of_a_restarted_worker(restarted_run: Path) -> None:
    first = _logs(str(restarted_run), "worker", "1", "--attempt", "0")
    assert first.returncode == 0, first.stderr
    texts = _texts(first.stdout)
    assert texts[0].startswith("=== dtlaunch: worker-1 attempt 0 on localhost")
    assert texts[1:] == ["rank 1 attempt 0"]  # killed before it printed "done"
    code, out, err = _logs_in_process(str(restarted_run), "--attempt", "1", "--grep", "^rank")
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("[")] == [
        "[worker0@localhost] rank 0 attempt 1",
        "[worker0@localhost] rank 0 done",
        "[worker1@localhost] rank 1 attempt 1",
        "[worker1@localhost] rank 1 done",
    ]
    code, _, err = _logs_in_process(str(restarted_run), "worker", "1", "--attempt", "5")
    assert code == 2
    assert "hold no attempt 5 (attempts 0..1); pass one of those to --attempt" in err


def test_grep_filters_lines_and_finds_nothing_like_grep(restarted_run: Path) -> None:
    done = _logs(str(restarted_run), "--grep", r"done$")
    assert done.returncode == 0, done.stderr
    shown = [line for line in done.stdout.splitlines() if line and "==>" not in line]
    assert shown == ["[worker0@localhost] rank 0 done", "[worker1@localhost] rank 1 done"]
    assert _logs_in_process(str(restarted_run), "worker", "0", "--grep", "no such")[:2] == (1, "")


def test_bad_regex_unknown_rank_and_missing_run_dir_exit_2_naming_the_fix(
    restarted_run: Path, tmp_path: Path
) -> None:
    code, _, err = _logs_in_process(str(restarted_run), "--grep", "loss=(")
    assert code == 2
    assert "--grep 'loss=(' is not a regular expression: missing ), unterminated subpattern" in err
    code, _, err = _logs_in_process(str(restarted_run), "worker", "7")
    assert code == 2
    assert f"{restarted_run} has no worker 7: its workers are 0..1; pass one of them" in err
    code, _, err = _logs_in_process(str(restarted_run), "server", "0")
    assert code == 2
    assert f"{restarted_run} has no servers; it has workers 0..1; agents localhost" in err
    code, _, err = _logs_in_process(str(tmp_path / "nope"))
    assert code == 2
    assert f"{tmp_path / 'nope'} does not exist; pass the run directory of a job" in err


def test_follow_prints_a_running_jobs_lines_and_ends_with_the_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (tmp_path / "ledger").mkdir()
    args = ["run", "--workers", "2", "--run-dir", str(run_dir), "--dataset-size", "2000",
            "--shard-size", "100", "--global-batch", "20",
            str(SCRIPTS / "dds_worker.py"), str(tmp_path / "ledger"), "0.05"]  # fmt: skip
    with started(args, env={}, log=tmp_path / "job.log") as job:
        worker0 = run_dir / "logs" / "worker-0.log"
        wait_until(worker0.exists, timeout=30, what="worker 0's log")
        with subprocess.Popen(
            dtlaunch_argv("logs", "-f", str(run_dir)),
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as follow:
            try:
                first = read_line(follow, time.monotonic() + 30, "logs --follow")
                # Printed while the job still runs: its workers print only at their end.
                assert first.startswith("[worker0@localhost] === dtlaunch: worker-0 attempt 0")
                assert job.proc.poll() is None
                assert not (run_dir / "summary.json").exists()
                out, err = follow.communicate(timeout=60)  # ends by itself
            finally:
                if follow.poll() is None:
                    follow.kill()
                    follow.communicate()
        assert follow.returncode == 0, err
        assert job.wait(timeout=30) == 0
    lines = (first + out).splitlines()
    assert "[worker0@localhost] rank 0 finished after" in "\n".join(lines)
    assert "[worker1@localhost] rank 1 finished after" in "\n".join(lines)
    assert "==>" not in out  # following: interleaved as they come, prefixed


def _fake_run(tmp_path: Path) -> Path:
    """A run dir whose job never ends (no summary.json) and whose worker 0 has a line."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.json").write_text('{"workers": 2, "servers": 0, "hosts": []}')
    marker = MARKER.format(proc="worker-0", attempt=0, host="node1")
    (run_dir / "logs" / "worker-0.log").write_text(f"{marker}\nfirst\n")
    return run_dir


def test_follow_picks_up_a_new_log_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run_dir = _fake_run(tmp_path)
    with subprocess.Popen(
        dtlaunch_argv("logs", "--follow", str(run_dir), "--grep", "^[a-z]"),
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a test run started in the background ignores SIGINT.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as follow:
        try:
            assert (
                read_line(follow, time.monotonic() + 20, "logs --follow")
                == "[worker0@node1] first\n"
            )
            marker = MARKER.format(proc="worker-1", attempt=0, host="node2")
            (run_dir / "logs" / "worker-1.log").write_text(f"{marker}\nlater\n")
            assert (
                read_line(follow, time.monotonic() + 20, "logs --follow")
                == "[worker1@node2] later\n"
            )
            os.kill(follow.pid, signal.SIGINT)
            _, err = follow.communicate(timeout=10)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.communicate()
    assert follow.returncode == 130, err
    assert "Traceback" not in err


# ---------------------------------------------------------------- in-process


def test_a_marker_after_an_unfinished_line_starts_the_next_attempt_on_its_host(
    tmp_path: Path,
) -> None:
    run_dir = _fake_run(tmp_path)
    moved = MARKER.format(proc="worker-0", attempt=1, host="node3")
    with (run_dir / "logs" / "worker-0.log").open("a") as log:
        log.write(f"progress 50%{moved}\nresumed\n")
    out = io.StringIO()
    follow_logs(RunLogs.open(run_dir), Selection(attempt=1), out, job_ended=lambda: True, poll_s=0)
    assert out.getvalue().splitlines() == [f"[worker0@node3] {moved}", "[worker0@node3] resumed"]
    out = io.StringIO()
    follow_logs(RunLogs.open(run_dir), Selection(attempt=0), out, job_ended=lambda: True, poll_s=0)
    assert out.getvalue().splitlines()[1:] == [
        "[worker0@node1] first",
        "[worker0@node1] progress 50%",
    ]


def test_follow_holds_an_unfinished_line_until_the_job_ends(tmp_path: Path) -> None:
    run_dir = _fake_run(tmp_path)
    log = run_dir / "logs" / "worker-0.log"
    polls: list[str] = []
    out = io.StringIO()

    def sleep(_: float) -> None:
        polls.append(out.getvalue())
        with log.open("a") as handle:
            handle.write("epoch 1" if len(polls) == 1 else " done")

    follow_logs(
        RunLogs.open(run_dir),
        parse_selection("worker", "00", attempt=None, grep="^(first|epoch)"),
        out,
        job_ended=lambda: len(polls) == 2,
        poll_s=0,
        sleep=sleep,
    )
    assert polls == ["[worker0@node1] first\n"] * 2  # "epoch 1" had no newline yet
    assert out.getvalue() == "[worker0@node1] first\n[worker0@node1] epoch 1 done\n"


def test_selection_errors_name_the_fix() -> None:
    with pytest.raises(
        ConfigError, match=r"before the rank \(e.g. dtlaunch logs RUN_DIR worker 3\)"
    ):
        parse_selection("3", None, attempt=None, grep=None)
    with pytest.raises(ConfigError, match="an agent's log has none"):
        parse_selection("agent", "node1", attempt=0, grep=None)
    with pytest.raises(ConfigError, match="worker rank 'one' is not a number"):
        parse_selection("worker", "one", attempt=None, grep=None)
