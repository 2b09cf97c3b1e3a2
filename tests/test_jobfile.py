"""``dtlaunch run --config job.toml``: a job from a file, the precedence of the four
sources shown by ``--print-config``, and bad files refused before anything starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.jobs import SCRIPTS, run, summary


def _resolved(stdout: str) -> dict[str, tuple[str, str]]:
    """``--print-config``'s table as ``{option: (value, source)}``."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) == 3 and cells[0] not in ("", "option"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_command_line_beats_environment_beats_file_beats_defaults(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        'script = "train.py"\nscript_args = ["--lr", "0.1"]\n'
        'workers = 2\npolicy = "nd"\nseed = 5\n'
        '[ps]\nconsistency = "asp"\n'  # a table groups options by their first word
    )
    result = run(
        ["run", "--config", str(job), "--print-config", "--seed", "9"],
        env={"DTLAUNCH_POLICY": "lb-bsp", "DTLAUNCH_WORKERS": "3"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    rows = _resolved(result.stdout)
    assert rows["seed"] == ("9", "command line")
    assert rows["policy"] == ("lb-bsp", "environment")
    assert rows["workers"] == ("3", "environment")
    assert rows["ps-consistency"] == ("asp", "job file")
    assert rows["script"] == ("train.py", "job file")
    assert rows["script-args"] == ("--lr 0.1", "job file")
    assert rows["max-restarts"] == ("3", "default")
    assert list(tmp_path.iterdir()) == [job]  # --print-config runs nothing


def test_a_script_on_the_command_line_does_not_take_the_files_arguments(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('script = "train.py"\nscript_args = ["--lr", "0.1"]\n')
    result = run(["run", "--config", str(job), "--print-config", "other.py"], env={}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = _resolved(result.stdout)
    assert rows["script"] == ("other.py", "command line")
    assert rows["script-args"][0] == "-"


def test_a_job_runs_from_its_file_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.toml"
    job.write_text(
        f'script = "{SCRIPTS / "torchrun_env.py"}"\nscript_args = ["{out}"]\n'
        f'nproc-per-node = 2\nrun-dir = "{tmp_path / "run"}"\n'
        'env = "FROM_JOB_FILE=yes"\n'  # one value of a repeatable option needs no list
        "[heartbeat]\ninterval = 0.5\n"
    )
    result = run(["run", "--config", str(job)], env={}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary(tmp_path / "run")["status"] == "succeeded"
    spec = json.loads((tmp_path / "run" / "job.json").read_text())
    assert spec["workers"] == 2 and spec["heartbeat_interval"] == 0.5
    assert spec["env"]["FROM_JOB_FILE"] == "yes"
    reports = [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]
    assert [r["env"]["WORLD_SIZE"] for r in reports] == ["2", "2"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('policyy = "nd"\n', "unknown key 'policyy' (did you mean 'policy'?)"),
        ('[ps]\nconsistensy = "asp"\n', "unknown key '[ps] consistensy' (did you mean "),
        ("workers = \n", "not valid TOML: Invalid value (at line 1, column 11)"),
        ('workers = "two"\n', "workers = 'two': Invalid value for '--workers'"),
        ('resume = "runs/x"\n', "'resume' cannot be set in a job file; give --resume"),
        ('config = "other.toml"\n', "'config' cannot be set in a job file"),
    ],
)
def test_a_bad_job_file_is_refused_naming_the_key_and_nothing_starts(tmp_path, text, message):
    job = tmp_path / "job.toml"
    job.write_text(text)
    result = run(["run", "--config", str(job), "train.py"], env={}, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"--config {job}: " in " ".join(result.stderr.split())
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [job]


def test_a_missing_job_file_says_so(tmp_path: Path):
    result = run(["run", "--config", str(tmp_path / "no.toml"), "t.py"], env={}, cwd=tmp_path)
    assert result.returncode == 2
    assert "no such file; give the path of a job file" in " ".join(result.stderr.split())
