"""``dtlaunch scale`` on a live allreduce job over sshd: the group grows from 2 to
4 workers (the new ranks warm up on the spare host and join at an agreed step,
receiving the model and optimizer state) while the supervisor is SIGKILLed in
the middle of it and resumed, then shrinks back to 2 (the removed ranks finish
the shard they read first). Nobody is restarted, every record is trained
exactly once, and the model converges as without the scaling."""

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

torch = pytest.importorskip("torch")

# 300 steps of 30 records at ~0.04 s: room for the newcomers to import torch
# (5-8 s under make test) and to train before the scale-down.
DATASET, SHARD, STEP_S = 9000, 60, "0.04"


def resized_to(run_dir: Path, workers: int) -> bool:
    return any(
        e["kind"] == "regroup" and e["phase"] == "done" and e.get("workers") == workers
        for e in events(run_dir)
    )


def unscaled_loss(order: list[int]) -> float:
    """The same training without any scaling, in one process: the script's model,
    optimizer and data, SGD over global batches of 30 (what BSP with a
    global-batch mean gradient computes), the records in ``order``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    features = torch.randn(DATASET, 4, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(DATASET, 1, generator=torch.Generator().manual_seed(2))
    targets = features @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.7 + 0.1 * noise
    for start in range(0, len(order), 30):
        batch = order[start : start + 30]
        optimizer.zero_grad()
        (model(features[batch]) - targets[batch]).pow(2).mean().backward()
        optimizer.step()
    with torch.no_grad():
        return float((model(features) - targets).pow(2).mean())


@pytest.mark.integration
def test_an_allreduce_job_grows_and_shrinks_without_a_restart_and_trains_every_record_once(
    sshd, tmp_path
):
    a0, a1, a2 = sshd.addresses
    hosts = hostfile(
        sshd, tmp_path / "hosts", [f"{a0} slots=1", f"{a1} slots=1", f"{a2} slots=2 spare"]
    )
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run", "-H", str(hosts), "--workers", "2", "--run-dir", str(run_dir),
        "--dataset-size", str(DATASET), "--shard-size", str(SHARD), "--global-batch", "30",
        "--output", "0", str(SCRIPTS / "elastic_worker.py"), str(ledger), STEP_S,
    ]  # fmt: skip
    with started(args, env=sshd.env(), log=tmp_path / "log") as job:
        wait_until(lambda: steps_of(run_dir, 1) >= 10, timeout=120, what="worker 1 training")
        refused = scale(run_dir, 31)
        assert refused.returncode == 1 and "at most 30 workers" in refused.stderr, refused.stderr
        up = scale(run_dir, 4)
        assert up.returncode == 0 and "workers 2 -> 4" in up.stdout, up.stdout + up.stderr
        # The newcomers import torch for seconds: the supervisor dies mid-resize.
        job.signal(signal.SIGKILL)
        job.wait(timeout=30)
    assert not resized_to(run_dir, 4)
    resume = ["run", "--resume", str(run_dir)]
    with started(resume, env=sshd.env(), log=tmp_path / "resume.log") as job:
        wait_until(lambda: resized_to(run_dir, 4), timeout=120, what="the group re-formed with 4")
        wait_until(
            lambda: steps_of(run_dir, 2) >= 10 and steps_of(run_dir, 3) >= 10,
            timeout=60,
            what="the new workers 2 and 3 training",
        )
        down = scale(run_dir, 2)
        assert down.returncode == 0 and "workers 4 -> 2" in down.stdout, down.stdout + down.stderr
        assert job.wait(timeout=180) == 0, job.output()
    log = events(run_dir)
    phases = [(e["phase"], e["gen"], e.get("workers")) for e in log if e["kind"] == "regroup"]
    assert phases == [
        ("prewarm", 1, 4), ("begin", 1, None), ("store", 1, None), ("done", 1, 4),
        ("begin", 2, 2), ("store", 2, None), ("done", 2, 2),
    ], phases  # fmt: skip
    added = {e["rank"]: e["host"] for e in log if e["kind"] == "spawn" and e["rank"] in (2, 3)}
    assert added == {2: a2, 3: a2}
    # No restart of anyone: the survivors kept their processes, the newcomers
    # joined without one, and the removed ranks were stopped only once the
    # group had re-formed without them.
    assert not [e for e in log if e["kind"] in ("restart", "failure")]
    removed = sorted(e["rank"] for e in log if e["kind"] == "exit" and e.get("removed"))
    assert removed == [2, 3]
    # Every record exactly once: the removed ranks finished the shard they read
    # before the group moved on, and the ones they fetched ahead went back.
    records = [
        int(r) for path in ledger.glob("*-*.txt") for line in path.read_text().splitlines()
        for r in line.split()
    ]  # fmt: skip
    assert sorted(records) == list(range(DATASET))
    finals = [json.loads((ledger / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert finals[0]["params"] == finals[1]["params"]
    assert finals[0]["last_step"] == finals[1]["last_step"]
    unscaled = unscaled_loss(sorted(records))
    print(f"final loss {finals[0]['final_loss']:.6f}, unscaled {unscaled:.6f}")
    assert abs(finals[0]["final_loss"] - unscaled) <= 0.003, (finals[0]["final_loss"], unscaled)
    assert summary(run_dir)["status"] == "succeeded"


@pytest.mark.integration
def test_a_script_that_attaches_nothing_is_scaled_by_a_group_restart(sshd, tmp_path):
    """A torchrun script (no job.attach()): the group restarts with the new size,
    as torchrun's elastic agent does on a membership change. Each rank's
    ledger holds the records it trained, over its attempts."""
    a0, a1, a2 = sshd.addresses
    hosts = hostfile(sshd, tmp_path / "hosts", [f"{a0} slots=1", f"{a1} slots=1", f"{a2} slots=1"])
    ledger, run_dir = tmp_path / "ledger", tmp_path / "run"
    ledger.mkdir()
    # The workers hold from their 10th step until the scale is asked: it must
    # come while they train, however slowly the command starts on a loaded
    # machine (CI: 6,000 records ended first, in 4 s).
    hold = tmp_path / "hold"
    hold.touch()
    argv = [
        "run", "-H", str(hosts), "--workers", "2", "--run-dir", str(run_dir),
        "--dataset-size", "6000", "--shard-size", "40", "--global-batch", "20",
        "--output", "0", str(SCRIPTS / "bsp_worker.py"), str(ledger), "-1", "0.02", str(hold),
    ]  # fmt: skip
    with started(argv, env=sshd.env(), log=tmp_path / "log") as job:
        # Its ledger, not its reports: those come batched, and may wait behind the hold.
        trained = ledger / "1.txt"
        wait_until(lambda: trained.exists() and len(trained.read_text().splitlines()) >= 5,
                   timeout=120, what="worker 1 training")  # fmt: skip
        up = scale(run_dir, 3)
        hold.unlink()
        assert up.returncode == 0 and "workers 2 -> 3" in up.stdout, up.stdout + up.stderr
        assert job.wait(timeout=180) == 0, job.output()
    log = events(run_dir)
    [restart] = [e for e in log if e["kind"] == "regroup" and e["phase"] == "restart"]
    assert (restart["was"], restart["workers"]) == (2, 3)
    # Every worker of the new group started after the old ones were gone, with
    # WORLD_SIZE 3; the old attempts were stopped, not failed.
    spawns = [e for e in log if e["kind"] == "spawn" and e["role"] == "worker"]
    started_as = sorted((e["rank"], e["attempt"]) for e in spawns)
    assert started_as == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)], started_as
    exits = [e for e in log if e["kind"] == "exit" and e["role"] == "worker"]
    stopped = [e for e in exits if e["requested"]]
    assert sorted(e["rank"] for e in stopped) == [0, 1]
    last_stop = max(e["wall"] for e in stopped)
    assert all(e["wall"] > last_stop for e in spawns if e["attempt"] == 1 or e["rank"] == 2)
    data = summary(run_dir)
    assert data["status"] == "succeeded" and data["failures"] == [], data
    steps = {(ledger / f"{r}.steps").read_text() for r in range(3)}
    assert len(steps) == 1  # the new group's collectives paired to the end
    trained: set[int] = set()
    for r in range(3):
        for line in (ledger / f"{r}.txt").read_text().splitlines():
            trained.update(map(int, line.split()))
    assert trained == set(range(6000))  # at least once: a restart reads in-flight shards again
