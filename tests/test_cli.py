"""The command line as a user meets it: errors that name the problem and the fix."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.core
import typer.main
from typer.testing import CliRunner

from dtlaunch import __version__
from dtlaunch.cli import app
from dtlaunch.cli.run import run as run_command
from dtlaunch.config import RunOptions
from dtlaunch.wire.keys import create_run_keys, load_run_keys
from tests.jobs import SCRIPTS, hostfile, run, summary

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dtlaunch {__version__}"


def test_bad_hostfile_reports_every_problem_with_file_line_col(tmp_path):
    bad = tmp_path / "hosts.txt"
    bad.write_text("node1 slots=0\n# fine\nnode2 slots=two\nnode1\nnode3 color=red\n")
    result = run(["run", "-H", str(bad), "train.py"], env={})
    assert result.returncode == 2
    err = result.stderr
    for where in (f"{bad}:1:13", f"{bad}:3:13", f"{bad}:4:1", f"{bad}:5:7"):
        assert where in err, err
    assert "expected" in err
    assert not list(tmp_path.glob("runs"))  # nothing was started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--mode", "ps"], "add --servers"),
        (["--policy", "magic"], "unknown policy 'magic'"),
        (["--env", "NOEQUALS"], "expected KEY=VALUE"),
        (["--output", "bogus"], "--output"),
        (["--orphan-timeout", "1"], "--orphan-timeout must be longer"),
        (["--nproc-per-node", "2", "-np", "4"], "both set the worker count; give one"),
        (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
        (["--include", "node1"], "give one with -H/--hostfile"),
        (["-H", "node1:2,node2:2", "--include", "node3"], "'node3' is not a host of the list"),
        (["-H", "node1:2,node2:2", "--exclude", "node11"], "(did you mean node1?)"),
        (["-H", "node1:2,node2:2", "--exclude", "node1@node2"], "left no host to run on"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(tmp_path, args, message):
    result = runner.invoke(app, ["run", "--run-dir", str(tmp_path / "run"), *args, "train.py"])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())  # unwrapped from the terminal width
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--nprocs-per-node", "2"], "--nprocs-per-node (did you mean --nproc-per-node?)"),
        (["--worker", "2"], "--worker (did you mean --workers?)"),
        (["--host-file=h.txt"], "--host-file (did you mean --hostfile?)"),
        (["--zzzzzz"], "--zzzzzz;"),
    ],
)
def test_an_unknown_option_before_the_script_is_refused_and_nothing_starts(
    tmp_path, args, shown
):
    # click would pass the unknown option through as SCRIPT: python would be run
    # as `python --worker 2 train.py` and fail on every host.
    result = run(["run", *args, "train.py", "--lr", "0.1"], env={}, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    text = " ".join(result.stderr.split())
    assert f"no such option for dtlaunch run: {shown}" in text
    assert "nothing was started" in text
    assert list(tmp_path.iterdir()) == []  # no runs/ directory, no run dir


def test_nproc_per_node_sets_every_hosts_room_and_the_worker_count(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=8\nb slots=1 servers=1\nc slots=4 spare\nd slots=2\n")
    fields = {name: None for name in inspect.signature(RunOptions).parameters}
    given = fields | {
        "script": "t.py", "module": False, "hosts": str(hosts), "exclude": "d",
        "nproc_per_node": 3, "servers": 0, "ps_server": "builtin", "ps_consistency": "bsp",
        "ps_block_bytes": 1 << 22, "ps_snapshot_interval": 30.0, "policy": "none",
        "control_interval": 10.0, "max_restarts": 3, "heartbeat_interval": 1.0,
        "dead_after": 3, "orphan_timeout": 60.0, "agent_timeout": 60.0, "kill_grace": 5.0,
        "output": "all", "insecure_no_host_key_check": False, "ssh_concurrency": 64,
        "dataset_size": 0, "oom_relaunches": 3, "limits_via": "auto", "framework": "torch",
        "shard_size": 0, "epochs": 1, "global_batch": 0, "seed": 0,
        "run_dir": tmp_path / "run",
    }  # fmt: skip
    spec = RunOptions(**given).job_spec()
    # Two running hosts (c is spare, d excluded): 3 workers each, servers kept apart.
    assert spec.workers == 6
    assert [(h.label, h.slots, h.spare) for h in spec.hosts] == [
        ("a", 3, False),
        ("b", 4, False),
        ("c", 3, True),
    ]


def test_too_few_slots_is_a_clear_error(tmp_path):
    result = runner.invoke(
        app, ["run", "-H", "a:1,b:1", "--workers", "3", "--run-dir", str(tmp_path / "r"), "t.py"]
    )
    assert result.exit_code == 2
    assert "3" in result.stderr and "slot" in result.stderr


@pytest.mark.integration
def test_inline_hosts_run_a_job_over_ssh(sshd, tmp_path):
    inline = ",".join(f"{a}:1" for a in sshd.addresses[:2])
    out = tmp_path / "out"
    out.mkdir()
    result = run(
        [
            "run",
            "-H",
            inline,
            "--workers",
            "2",
            "--run-dir",
            str(tmp_path / "run"),
            str(SCRIPTS / "flaky.py"),
            str(out),
            "none",
            "9",
            "0",
        ],
        env=sshd.env(),
    )
    assert result.returncode == 0, result.stderr
    assert "[worker1@127.0.0.2] rank 1 done" in result.stdout
    assert summary(tmp_path / "run")["hosts"] == sshd.addresses[:2]


@pytest.mark.integration
def test_check_passes_good_hosts_and_fails_a_bad_one_with_a_fix(sshd, tmp_path):
    good = hostfile(sshd, tmp_path / "good")
    result = run(["check", "-H", str(good)], env=sshd.env())
    assert result.returncode == 0, result.stdout + result.stderr
    for addr in sshd.addresses:
        assert addr in result.stdout
    bad = hostfile(sshd, tmp_path / "bad", [*sshd.addresses[:2], "127.0.0.3:1"])  # port 1: refused
    result = run(["check", "-H", str(bad)], env=sshd.env())
    assert result.returncode == 1
    assert "127.0.0.3:1" in result.stdout
    assert "FAIL" in result.stdout
    assert "1 of 3 host(s) failed" in result.stderr


@pytest.mark.integration
def test_stop_of_an_ended_job_says_so(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    done = run(
        ["run", "--run-dir", str(run_dir), str(SCRIPTS / "flaky.py"), str(out), "none", "9", "0"],
        env={},
    )
    assert done.returncode == 0
    result = run(["stop", str(run_dir)], env={})
    assert result.returncode == 1
    assert "already ended" in result.stderr
    result = run(["stop", str(tmp_path)], env={})
    assert result.returncode == 1
    assert "not a dtlaunch run directory" in result.stderr


def test_a_run_dir_whose_supervisor_died_before_job_json_says_to_start_again(tmp_path):
    """Found by benchmarks/chaos.py: a supervisor SIGKILLed in its first second
    leaves logs/ but no job.json; --resume must say that nothing ran and the
    same command starts the job in the same --run-dir."""
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    (run_dir / "logs").mkdir(parents=True)  # what RunDir.create makes before job.json
    refused = run(["run", "--resume", str(run_dir)], env={})
    assert refused.returncode == 2
    text = " ".join(refused.stderr.split())
    assert "stopped before the job was set up, so nothing ran" in text
    assert "Start the job again with the same dtlaunch run command" in text
    argv = ["run", "--run-dir", str(run_dir), str(SCRIPTS / "flaky.py"), str(out), "none", "9", "0"]
    assert run(argv, env={}).returncode == 0


@pytest.mark.parametrize(
    "keys",
    [
        {},  # killed before its keys
        {"server.key_secret": "whole"},  # killed between the two key files
        {"server.key_secret": "torn", "client.key_secret": "whole"},  # killed mid-write
    ],
    ids=["no-keys", "server-key-only", "torn-key"],
)
def test_a_run_dir_whose_supervisor_died_before_binding_resumes_as_a_fresh_start(
    tmp_path, keys
):
    """Found by benchmarks/chaos.py, twice: a supervisor SIGKILLed after job.json
    but before it bound its endpoint (no supervisor.json) left a run that --resume
    refused, first with 'no supervisor information', then, killed while writing
    its keys, with 'the run's keys are incomplete'. No agent ever heard of the job
    or its keys, so resuming starts it afresh in the same directory, with new keys."""
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    spec = RunOptions(
        script=str(SCRIPTS / "flaky.py"), script_args=[str(out), "none", "9", "0"],
        run_dir=run_dir,
    ).job_spec()  # fmt: skip
    (run_dir / "logs").mkdir(parents=True)  # what RunDir.create leaves before its keys
    (run_dir / "job.json").write_text(spec.to_json())
    if keys:
        create_run_keys(tmp_path / "donor")  # real key files to copy or tear
        (run_dir / "keys").mkdir(mode=0o700)
        for name, state in keys.items():
            text = (tmp_path / "donor" / name).read_bytes()
            (run_dir / "keys" / name).write_bytes(text if state == "whole" else text[:40])
            (run_dir / "keys" / name).chmod(0o600)
    resumed = run(["run", "--resume", str(run_dir)], env={})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"
    assert load_run_keys(run_dir / "keys")  # a whole new pair replaced the pieces


# ------------------------------------------- user text is not markup (issue 12, defect 6)


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--env", "[/]"], "--env '[/]': expected KEY=VALUE"),
        (["-H", "h[/x]:2"], "h[/x]"),
        (["--policy", "[/bold]"], "'[/bold]'"),
        (["--bind", "127.0.0.1"], "--bind '127.0.0.1': expected ADDR:PORT"),
    ],
)
def test_user_text_in_errors_prints_as_given(tmp_path, args, shown):
    result = run(["run", "--run-dir", str(tmp_path / "run"), *args, "x.py"], env={})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "MarkupError" not in result.stderr
    assert shown in " ".join(result.stderr.split()), result.stderr
    assert not (tmp_path / "run").exists()  # refused before a run dir was made


def test_an_ipv6_hostfile_line_keeps_its_bracketed_hint(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("::1 slots=2\n")
    result = run(["run", "-H", str(hosts), "x.py"], env={})
    assert result.returncode == 2
    assert "expected [address] or [address]:port (e.g. [fd00::1])" in " ".join(
        result.stderr.split()
    )


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_run_dir_that_is_or_is_under_a_file_is_a_clear_error(tmp_path, under):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    target = blocker / under if under else blocker
    result = run(["run", "--run-dir", str(target), "x.py"], env={})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{blocker} is a file, not a folder" in " ".join(result.stderr.split())


def test_help_lists_the_commands_in_their_order():
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    names = group.list_commands(typer.Context(group))
    assert names == ["run", "check", "stop", "scale", "replay", "status", "logs", "wal"]


def test_run_options_are_the_run_commands_options():
    not_run_options = {"ctx", "resume", "verbose", "config", "print_config"}
    params = set(inspect.signature(run_command).parameters) - not_run_options
    assert params == {f.name for f in dataclasses.fields(RunOptions)}


def test_shell_completion_completes_commands_and_run_options():
    dtlaunch = Path(sys.executable).parent / "dtlaunch"  # the installed entry point

    def complete(words: str) -> list[str]:
        env = {
            **os.environ,
            "_DTLAUNCH_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - 1),
        }
        result = subprocess.run(
            [str(dtlaunch)], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.split()

    assert complete("dtlaunch re") == ["replay"]
    assert "--nproc-per-node" in complete("dtlaunch run --nproc")
    assert complete("dtlaunch run --polic") == ["--policy"]
    # Asked for bash by name: typer otherwise detects the parent shell, which
    # under `make` is sh ("Shell sh not supported").
    shown = subprocess.run(
        [str(dtlaunch), "--show-completion", "bash"],
        env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "_DTLAUNCH_COMPLETE=complete_bash" in shown.stdout


def test_run_options_defaults_are_the_command_lines():
    # dtlaunch.launch() builds RunOptions directly: it must start the job `dtlaunch run` would.
    cli_defaults = {
        name: param.default
        for name, param in inspect.signature(run_command).parameters.items()
        if param.default is not inspect.Parameter.empty
    }
    for field in dataclasses.fields(RunOptions):
        if field.name != "script":
            assert field.default == cli_defaults[field.name], field.name
