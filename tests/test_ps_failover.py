"""A PS server SIGKILLed mid-training and restarted on its endpoint: nothing is lost.

Real server processes (``LocalServer``, and a real ``dtlaunch run --servers 2``),
real ZeroMQ/CURVE, real torch. Two workers train a small MLP on halves of a
batch; under BSP their weighted mean gradient is the full-batch gradient, so an
uninterrupted run equals single-process training (``reference``), and so must a
run whose server was killed: the clients notice the new process, offer their
last pull, re-send the gradient the dead process took with it, and go on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from dtlaunch.ps import Client
from dtlaunch.ps.control import ServerControl
from dtlaunch.ps.local import LocalServer
from dtlaunch.ps.server import PsServer, ServerConfig
from dtlaunch.wire.keys import create_run_keys, load_peer_keys, write_peer_keys

pytestmark = pytest.mark.integration

BLOCK_BYTES = 96  # tiny blocks: both servers hold part of every weight matrix
X = torch.randn(16, 6, generator=torch.Generator().manual_seed(11))
Y = torch.randn(16, 1, generator=torch.Generator().manual_seed(12))
HALVES = (list(range(8)), list(range(8, 16)))
OPTIMIZERS = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.1), {"lr": 0.1}),
    "momentum": (
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        {"lr": 0.1, "momentum": 0.9},
    ),
    "adam": (lambda ps: torch.optim.Adam(ps, lr=0.05), {"lr": 0.05}),
}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def keys_dir(tmp_path):
    write_peer_keys(tmp_path / "keys", create_run_keys(tmp_path / "run-keys").peer())
    return tmp_path / "keys"


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def reference(steps, optimizer):
    model = make_model()
    opt = OPTIMIZERS[optimizer][0](model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
    return model


def loss(model):
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(X), Y).item()


def max_diff(model, expected):
    return max(
        (p.detach() - q.detach()).abs().max().item()
        for p, q in zip(model.parameters(), expected.parameters(), strict=True)
    )


class Servers:
    """Two servers: 0 in this process (a thread: it only has to stay up), 1 a
    process; ``kill_and_restart`` SIGKILLs server 1 and starts a new one on its
    endpoint, restoring its snapshot file when there is one (as the supervisor does)."""

    def __init__(self, keys_dir, tmp_path, mode="bsp", snapshot_interval=None):
        self.keys_dir, self.state_dir = keys_dir, tmp_path / "ps"
        self.mode, self.interval = mode, snapshot_interval
        self.procs = {1: self._start(1, "tcp://127.0.0.1:0")}
        config = ServerConfig(rank=0, mode=mode, workers=(0, 1))
        self.server0 = PsServer(config, load_peer_keys(keys_dir))
        self.stop0 = threading.Event()
        self.thread0 = threading.Thread(target=self.server0.serve, args=(self.stop0,))
        self.thread0.start()
        self.endpoints = [self.server0.endpoint, self.procs[1].wait_ready()]

    def _start(self, rank, bind, restore=False):
        env = {
            "DTLAUNCH_PS_BIND": bind,
            "DTLAUNCH_PS_MODE": self.mode,
            "DTLAUNCH_PS_WORKERS": "0,1",
            "DTLAUNCH_PS_SNAPSHOT": str(self.snapshot(rank)),
        }
        if self.interval is not None:
            env["DTLAUNCH_PS_SNAPSHOT_INTERVAL"] = str(self.interval)
        if restore:
            env["DTLAUNCH_PS_RESTORE"] = str(self.snapshot(rank))
            env["DTLAUNCH_PS_RESTORE_OPTIONAL"] = "1"
        return LocalServer(rank=rank, keys_dir=self.keys_dir, state_dir=self.state_dir, env=env)

    def snapshot(self, rank):
        return self.state_dir / f"server-{rank}.snapshot"

    def control(self, rank):
        return ServerControl(self.endpoints[rank], load_peer_keys(self.keys_dir), timeout=10)

    def kill_and_restart(self, rank=1):
        self.procs[rank].kill()
        self.procs[rank] = self._start(rank, self.endpoints[rank], restore=True)
        assert self.procs[rank].wait_ready() == self.endpoints[rank]

    def log(self, rank=1):
        return (self.state_dir / f"server-{rank}.log").read_text()

    def stop(self):
        self.stop0.set()
        self.procs[1].stop()
        self.thread0.join(10)


@pytest.fixture
def make_servers(keys_dir, tmp_path):
    made = []

    def make(**kw):
        made.append(Servers(keys_dir, tmp_path, **kw))
        return made[-1]

    yield make
    for servers in made:
        servers.stop()


def clients(servers, models, optimizer):
    opts = OPTIMIZERS[optimizer][1]
    return [
        Client(
            model,
            "adam" if optimizer == "adam" else "sgd",
            servers=servers.endpoints,
            keys=load_peer_keys(servers.keys_dir),
            worker=i,
            block_bytes=BLOCK_BYTES,
            timeout=30,
            **opts,
        )
        for i, model in enumerate(models)
    ]


def grads(model, rows):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(X[rows]), Y[rows]).backward()


def step(cs, models, *, push=(0, 1)):
    for c, m, rows in zip(cs, models, HALVES, strict=True):
        c.pull()
        grads(m, rows)
    for i in push:
        cs[i].push(len(HALVES[i]))


@pytest.mark.parametrize(
    ("optimizer", "snapshot_at", "tolerance"),
    [("sgd", 2, 1e-6), ("sgd", None, 1e-6), ("momentum", 4, 0.1)],
    ids=["sgd-old-snapshot", "sgd-no-snapshot", "momentum-old-snapshot"],
)
def test_a_step_pushed_to_the_killed_server_is_redone(
    make_servers, optimizer, snapshot_at, tolerance
):
    """Worker 0 pushed step 5 to server 1, which dies before worker 1's push: the
    new process takes worker 1's copy (version 5, newer than the snapshot or than
    nothing), worker 0 re-sends its step-5 gradient, the step completes once."""
    servers = make_servers()
    models = [make_model(), make_model()]
    cs = clients(servers, models, optimizer)
    try:
        for k in range(10):
            if k == snapshot_at:
                with servers.control(1) as ctl:
                    ctl.snapshot()
            step(cs, models, push=(0,))
            if k == 5:
                servers.kill_and_restart()
            cs[1].push(len(HALVES[1]))
        for c in cs:
            c.pull()
        assert [c.versions for c in cs] == [[10, 10]] * 2
        assert [c.restarts for c in cs] == [1, 1]
        with servers.control(1) as ctl:
            stats = ctl.stats()
        assert stats.version == 10 and [u.applied for u in stats.updates] == [[0, 1]] * 5
    finally:
        for c in cs:
            c.close()
    expected = reference(10, optimizer)
    for model in models:
        assert max_diff(model, expected) <= tolerance
        assert abs(loss(model) - loss(expected)) <= 0.01  # training moved it by 0.4
    taken = "took worker 1's copy of" if snapshot_at is not None else "seeded by worker 1:"
    assert re.search(taken + r" \d+ blocks at version 5\b", servers.log())
    if optimizer == "momentum":  # the snapshot's momentum is a step old: close, not equal
        assert max_diff(models[0], expected) > 1e-6


def test_a_newer_copy_arriving_second_replaces_an_older_one(make_servers):
    """Worker 1 (copy at 5, its step-5 gradient lost) resyncs first and re-sends
    that gradient; worker 0 (copy at 6: it pulled the finished step) comes second.
    The server drops the half-done step for worker 0's copy, without applying
    anything twice, and both go on from version 6."""
    servers = make_servers()
    models = [make_model(), make_model()]
    cs = clients(servers, models, "sgd")
    errors = []
    try:
        for k in range(8):
            if k == 2:
                with servers.control(1) as ctl:
                    ctl.snapshot()
            step(cs, models)
            if k == 5:
                cs[0].pull()  # worker 0 has version 6, worker 1 still 5
                servers.kill_and_restart()

                def pull_late(c=cs[1]):
                    try:
                        c.pull()
                    except BaseException as exc:
                        errors.append(exc)

                late = threading.Thread(target=pull_late)
                late.start()
                deadline = time.monotonic() + 20
                while "took worker 1's copy" not in servers.log():
                    assert time.monotonic() < deadline, servers.log()
                    time.sleep(0.02)
                time.sleep(0.3)  # its re-sent step-5 gradient lands in the open step
                grads(models[0], HALVES[0])
                cs[0].push(len(HALVES[0]))  # stale incarnation: resync with version 6
                late.join(20)
                assert not late.is_alive() and not errors, errors
                assert cs[1].versions == [6, 6]
                grads(models[1], HALVES[1])
                cs[1].push(len(HALVES[1]))
        for c in cs:
            c.pull()
        assert [c.versions for c in cs] == [[9, 9]] * 2
    finally:
        for c in cs:
            c.close()
    # 8 loop steps and the extra one of step 5's detour
    expected = reference(9, "sgd")
    for model in models:
        assert max_diff(model, expected) <= 1e-6
    log = servers.log()
    assert re.search(r"took worker 1's copy of \d+ blocks at version 5 \(held 2;", log)
    assert re.search(r"took worker 0's copy of \d+ blocks at version 6 \(held 5;", log)


def test_a_fresh_snapshot_restores_adam_exactly(make_servers):
    """Killed right after a snapshot of the finished step: the snapshot (with Adam's
    moments) is as new as any worker's copy, so it wins and nothing differs. A
    pull that waits long for a slow worker is not mistaken for a lost server."""
    servers = make_servers()
    models = [make_model(), make_model()]
    cs = clients(servers, models, "adam")
    try:
        for k in range(8):
            if k == 5:  # worker 1 pushes late: worker 0's pull pings a live server
                step(cs, models, push=(0,))
                late = threading.Timer(1.5, cs[1].push, args=(len(HALVES[1]),))
                late.start()
                started = time.monotonic()
                cs[0].pull()
                late.join()
                assert time.monotonic() - started >= 1.4
            else:
                step(cs, models)
            if k == 3:
                for c in cs:
                    c.pull()
                with servers.control(1) as ctl:
                    ctl.snapshot()
                servers.kill_and_restart()
        for c in cs:
            c.pull()
        assert [c.restarts for c in cs] == [1, 1]  # the pings found the same processes
    finally:
        for c in cs:
            c.close()
    expected = reference(8, "adam")
    for model in models:
        assert max_diff(model, expected) <= 1e-6
    log = servers.log()
    assert re.search(r"restored \d+ blocks at version 4\b", log) and "took worker" not in log


def test_free_running_workers_survive_a_kill_with_periodic_snapshots(make_servers):
    """Two worker threads train without any coordination with the kill; the
    server snapshots every 50 ms. The result equals uninterrupted training."""
    servers = make_servers(snapshot_interval=0.05)
    models = [make_model(), make_model()]
    cs = clients(servers, models, "sgd")
    steps, errors, reached = 60, [], threading.Event()

    def work(i):
        try:
            for k in range(steps):
                cs[i].pull()
                grads(models[i], HALVES[i])
                cs[i].push(len(HALVES[i]))
                if k == 20:
                    reached.set()
            cs[i].pull()
        except BaseException as exc:
            errors.append(exc)
            reached.set()

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        assert reached.wait(30)
        servers.kill_and_restart()
        for t in threads:
            t.join(40)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert [c.versions for c in cs] == [[steps, steps]] * 2
    finally:
        for c in cs:
            c.close()
    expected = reference(steps, "sgd")
    for model in models:
        assert max_diff(model, expected) <= 1e-5


def test_asp_goes_on_after_a_kill_and_loses_no_gradient(make_servers):
    """ASP: the workers take turns; server 1 dies right after worker 0's push.
    Each worker re-sends the gradient the restored copy lacks, so every gradient
    is applied once (the server counts them), and the result stays close to the
    same turns without a kill (a re-sent gradient meets newer parameters)."""
    servers = make_servers(mode="asp")
    models = [make_model(), make_model()]
    cs = clients(servers, models, "sgd")
    try:
        for k in range(10):
            if k == 2:
                with servers.control(1) as ctl:
                    ctl.snapshot()
            for i in (0, 1):
                cs[i].pull()
                grads(models[i], HALVES[i])
                cs[i].push(len(HALVES[i]))
                if (k, i) == (6, 0):
                    servers.kill_and_restart()
        for c in cs:
            c.pull()
        with servers.control(1) as ctl:
            applied = ctl.stats().updates
        assert [c.versions for c in cs] == [[20, 20]] * 2
    finally:
        for c in cs:
            c.close()
    # The new process took worker 1's copy at version 11 (its pull of round 5):
    # worker 1 re-sent its round-5 gradient (version 12), pushed round 6's, then
    # worker 0 re-sent its round-6 gradient and the turns went on: 20 gradients.
    assert applied[0].version == 12
    assert [u.applied for u in applied] == [[1], [1], [0]] + [[0], [1]] * 3
    # The same turns without a kill: one SGD step per half batch, in turn.
    plain = make_model()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for _ in range(10):
        for rows in HALVES:
            opt.zero_grad()
            torch.nn.functional.mse_loss(plain(X[rows]), Y[rows]).backward()
            opt.step()
    for model in models:
        assert max_diff(model, plain) < 0.05
        assert abs(loss(model) - loss(plain)) < 0.01


def test_dtlaunch_run_survives_a_server_sigkill(tmp_path):
    """The issue's repro: `dtlaunch run --workers 2 --servers 2`, server 1 SIGKILLed
    mid-training; the supervisor restarts it on its endpoint and the job finishes
    with the loss of an uninterrupted run."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    argv = [
        sys.executable, "-m", "dtlaunch", "run", "--workers", "2", "--servers", "2",
        "--run-dir", str(run_dir), "--dataset-size", "20000", "--shard-size", "200",
        "--global-batch", "40", "--epochs", "1", "--ps-snapshot-interval", "0.5",
        "--output", "0", str(REPO / "tests/scripts/ps_worker.py"), str(out), "sgd", "0.05",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "log", "wb") as log:
        job = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        snapshot = run_dir / "agents/localhost/ps/server-1.snapshot"
        deadline = time.monotonic() + 60
        while not snapshot.exists():  # training is under way: server 1 was seeded
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.02)
        time.sleep(0.3)
        events = [
            json.loads(line) for line in (run_dir / "events.jsonl").read_text().split("\n") if line
        ]
        pid = next(
            e["pid"]
            for e in events
            if e["kind"] == "running" and e["role"] == "server" and e["rank"] == 1
        )
        os.kill(pid, signal.SIGKILL)
        assert not list(out.iterdir()), "killed too late: a worker had finished"
        assert job.wait(90) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    events = [
        json.loads(line) for line in (run_dir / "events.jsonl").read_text().split("\n") if line
    ]
    restarted = [
        e for e in events
        if e["kind"] == "running" and e["role"] == "server" and e["rank"] == 1 and e["attempt"] == 1
    ]  # fmt: skip
    assert restarted, "the supervisor did not restart server 1"
    results = [json.loads((out / f"{r}.json").read_text()) for r in (0, 1)]
    assert [r["steps"] for r in results] == [500, 500]
    # An uninterrupted run ends at ~1e-13 (the targets are exactly linear).
    assert all(r["final_loss"] < 1e-9 for r in results), results
    assert results[0]["params"] == results[1]["params"]
    worker_logs = "".join((run_dir / "logs" / f"worker-{r}.log").read_text() for r in (0, 1))
    server_log = (run_dir / "logs/server-1.log").read_text()
    assert "restarted (incarnation" in worker_logs + (tmp_path / "log").read_text()
    assert "restored" in server_log or "seeded by worker" in server_log.split("attempt 1")[-1]
