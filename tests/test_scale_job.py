"""``dtlaunch scale`` on a live parameter-server job over sshd, in one job: one
command adds two workers and a server on the spare host, and the supervisor is
SIGKILLed right away; the resumed one finishes the scale-out (the workers join
the servers' BSP steps and take data shards, the server takes a block). Then
the server is removed and the supervisor SIGKILLed right away again; the
resumed one has the new workers and finishes the scale-in (the block moves
back, the server stops once every worker was told); then the added workers are
removed: they finish their shard and leave. Every record is trained exactly
once, and the workers end with one model."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.jobs import (
    SCRIPTS,
    events,
    hostfile,
    scale,
    started,
    steps_of,
    summary,
    wait_until,
)

pytest.importorskip("torch")

DATASET, SHARD = 16000, 200
# Seconds a step while the test scales and kills the supervisor: the job must not
# run out of data before the test is through (800 steps would take 160 s); then
# 0, and the job trains the rest at full speed.
HELD_STEP_S = 0.2


def trained_records(out: Path) -> list[int]:
    records: list[int] = []
    for ledger in out.glob("*.ledger"):
        for line in ledger.read_text().splitlines():
            records += [int(r) for r in line.split()]
    return records


def job_args(sshd, tmp_path: Path, out: Path, run_dir: Path, step_file: Path) -> list[str]:
    a0, a1, a2 = sshd.addresses
    hosts = hostfile(
        sshd,
        tmp_path / "hosts",
        [f"{a0} slots=2 servers=1", f"{a1} slots=1", f"{a2} slots=3 spare"],
    )
    return [
        "run", "-H", str(hosts), "--workers", "2", "--servers", "1", "--run-dir", str(run_dir),
        "--dataset-size", str(DATASET), "--shard-size", str(SHARD), "--global-batch", "20",
        "--output", "0", str(SCRIPTS / "ps_bsp_worker.py"), str(out), f"@{step_file}",
    ]  # fmt: skip


def reports_after(run_dir: Path, kind_: str, rank: int) -> int:
    """Step reports of worker ``rank`` after the last ``kind_`` event."""
    log = events(run_dir)
    start = max((i for i, e in enumerate(log) if e["kind"] == kind_), default=len(log))
    return sum(1 for e in log[start:] if e["kind"] == "reports" and e.get("rank") == rank)


@pytest.mark.integration
def test_scale_up_kill_the_supervisor_resume_and_scale_down_while_a_ps_job_trains(sshd, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    a2 = sshd.addresses[2]
    step_file = tmp_path / "step"
    step_file.write_text(str(HELD_STEP_S))
    with started(
        job_args(sshd, tmp_path, out, run_dir, step_file), env=sshd.env(), log=tmp_path / "log"
    ) as job:
        wait_until(lambda: steps_of(run_dir, 1) >= 20, timeout=120, what="worker 1 training")
        # Too many: 3 spare slots free, so at most 5; refused, nothing changes.
        refused = scale(run_dir, 6)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "no room for 4 more worker(s)" in refused.stderr
        assert "at most 5 workers" in refused.stderr
        # More servers than the model has blocks (2: weight and bias) would hold nothing.
        refused = scale(run_dir, servers=3)
        assert refused.returncode == 1 and "at most 2 servers" in refused.stderr, refused.stderr
        # Workers and a server in one command, and the supervisor killed at once:
        # the new processes start, or are about to, and no block has moved yet.
        up = scale(run_dir, 4, servers=2)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "servers 1 -> 2; workers 2 -> 4" in up.stdout
        job.signal(signal.SIGKILL)
        job.wait(timeout=30)
    assert not [e for e in events(run_dir) if e["kind"] == "ps_scale" and e["phase"] == "done"]
    resume = ["run", "--resume", str(run_dir)]
    with started(resume, env=sshd.env(), log=tmp_path / "resume-out.log") as job:
        wait_until(
            lambda: (
                min(steps_of(run_dir, 2), steps_of(run_dir, 3)) >= 10 and _scaled_to(run_dir) == 2
            ),
            timeout=120,
            what="the added workers 2 and 3 training, and 2 servers",
        )
        shrink = scale(run_dir, servers=1)
        assert shrink.returncode == 0 and "servers 2 -> 1" in shrink.stdout, shrink.stdout
        # Killed at once: the blocks have not moved back, the server still runs.
        job.signal(signal.SIGKILL)  # the supervisor; the agents keep the job running
        job.wait(timeout=30)
    assert not [e for e in events(run_dir) if e["kind"] == "ps_scale" and e["phase"] == "drained"]
    with started(resume, env=sshd.env(), log=tmp_path / "resume.log") as job:
        # The resumed supervisor has the 4 workers back, and has heard from the two
        # it will remove (a worker it has not heard from cannot be asked to leave);
        # it finished the scale-in: the blocks moved back, the server stopped.
        wait_until(
            lambda: (
                reports_after(run_dir, "resume", 2) >= 2
                and reports_after(run_dir, "resume", 3) >= 2
                and reports_after(run_dir, "ps_scale", 3) >= 2
                and _scaled_to(run_dir) == 1
            ),
            timeout=120,
            what="workers 2 and 3 reporting to the resumed supervisor on 1 server",
        )
        down = scale(run_dir, 2)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "workers 4 -> 2" in down.stdout
        step_file.write_text("0")
        assert job.wait(timeout=240) == 0, job.output()
    log = events(run_dir)
    [first, second] = [e for e in log if e["kind"] == "scale"]
    assert (first["was"], first["workers"], first["added"]) == (2, 4, {"2": a2, "3": a2})
    assert (second["workers"], second["removed"]) == (2, [3, 2])
    added = {e["rank"]: e["host"] for e in log if e["kind"] == "spawn" and e["rank"] in (2, 3)}
    assert added == {2: a2, 3: a2}
    members = [e["workers"] for e in log if e["kind"] == "ps_members"]
    assert [0, 1, 2, 3] in members and members[-1] == [0, 1]
    # The removed workers finished the shard they were reading and left on
    # their own: exit 0, nobody stopped them, nothing restarted.
    removed = [e for e in log if e["kind"] == "exit" and e.get("removed")]
    assert sorted(e["rank"] for e in removed) == [2, 3]
    assert all(e["exit_code"] == 0 for e in removed), removed
    assert not [e for e in log if e["kind"] in ("restart", "leave_stopped")]
    # Every record was trained exactly once: the shards the removed workers had
    # fetched ahead went back untouched, the ones they were reading they
    # finished, and the supervisor's death lost none and repeated none.
    records = trained_records(out)
    assert sorted(records) == list(range(DATASET))
    data = summary(run_dir)
    assert data["status"] == "succeeded" and data["failures"] == []
    finals = [json.loads((out / f"{r}.json").read_text()) for r in (0, 1)]
    assert finals[0]["params"] == finals[1]["params"]
    assert finals[0]["final_loss"] < 1e-4
    # The server: added on the spare host, given blocks by the resumed supervisor
    # (with the workers' membership), then drained and stopped; one server's map
    # at the end, which the workers followed.
    [grown] = [e for e in log if e["kind"] == "scale_servers" and e["servers"] == 2]
    assert grown["added"] == {"1": a2}
    done = [e for e in log if e["kind"] == "ps_scale" and e["phase"] == "done"]
    assert [e["servers"] for e in done] == [2, 1] and all(e["blocks"] > 0 for e in done)
    drained = [e for e in log if e["kind"] == "ps_scale" and e["phase"] == "drained"]
    assert [(e["servers"], e["all_told"]) for e in drained] == [([1], True)], drained
    retired = [e for e in log if e["kind"] == "exit" and e["role"] == "server" and e["rank"] == 1]
    assert [e.get("retired") for e in retired] == [True], retired
    final_map = [e for e in log if e["kind"] == "ps_placement"][-1]
    assert final_map["servers"] == 1
    for f in finals:
        assert f["placement"] == {"version": final_map["version"], "owner": final_map["owner"]}


def _scaled_to(run_dir: Path) -> int:
    """The servers the job runs once its scale steps are through (0: none yet):
    the servers of the last map a scale made, a scale-in's only once the
    emptied server was stopped."""
    through, shrinking = 0, 0
    for e in events(run_dir):
        if e["kind"] != "ps_scale":
            continue
        if e["phase"] == "done" and e["servers"] < through:
            shrinking = e["servers"]
        elif e["phase"] == "done":
            through = e["servers"]
        elif e["phase"] == "drained" and shrinking:
            through, shrinking = shrinking, 0
    return through
