"""PS mode end to end: ``dtlaunch run --servers M`` starts the built-in servers
(``python -m dtlaunch.ps``) and tells the workers where they are."""

from __future__ import annotations

import json

import pytest

from tests.jobs import REPO, SCRIPTS, events, hostfile, job_env, run, summary

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
    # The supervisor kept the first worker's placement map; both followed it.
    [placed] = [e for e in events(run_dir) if e["kind"] == "ps_placement"]
    kept = json.loads((run_dir / "ps_placement.json").read_text())["placement"]
    owners = [b["server"] for b in kept["blocks"]]
    assert placed["blocks"] == len(owners) and sorted(set(owners)) == [0, 1]
    assert sum(placed["bytes_per_server"]) == (8 + 1) * 4
    for f in finals:
        assert f["placement"] == {"version": kept["version"], "owner": owners}
    data = summary(run_dir)
    assert (data["status"], data["mode"], data["servers"]) == ("succeeded", "ps", 2)
    assert data["failures"] == []  # the servers were stopped on purpose at the end


@pytest.mark.integration
def test_nd_moves_a_slow_server_to_the_spare_host_while_the_workers_train(sshd, tmp_path):
    """AntDT-ND on the server side (§VI-A): server 1 runs on a contended host;
    nd sees its update time in the long window, starts a fresh server on the
    spare host, the blocks migrate at a step boundary, and the workers follow."""
    a0, a1, a2 = sshd.addresses
    hosts = hostfile(
        sshd,
        tmp_path / "hosts",
        [f"{a0} slots=2 servers=1", f"{a1} slots=2 servers=1", f"{a2} spare"],
    )
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run", "-H", str(hosts), "--workers", "2", "--servers", "2", "--run-dir", str(run_dir),
        "--dataset-size", "5000", "--shard-size", "200", "--global-batch", "40",
        "--ps-block-bytes", "16", "--output", "0",
        "--policy", "nd:l_trans=1,l_per=2,min_reports=3,restart_cost=0.1",
        "--control-interval", "0.5",
        "--inject", f"persistent:role=server,hosts={a1},delay=0.15",
        str(SCRIPTS / "ps_bsp_worker.py"), str(out), "0.02",
    ]  # fmt: skip
    result = run(args, env=sshd.env(), timeout=240.0, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    log = events(run_dir)
    placed = {(e["role"], e["rank"]): e["host"] for e in log if e["kind"] == "spawn"}
    assert placed[("server", 1)] == a2  # the last spawn of server 1: on the spare host
    kills = [e for e in log if e["kind"] == "decision" and e.get("action") == "KILL_RESTART"]
    assert [(k["role"], k["rank"]) for k in kills] == [("server", 1)]
    assert "persistent straggler: server 1" in kills[0]["reason"]
    moves = [e for e in log if e["kind"] == "ps_move"]
    assert [m["phase"] for m in moves] == ["begin", "moved", "done"], moves
    assert moves[0]["to_endpoint"].startswith(f"tcp://{a2}:")
    assert moves[1]["version"] > 0 and moves[1]["pause_s"] < 5.0
    assert moves[2]["all_redirected"] is True
    retired = [e for e in log if e["kind"] == "exit" and e.get("retired")]
    assert [(e["role"], e["rank"], e["host"]) for e in retired] == [("server", 1, a1)]
    # The servers' update times reached the Monitor, the injected delay apart.
    fed = {e["rank"] for e in log if e["kind"] == "server_reports"}
    assert fed == {0, 1}
    assert any(e["kind"] == "injected" and e["role"] == "server" for e in log)
    finals = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]
    # One model, on the new server too, pulled at the same versions.
    assert finals[0]["params"] == finals[1]["params"], [
        {k: f.get(k) for k in ("versions", "steps", "records", "endpoints")} for f in finals
    ]
    assert finals[0]["final_loss"] < 1e-3
    assert finals[0]["records"] + finals[1]["records"] == 5000
    for f in finals:
        assert f["moves"] == 1 and f["endpoints"][1] == moves[0]["to_endpoint"]
    old_log = (run_dir / "logs" / "server-1.log").read_text()
    assert f"to {moves[0]['to_endpoint']}" in old_log and "imported blocks" in old_log
    data = summary(run_dir)
    assert data["status"] == "succeeded" and data["actions"]["KILL_RESTART"] == 1
    assert [(r["role"], r["rank"], r["host"]) for r in data["restarts"]] == [("server", 1, a1)]


@pytest.mark.integration
def test_backup_workers_drop_the_slowest_gradient_and_its_records_are_read_again(tmp_path):
    """BACKUP_WORKERS(1) (AntDT Table II): every step applies with the first two
    of three gradients, so the injected straggler's are mostly dropped; the
    records of a dropped step go back to the DDS, and every record ends up in an
    applied step."""
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    dataset = 3000
    args = [
        "run", "--workers", "3", "--servers", "1", "--run-dir", str(run_dir),
        "--dataset-size", str(dataset), "--shard-size", "60", "--global-batch", "30",
        "--ps-block-bytes", "16", "--output", "0", "--policy", "backup:b=1",
        "--control-interval", "0.5", "--inject", "persistent:role=worker,ranks=2,delay=0.1",
        str(SCRIPTS / "ps_bsp_worker.py"), str(out), "0.01",
    ]  # fmt: skip
    result = run(args, env=job_env(), timeout=240.0, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    log = events(run_dir)
    [decision] = [e for e in log if e["kind"] == "decision" and e.get("action")]
    assert (decision["action"], decision["count"]) == ("BACKUP_WORKERS", 1)
    dropped = [w for e in log if e["kind"] == "server_reports" for d in e["dropped"] for w in d]
    assert dropped and set(dropped) <= {0, 1, 2}
    assert dropped.count(2) > len(dropped) / 2  # the straggler is the one left out
    # Each worker timed its exchanges with the server, step by step, for the Monitor.
    per_server = [x for e in log if e["kind"] == "reports" for step in e["servers"] for x in step]
    assert per_server and {s for s, _, _ in per_server} == {0}
    assert all(nbytes > 0 and seconds > 0 for _, nbytes, seconds in per_server)
    released = [e for e in log if e["kind"] == "shards_released"]
    assert released and all("BACKUP_WORKERS" in e["reason"] for e in released)
    finals = [json.loads((out / f"{rank}.json").read_text()) for rank in range(3)]
    assert finals[2]["dropped_steps"] > 0
    assert finals[0]["params"] == finals[1]["params"] == finals[2]["params"]
    assert finals[0]["final_loss"] < 1e-3
    applied: set[int] = set()
    for rank in range(3):
        for line in (out / f"{rank}.ledger").read_text().splitlines():
            applied.update(int(x) for x in line.split())
    assert applied == set(range(dataset))  # nothing lost
    data = summary(run_dir)
    assert data["status"] == "succeeded" and data["actions"] == {"BACKUP_WORKERS": 1}
    assert data["shards_done"] == data["shards_total"] and data["duplicate_records"] > 0
