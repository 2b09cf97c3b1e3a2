"""PS servers as real processes on loopback (real ZeroMQ, CURVE): BSP, ASP, BACKUP, membership."""

from __future__ import annotations

import contextlib
import itertools
import threading

import pytest
import torch

from dtlaunch.ps import Client, PsError
from dtlaunch.ps.control import ServerControl
from dtlaunch.ps.local import LocalServer
from dtlaunch.wire.keys import create_run_keys, load_peer_keys, write_peer_keys

pytestmark = pytest.mark.integration

BLOCK_BYTES = 96  # tiny blocks: every weight matrix is cut and spread over both servers
X = torch.randn(16, 6, generator=torch.Generator().manual_seed(7))
Y = torch.randn(16, 1, generator=torch.Generator().manual_seed(8))


@pytest.fixture
def keys_dir(tmp_path):
    run_keys = create_run_keys(tmp_path / "run-keys")
    write_peer_keys(tmp_path / "keys", run_keys.peer())
    return tmp_path / "keys"


@contextlib.contextmanager
def servers(keys_dir, tmp_path, count=2, **env):
    env = {f"DTLAUNCH_PS_{k.upper()}": str(v) for k, v in env.items()}
    procs = [
        LocalServer(rank=i, keys_dir=keys_dir, state_dir=tmp_path / "ps", env=env)
        for i in range(count)
    ]
    try:
        yield [p.wait_ready() for p in procs]
    finally:
        for p in procs:
            p.stop()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def client(model, keys_dir, endpoints, worker, optimizer="adam", **kw):
    return Client(
        model,
        optimizer,
        lr=kw.pop("lr", 0.05),
        servers=endpoints,
        keys=load_peer_keys(keys_dir),
        worker=worker,
        block_bytes=BLOCK_BYTES,
        **kw,
    )


def grads_of(model, rows):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(X[rows]), Y[rows]).backward()


def reference(steps, optimizer=torch.optim.Adam, lr=0.05):
    """Single-process full-batch training: what BSP with any batch split must equal."""
    model = make_model()
    opt = optimizer(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
    return model


def assert_same_params(a, b, atol=1e-5):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=atol, msg=name)


@contextlib.contextmanager
def sgd_workers(keys_dir, endpoints, count):
    """``count`` workers' models and SGD clients (lr 0.1), each pulled once; closed after."""
    models = [make_model() for _ in range(count)]
    clients = [client(m, keys_dir, endpoints, i, "sgd", lr=0.1) for i, m in enumerate(models)]
    try:
        for c in clients:
            c.pull()
        yield models, clients
    finally:
        for c in clients:
            c.close()


def run_workers(keys_dir, endpoints, splits, steps):
    """One thread per worker, each with its own model copy and Client, BSP steps."""
    errors, finals = [], {}

    models = [make_model() for _ in splits]  # the global RNG is not for threads

    def work(worker, rows):
        try:
            model = models[worker]
            with client(model, keys_dir, endpoints, worker) as ps:
                for _ in range(steps):
                    ps.pull()
                    grads_of(model, rows)
                    ps.push(len(rows))
                ps.pull()
                finals[worker] = (model, ps.versions)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, rows)) for i, rows in enumerate(splits)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return finals


@pytest.mark.parametrize("split", [(3, 13), (2, 3, 5, 6)], ids=len)
def test_bsp_with_unequal_batches_equals_full_batch_training(keys_dir, tmp_path, split):
    bounds = [sum(split[:i]) for i in range(len(split) + 1)]
    splits = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    workers = ",".join(str(i) for i in range(len(split)))
    steps = 5
    with servers(keys_dir, tmp_path, workers=workers) as endpoints:
        finals = run_workers(keys_dir, endpoints, splits, steps)
        with ServerControl(endpoints[0], load_peer_keys(keys_dir)) as ctl:
            stats = ctl.stats()
    expected = reference(steps)
    for model, versions in finals.values():
        assert versions == [steps, steps]
        assert_same_params(model, expected)
    assert [u.applied for u in stats.updates] == [list(range(len(split)))] * steps
    assert all(u.samples == 16 and u.update_s > 0 for u in stats.updates)
    assert stats.blocks  # the tiny block size spread the model over both servers


def test_asp_applies_each_gradient_on_arrival(keys_dir, tmp_path):
    with servers(keys_dir, tmp_path, mode="asp", workers="0,1") as endpoints:
        m0, m1 = make_model(), make_model()
        with (
            client(m0, keys_dir, endpoints, 0, "sgd", lr=0.1) as c0,
            client(m1, keys_dir, endpoints, 1, "sgd", lr=0.1) as c1,
        ):
            c0.pull()
            c1.pull()
            start = [p.detach().clone() for p in m0.parameters()]
            grads_of(m0, [0, 1, 2])
            g0 = [p.grad.clone() for p in m0.parameters()]
            c0.push(3)
            c0.pull()  # nobody else pushed: the update is already there
            assert c0.versions == [1, 1]
            for p, s, g in zip(m0.parameters(), start, g0, strict=True):
                torch.testing.assert_close(p.detach(), s - 0.1 * g, rtol=0, atol=1e-6)
            grads_of(m1, [3, 4])  # computed on version 0: stale by one, applied anyway
            g1 = [p.grad.clone() for p in m1.parameters()]
            c1.push(2)
            assert c1.dropped == []
            c1.pull()
            assert c1.versions == [2, 2]
            for p, s, a, b in zip(m1.parameters(), start, g0, g1, strict=True):
                torch.testing.assert_close(p.detach(), s - 0.1 * a - 0.1 * b, rtol=0, atol=1e-6)


def test_backup_applies_with_the_first_n_minus_b_and_reports_the_dropped(keys_dir, tmp_path):
    with servers(keys_dir, tmp_path, workers="0,1,2", backup=1) as endpoints:
        models = [make_model() for _ in range(3)]
        clients = [client(m, keys_dir, endpoints, i, "sgd", lr=0.1) for i, m in enumerate(models)]
        try:
            for c in clients:
                c.pull()
            start = [p.detach().clone() for p in models[0].parameters()]
            rows = [[0, 1], [2, 3, 4, 5], [6]]
            for model, r in zip(models, rows, strict=True):
                grads_of(model, r)
            clients[0].push(2)
            clients[1].push(4)  # 2 of 3: the step applies now, without worker 2
            clients[0].pull()
            assert clients[0].versions == [1, 1]
            clients[2].push(1)  # the slowest arrives after its step
            assert clients[2].dropped == [0, 1]
            clients[2].pull()  # goes on from the new version, no wait
            assert clients[2].versions == [1, 1]
            for p, s, a, b in zip(
                models[2].parameters(),
                start,
                models[0].parameters(),
                models[1].parameters(),
                strict=True,
            ):
                mean = (2 * a.grad + 4 * b.grad) / 6
                torch.testing.assert_close(p.detach(), s - 0.1 * mean, rtol=0, atol=1e-6)
            with ServerControl(endpoints[1], load_peer_keys(keys_dir)) as ctl:
                update = ctl.stats().updates[-1]
            assert (update.applied, update.dropped, update.samples) == ([0, 1], [2], 6)
        finally:
            for c in clients:
                c.close()


def test_backup_never_drops_the_only_gradient_with_records(keys_dir, tmp_path):
    """At the end of the data most workers push empty steps; BACKUP(1) must not
    apply those without the one worker that still trains (it would drop the last
    records step after step)."""
    with (
        servers(keys_dir, tmp_path, count=1, workers="0,1,2", backup=1) as endpoints,
        sgd_workers(keys_dir, endpoints, 3) as (models, clients),
    ):
        grads_of(models[2], [0, 1, 2])
        clients[0].push(0)
        clients[1].push(0)  # 2 of 3 are in, but both are empty: wait for worker 2
        with ServerControl(endpoints[0], load_peer_keys(keys_dir)) as ctl:
            assert ctl.stats().version == 0
            clients[2].push(3)
            assert clients[2].dropped == []
            update = ctl.stats().updates[-1]
        assert (update.applied, update.dropped, update.samples) == ([0, 1, 2], [], 3)


def test_a_final_pull_waits_for_the_last_records_step_without_waiting_for_itself(
    keys_dir, tmp_path
):
    """The end of the data: worker 1 pushed the last records, worker 0 (out of
    data, never pushing that step) pulls its final model. It must get the model
    with those records in, not the version before; and a step holding only
    empty pushes does not hold it up."""
    with (
        servers(keys_dir, tmp_path, workers="0,1,2") as endpoints,
        sgd_workers(keys_dir, endpoints, 3) as (models, clients),
    ):
        grads_of(models[1], [0, 1, 2])
        clients[1].push(3)  # the last records; the step waits for workers 0 and 2
        final = threading.Thread(target=clients[0].pull, kwargs={"final": True})
        final.start()
        final.join(0.5)
        assert final.is_alive()  # worker 0 left; the step still waits for worker 2
        clients[2].push(0)  # worker 2, out of data too, pushes an empty step
        final.join(10)
        assert not final.is_alive()
        assert clients[0].versions == [1, 1]  # the update with the last records
        clients[1].pull()
        assert_same_params(models[0], models[1], atol=0)
        # The next step holds only an empty push: a final pull does not wait on it.
        clients[2].pull()
        clients[2].push(0)
        clients[2].pull(final=True)
        assert clients[2].versions == [1, 1]


def test_removing_or_losing_a_worker_mid_step_does_not_deadlock(keys_dir, tmp_path):
    with servers(keys_dir, tmp_path, workers="0,1,2") as endpoints:
        m0, m1, m2 = make_model(), make_model(), make_model()
        c0 = client(m0, keys_dir, endpoints, 0)
        c1 = client(m1, keys_dir, endpoints, 1)
        c2 = client(m2, keys_dir, endpoints, 2)
        ctls = [ServerControl(e, load_peer_keys(keys_dir)) for e in endpoints]
        try:
            for c in (c0, c1, c2):
                c.pull()
            grads_of(m0, [0, 1])
            c0.push(2)
            waiter = threading.Thread(target=c0.pull)  # waits for workers 1 and 2
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive()
            for ctl in ctls:  # the supervisor removes worker 2 (killed)
                ctl.membership([0, 1])
            c1.close()  # worker 1 leaves on its own
            waiter.join(10)
            assert not waiter.is_alive()
            assert c0.versions == [1, 1]
            for ctl in ctls:  # a worker is added back: steps wait for it again
                ctl.membership([0, 2])
            grads_of(m0, [0, 1])
            c0.push(2)
            c2.pull()  # worker 2 rejoins at the current version
            assert c2.versions == [1, 1]
            grads_of(m2, [2, 3])
            c2.push(2)
            c0.pull()
            assert c0.versions == [2, 2]
            assert ctls[0].stats().updates[-1].applied == [0, 2]
        finally:
            for c in (c0, c1, c2):
                c.close()
            for ctl in ctls:
                ctl.close()


def test_a_peer_without_the_run_keys_or_with_another_model_is_refused(keys_dir, tmp_path):
    other = tmp_path / "other"
    write_peer_keys(other / "keys", create_run_keys(other / "run").peer())
    with servers(keys_dir, tmp_path, count=1, workers="0") as endpoints:
        with pytest.raises(PsError, match="no answer"):
            Client(
                make_model(),
                servers=endpoints,
                keys=load_peer_keys(other / "keys"),
                worker=0,
                timeout=1.0,
            )
        with client(make_model(), keys_dir, endpoints, 0) as ok:  # the server is unharmed
            ok.pull()
            torch.manual_seed(0)
            other = torch.nn.Sequential(
                torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 1)
            )
            with pytest.raises(PsError, match="every worker must build the same model"):
                client(other, keys_dir, endpoints, 1)
