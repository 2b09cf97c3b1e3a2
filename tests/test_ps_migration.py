"""PS state that must survive: snapshot + restore after SIGKILL, block migration between servers."""

from __future__ import annotations

import threading

import pytest
import torch

from dtlaunch.ps import Client
from dtlaunch.ps.control import ServerControl, migrate
from dtlaunch.ps.exchange import PsError
from dtlaunch.ps.local import LocalServer
from dtlaunch.ps.snapshot import read_snapshot
from dtlaunch.wire.keys import create_run_keys, load_peer_keys, write_peer_keys

pytestmark = pytest.mark.integration

BLOCK_BYTES = 96
X = torch.randn(12, 5, generator=torch.Generator().manual_seed(3))
Y = torch.randn(12, 1, generator=torch.Generator().manual_seed(4))


@pytest.fixture
def keys_dir(tmp_path):
    write_peer_keys(tmp_path / "keys", create_run_keys(tmp_path / "run-keys").peer())
    return tmp_path / "keys"


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))


def train(ps, model, steps):
    for _ in range(steps):
        ps.pull()
        model.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        ps.push(len(X))
    ps.pull()


def reference(steps):
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
    return model, opt


def assert_params(model, expected):
    for p, q in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-5)


def start(keys_dir, tmp_path, rank, **env):
    env = {f"DTLAUNCH_PS_{k.upper()}": str(v) for k, v in env.items()}
    return LocalServer(rank=rank, keys_dir=keys_dir, state_dir=tmp_path / "ps", env=env)


def test_snapshot_survives_sigkill_and_restores_blocks_and_optimizer_state(keys_dir, tmp_path):
    snap = tmp_path / "ps" / "server-0.snapshot"
    servers = [
        start(keys_dir, tmp_path, 0, workers="0", snapshot=snap),
        start(keys_dir, tmp_path, 1, workers="0"),
    ]
    endpoints = [s.wait_ready() for s in servers]
    model = make_model()
    keys = load_peer_keys(keys_dir)
    ps = Client(
        model, "adam", lr=0.05, servers=endpoints, keys=keys, worker=0, block_bytes=BLOCK_BYTES
    )
    try:
        train(ps, model, 3)
        with ServerControl(endpoints[0], keys) as ctl:
            assert ctl.snapshot() == str(snap)
        servers[0].kill()  # SIGKILL: no goodbye, no final snapshot
        saved = read_snapshot(snap)
        assert saved.version == 3
        assert all(
            state.step == 3 and set(state.tensors) == {"exp_avg", "exp_avg_sq"}
            for _, state in saved.blocks.values()
        )
        servers[0] = start(keys_dir, tmp_path, 0, workers="0", snapshot=snap, restore=snap)
        endpoints[0] = servers[0].wait_ready()
        ps.use_placement(ps.placement.reassign({}), servers=endpoints)
        train(ps, model, 2)  # Adam's moments came back too, or this would differ
        assert ps.versions == [5, 5]
        assert_params(model, reference(5)[0])
    finally:
        ps.close()
        for s in servers:
            s.stop()
    assert read_snapshot(snap).version == 5  # SIGTERM wrote a final snapshot


def test_migrating_blocks_keeps_values_and_optimizer_state(keys_dir, tmp_path):
    servers = [start(keys_dir, tmp_path, i, workers="0") for i in range(2)]
    endpoints = [s.wait_ready() for s in servers]
    model = make_model()
    keys = load_peer_keys(keys_dir)
    ps = Client(
        model, "adam", lr=0.05, servers=endpoints, keys=keys, worker=0, block_bytes=BLOCK_BYTES
    )
    ctls = [ServerControl(e, keys) for e in endpoints]
    try:
        train(ps, model, 3)
        moving = [b.block_id for b in ps.placement.blocks_on(0)]
        assert moving
        # Before the move, copy what server 0 holds to compare after it.
        before = ctls[0].export(moving, remove=False).tensors()
        at = migrate(ctls[0], ctls[1], moving, at_version=3)
        assert at == 3
        assert ctls[0].stats().blocks == []
        assert ctls[1].stats().blocks == list(range(len(ps.placement.blocks)))
        after = ctls[1].export(moving, remove=False).tensors()
        for block_id in moving:
            assert set(after[block_id]) == {"param", "exp_avg", "exp_avg_sq"}
            for name, value in before[block_id].items():
                assert torch.equal(after[block_id][name], value)
        ps.use_placement(ps.placement.reassign({b: 1 for b in moving}))
        train(ps, model, 2)
        expected, _ = reference(5)
        assert_params(model, expected)
        assert ctls[1].stats().version == 5
    finally:
        ps.close()
        for ctl in ctls:
            ctl.close()
        for s in servers:
            s.stop()


def test_a_server_replaced_mid_training_redirects_its_clients_and_loses_nothing(
    keys_dir, tmp_path
):
    """Two BSP workers (threads); server 0's blocks move to a fresh process at a
    step boundary while they train. They follow the redirect on their own, and
    the result is the full-batch run's, Adam's state included."""
    servers = [start(keys_dir, tmp_path, i, workers="0,1") for i in range(2)]
    replacement = start(keys_dir, tmp_path / "new", 0, workers="0,1")  # unseeded
    endpoints = [s.wait_ready() for s in servers]
    new_endpoint = replacement.wait_ready()
    keys = load_peer_keys(keys_dir)
    halves = [(X[:6], Y[:6]), (X[6:], Y[6:])]
    steps, moved_at = 8, {}
    errors: list[BaseException] = []
    models = [make_model() for _ in range(2)]
    clients = [
        Client(m, "adam", lr=0.05, servers=endpoints, keys=keys, worker=w, block_bytes=BLOCK_BYTES)
        for w, m in enumerate(models)
    ]
    progress = threading.Barrier(3)

    def worker(w: int) -> None:
        ps, model, (x, y) = clients[w], models[w], halves[w]
        try:
            for step in range(steps):
                ps.pull()
                model.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                ps.push(len(x))
                if step == 2:
                    progress.wait(timeout=30)  # the mover starts while they train on
            ps.pull()
        except BaseException as exc:
            errors.append(exc)
            progress.abort()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    old, new = ServerControl(endpoints[0], keys), ServerControl(new_endpoint, keys)
    try:
        for t in threads:
            t.start()
        progress.wait(timeout=30)
        blocks = old.stats().blocks
        moved_at["version"] = migrate(
            old, new, blocks, at_version=old.stats().version + 1, redirect=True
        )
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert 3 <= moved_at["version"] < steps
        assert old.stats().blocks == [] and new.stats().blocks == blocks
        assert old.stats().redirected == [0, 1]  # each worker was told, then went there
        assert new.stats().version == steps
        expected, _ = reference(steps)
        for ps, model in zip(clients, models, strict=True):
            assert ps.endpoints == [new_endpoint, endpoints[1]]
            assert_params(model, expected)
    finally:
        for ps in clients:
            ps.close()
        old.close()
        new.close()
        for s in [*servers, replacement]:
            s.stop()


def test_an_export_its_caller_gave_up_on_never_happens(keys_dir, tmp_path):
    server = start(keys_dir, tmp_path, 0, workers="0")
    endpoint = server.wait_ready()
    model = make_model()
    keys = load_peer_keys(keys_dir)
    ps = Client(model, "adam", lr=0.05, servers=[endpoint], keys=keys, worker=0,
                block_bytes=BLOCK_BYTES)  # fmt: skip
    try:
        train(ps, model, 1)
        blocks = [b.block_id for b in ps.placement.blocks]
        with ServerControl(endpoint, keys, timeout=2.5) as ctl:
            # The server gives up first (the caller's timeout minus 2 s) and says so.
            with pytest.raises(PsError, match="export expired before a step boundary"):
                ctl.export(blocks, at_version=3, moved_to="tcp://127.0.0.1:1")
            train(ps, model, 2)  # version 3: the boundary it waited for...
            assert ctl.stats().blocks == blocks  # ...exported nothing to nobody
        assert ps.moves == 0
    finally:
        ps.close()
        server.stop()
