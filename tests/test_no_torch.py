"""The supervisor, the agent and the CLI never import torch or tensorflow.

Two levels: a fast check that imports every module of those layers with ``import
torch`` / ``import tensorflow`` made to fail, and a real one that runs a DDS job and a
``--ps-server script`` job with dtlaunch as ``python -m build``'s wheel installs it, in
a fresh venv without torch.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dtlaunch.ps
from tests.jobs import REPO, SCRIPTS, summary
from tests.wheel_venv import PROBE_ENV, WheelVenv, clean_env

BLOCKED = ("torch", "tensorflow")

# What must load without torch: the supervisor, the agent, the CLI (a module or a
# package, and any dtlaunch.cli_* module), and what the CLI's commands import lazily.
NO_TORCH_ROOTS = (
    "dtlaunch",
    "dtlaunch.supervisor",
    "dtlaunch.agent",
    "dtlaunch.cli",
    "dtlaunch.ui",
    "dtlaunch.preflight",
    "dtlaunch.jobclient",
    "dtlaunch.cli.manpages",
)

# Run in a fresh interpreter: imports ROOTS (argv) and, for packages, every module
# below them, with torch and tensorflow blocked. Prints a JSON report.
_IMPORT_WITH_TORCH_BLOCKED = r"""
import importlib, json, pkgutil, sys, traceback

BLOCKED = ("torch", "tensorflow")


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"import of {name} blocked by tests/test_no_torch.py", name=name)
        return None


sys.meta_path.insert(0, Blocker())
imported, problems = [], {}


def load(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        chain = [
            f"{frame.filename}:{frame.lineno}"
            for frame in traceback.extract_tb(exc.__traceback__)
            if "/dtlaunch/" in frame.filename
        ]
        problems[name] = [*chain, str(exc)]
        return
    imported.append(name)
    if hasattr(module, "__path__") and name != "dtlaunch":
        for info in pkgutil.iter_modules(module.__path__, name + "."):
            load(info.name)


import dtlaunch

cli = [i.name for i in pkgutil.iter_modules(dtlaunch.__path__, "dtlaunch.")]
cli = [name for name in cli if name.startswith("dtlaunch.cli")]
for root in dict.fromkeys([*sys.argv[1:], *sorted(cli)]):
    load(root)
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
print(json.dumps({"imported": imported, "problems": problems, "loaded": loaded}))
"""


def test_supervisor_agent_and_cli_import_no_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_WITH_TORCH_BLOCKED, *NO_TORCH_ROOTS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    # Each entry: the module, then the dtlaunch lines of the import chain to torch.
    assert report["problems"] == {}
    assert report["loaded"] == []
    imported = set(report["imported"])
    for module in (
        "dtlaunch.supervisor.supervisor",
        "dtlaunch.supervisor.job",
        "dtlaunch.supervisor.psfleet.fleet",
        "dtlaunch.agent.agent",
        "dtlaunch.cli",
    ):
        assert module in imported


def test_ps_package_still_offers_client_and_submodules() -> None:
    """``dtlaunch.ps`` loads torch only on first use of a torch name; users see no change."""
    from dtlaunch.ps import Client, OptimizerConfig

    assert dtlaunch.ps.Client is Client is dtlaunch.ps.client.Client
    assert dtlaunch.ps.OptimizerConfig is OptimizerConfig is dtlaunch.ps.optim.OptimizerConfig
    assert set(dtlaunch.ps.__all__) <= set(dir(dtlaunch.ps))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = dtlaunch.ps.NoSuchName


# ------------------------------------------------------------ a real venv without torch
# The `wheel_venv` fixture (tests/conftest.py, tests/wheel_venv.py): the built wheel,
# installed without extras in a fresh venv, with an import probe (PROBE_ENV).


def _run_job(venv: WheelVenv, tmp_path: Path, args: list[str]) -> tuple[Path, list[dict[str, Any]]]:
    """``dtlaunch run ARGS`` with the venv's own ``dtlaunch``, from a directory outside the
    repository (the agent runs ``python -m dtlaunch.agent`` there, which must not find
    the repository's sources). Returns the run directory and every process's probe."""
    run_dir, probes, work = tmp_path / "run", tmp_path / "probes", tmp_path / "work"
    probes.mkdir()
    work.mkdir()
    result = subprocess.run(
        [str(venv.dtlaunch), "run", "--run-dir", str(run_dir), *args],
        cwd=work,
        env=clean_env(**{PROBE_ENV: str(probes)}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, [json.loads(p.read_text()) for p in sorted(probes.glob("*.json"))]


def _check_no_torch(venv: WheelVenv, probes: list[dict[str, Any]]) -> None:
    """The supervisor and the agent ran from the venv and never tried to import torch."""
    supervisor = [p for p in probes if Path(p["argv"][0]) == venv.dtlaunch]
    agent = [p for p in probes if "dtlaunch.agent" in p["orig_argv"]]
    assert len(supervisor) == 1, [p["orig_argv"] for p in probes]
    assert len(agent) == 1, [p["orig_argv"] for p in probes]
    for probe in (*supervisor, *agent):
        assert probe["attempted"] == [], probe["orig_argv"]
        assert not {"torch", "tensorflow"} & set(probe["modules"]), probe["orig_argv"]
        assert probe["dtlaunch_file"].startswith(str(venv.site_packages)), probe["dtlaunch_file"]
    assert "dtlaunch.supervisor.supervisor" in supervisor[0]["modules"]
    assert "dtlaunch.agent.agent" in agent[0]["modules"]


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test builds the venv
def test_the_venv_has_no_torch(wheel_venv: WheelVenv) -> None:
    for module in BLOCKED:
        result = subprocess.run(
            [str(wheel_venv.python), "-c", f"import {module}"],
            env=clean_env(),
            cwd=wheel_venv.root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode != 0
        assert f"No module named '{module}'" in result.stderr


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_dds_job_runs_without_torch(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    run_dir, probes = _run_job(
        wheel_venv,
        tmp_path,
        [
            "--workers", "2",
            "--dataset-size", "200", "--shard-size", "20", "--epochs", "2",
            "--global-batch", "20", "--seed", "3",
            str(SCRIPTS / "dds_worker.py"), str(ledger), "0",
        ],
    )  # fmt: skip
    counts: collections.Counter[int] = collections.Counter()
    for path in ledger.glob("*.txt"):
        for line in path.read_text().splitlines():
            counts.update(int(x) for x in line.split())
    assert counts == dict.fromkeys(range(200), 2)  # every record, once per epoch
    assert summary(run_dir)["status"] == "succeeded"
    _check_no_torch(wheel_venv, probes)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_script_ps_server_job_runs_without_torch(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run_dir, probes = _run_job(
        wheel_venv,
        tmp_path,
        [
            "--workers", "2", "--servers", "1", "--ps-server", "script", "--kill-grace", "2",
            str(SCRIPTS / "ps_script_roles.py"), str(out),
        ],
    )  # fmt: skip
    server = json.loads((out / "server-0.json").read_text())
    assert (server["DMLC_ROLE"], server["torch_loaded"]) == ("server", False)
    for rank in (0, 1):
        worker = json.loads((out / f"worker-{rank}.json").read_text())
        assert (worker["DMLC_ROLE"], worker["DMLC_NUM_SERVER"]) == ("worker", "1")
    data = summary(run_dir)
    assert (data["status"], data["mode"], data["servers"]) == ("succeeded", "ps", 1)
    assert data["failures"] == []
    _check_no_torch(wheel_venv, probes)
