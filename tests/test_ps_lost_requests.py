"""A request lost with a server that died before answering it is sent again.

Issue 12, defect 1: a server SIGKILLed ~0.1 s after the job's placement, while
the workers' first requests (or their seeds) were on their way, restarted
unseeded; the workers whose requests died with it waited for an answer that
would never come, for the full 600 s PS timeout. A client's ping now names the
request it waits for and the server says whether that request waits there; "not
held" with no answer before it means the request was lost, and it goes again.

The dying server here is a bare CURVE ROUTER (the real transport) that answers
the first ``answered`` requests as an unseeded server would, takes the next one
and closes without answering, as SIGKILL would; a real ``PsServer`` then binds the
same endpoint. Pushes sent again (their answer lost on a broken connection) are
applied once: ``ParamStore`` tests below.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from dtlaunch.ps import Client
from dtlaunch.ps.optim import OptimizerConfig
from dtlaunch.ps.server import PsServer, ServerConfig
from dtlaunch.ps.store import ParamStore
from dtlaunch.ps.transport import ServerSocket, new_context
from dtlaunch.wire.keys import create_run_keys, load_peer_keys, write_peer_keys
from dtlaunch.wire.messages import PsInit, PsInitReply

CLIENT_TIMEOUT_S = 30.0  # the client's own give-up; a lost request must not need it


@pytest.fixture
def keys(tmp_path):
    write_peer_keys(tmp_path / "keys", create_run_keys(tmp_path / "run-keys").peer())
    return load_peer_keys(tmp_path / "keys")


def dying_server(keys, answered: int):
    """Bind, answer ``answered`` PsInit as an unseeded server, take one more
    request and close without answering. Returns (endpoint, thread, what it took)."""
    ctx = new_context()
    sock = ServerSocket(ctx, keys, "tcp://127.0.0.1:0")
    taken: list[str] = []

    def serve() -> None:
        try:
            deadline = time.monotonic() + 20
            while len(taken) <= answered and time.monotonic() < deadline:
                incoming = sock.recv(100)
                if incoming is None or incoming.message.TYPE == "ps_ping":
                    continue
                msg = incoming.message
                taken.append(f"{msg.TYPE}:{'data' if getattr(msg, 'with_data', False) else ''}")
                if len(taken) <= answered:
                    assert isinstance(msg, PsInit)
                    reply = PsInitReply(
                        request_id=msg.request_id, seeded=False, version=0, incarnation=7
                    )
                    sock.send(incoming.peer, reply)
        finally:
            sock.close(0)
            ctx.term()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return sock.endpoint, thread, taken


@pytest.mark.parametrize(
    ("answered", "lost"),
    [(0, "ps_init:"), (1, "ps_init:data")],
    ids=["first-request-lost", "seed-lost"],
)
def test_a_request_that_died_with_the_server_is_sent_to_its_successor(keys, answered, lost):
    endpoint, dying, taken = dying_server(keys, answered)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    made: list[Client] = []
    errors: list[BaseException] = []

    def connect() -> None:
        try:
            made.append(
                Client(model, "sgd", 0.1, servers=[endpoint], keys=keys, worker=0,
                       timeout=CLIENT_TIMEOUT_S)
            )  # fmt: skip
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    client_thread = threading.Thread(target=connect, daemon=True)
    client_thread.start()
    dying.join(20)
    assert not dying.is_alive() and taken[-1] == lost, taken
    successor = PsServer(ServerConfig(rank=0, bind=endpoint, workers=(0,)), keys)
    stop = threading.Event()
    serving = threading.Thread(target=successor.serve, args=(stop,), daemon=True)
    serving.start()
    try:
        started = time.monotonic()
        client_thread.join(CLIENT_TIMEOUT_S + 5)
        waited = time.monotonic() - started
        assert not errors, errors
        assert made and waited < 10, f"the client waited {waited:.1f}s for a lost request"
        client = made[0]
        assert successor.store.seeded
        model.weight.grad = torch.ones_like(model.weight)
        model.bias.grad = torch.ones_like(model.bias)
        before = model.weight.detach().clone()
        client.push(1)
        client.pull()
        assert torch.allclose(model.weight, before - 0.1)  # the successor trains
        client.close()
    finally:
        stop.set()
        serving.join(10)


def sgd_store(mode: str, workers=(0, 1)) -> ParamStore:
    store = ParamStore(mode=mode, workers=workers)
    store.seed(OptimizerConfig(name="sgd", lr=1.0).validate(), {0: torch.zeros(3)})
    return store


def test_a_bsp_push_sent_again_is_applied_once():
    store = sgd_store("bsp")
    g0, g1 = torch.full((3,), 1.0), torch.full((3,), 3.0)
    assert store.push(0, 0, 1, {0: g0}).accepted
    again = store.push(0, 0, 1, {0: g0})  # its answer was lost: the same push again
    assert again.accepted and again.update is None and store.open_samples == 1
    done = store.push(1, 0, 1, {0: g1})
    assert done.update is not None and done.update.applied == [0, 1]
    assert torch.equal(store.params[0], torch.full((3,), -2.0))  # mean 2, not (1+1+3)/3
    late = store.push(1, 0, 1, {0: g1})  # after the step applied with it
    assert late.accepted and late.update is None
    assert torch.equal(store.params[0], torch.full((3,), -2.0)) and store.version == 1


def test_an_asp_push_sent_again_is_applied_once():
    store = sgd_store("asp")
    grad = torch.full((3,), 1.0)
    assert store.push(0, 0, 1, {0: grad}).update is not None
    again = store.push(0, 0, 1, {0: grad})
    assert again.accepted and again.update is None
    assert store.version == 1 and torch.equal(store.params[0], torch.full((3,), -1.0))
    assert store.push(1, 0, 1, {0: grad}).update is not None  # another worker's, same step
    assert store.version == 2
