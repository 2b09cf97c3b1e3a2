"""PS mode end to end: ``dtlaunch run --servers M`` starts the built-in servers
(``python -m dtlaunch.ps``) and tells the workers where they are."""

from __future__ import annotations

import json

import pytest

from tests.jobs import REPO, SCRIPTS, events, job_env, run, summary

pytest.importorskip("torch")


@pytest.mark.integration
def test_builtin_servers_train_a_model_with_two_workers(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run", "--workers", "2", "--servers", "2", "--run-dir", str(run_dir),
        "--dataset-size", "4000", "--shard-size", "200", "--global-batch", "40",
        "--epochs", "2", "--ps-block-bytes", "16", "--output", "0",
        str(SCRIPTS / "ps_worker.py"), str(out), "sgd", "0.05",
    ]  # fmt: skip
    result = run(args, env=job_env(), timeout=120.0, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    spawns = {(e["role"], e["rank"]): e["argv"] for e in events(run_dir) if e["kind"] == "spawn"}
    assert spawns[("server", 0)][-2:] == ["-m", "dtlaunch.ps"]
    assert spawns[("server", 1)][-2:] == ["-m", "dtlaunch.ps"]
    finals = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]
    # Both workers end on the servers' parameters, which fit the data.
    assert finals[0]["params"] == finals[1]["params"]
    assert finals[0]["final_loss"] < 1e-6 < finals[0]["first_loss"]
    assert finals[0]["steps"] + finals[1]["steps"] == 2 * 4000 // 20
    logs = [(run_dir / "logs" / f"server-{r}.log").read_text() for r in (0, 1)]
    # 16-byte blocks: the 8x1 weight is split, and both servers hold blocks.
    assert all("seeded by worker" in log for log in logs)
    data = summary(run_dir)
    assert (data["status"], data["mode"], data["servers"]) == ("succeeded", "ps", 2)
    assert data["failures"] == []  # the servers were stopped on purpose at the end
