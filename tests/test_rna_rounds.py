"""RNA's communication threads over real gloo, driven message by message.

Three ``RoundWorker`` threads (one per simulated worker, real TCPStore and gloo
groups on loopback) get the coordinator's messages by hand, so each round's
inputs are known; the global models they end with are held against a
single-process computation of RNA §3.3: each member's staleness-weighted local
mean, ``sum(w g) / sum(w)`` over the members, and SGD with the learning rate
times ``contributors / world``.
"""

from __future__ import annotations

import gc
import queue
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dtlaunch.runtime.rna_rounds import RoundWorker, local_contribution  # noqa: E402
from dtlaunch.wire.messages import (  # noqa: E402
    RnaFailed,
    RnaFormed,
    RnaGroup,
    RnaJoin,
    RnaLeft,
    RnaOpenStore,
    RnaProbe,
    RnaReady,
    RnaRounds,
    RnaStart,
    RnaStoreReady,
)

DIM = 5
LR = 0.1
WAIT_S = 30.0


class Member:
    """One RoundWorker with a model of its own and a record of what it sent."""

    def __init__(self, rank: int, world: int, *, staleness: int = 4, momentum: float = 0.0):
        torch.manual_seed(100 + rank)  # every member starts elsewhere; the source wins
        self.param = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64))
        self.optimizer = torch.optim.SGD([self.param], lr=LR, momentum=momentum)
        self.inbox: queue.Queue[object] = queue.Queue()
        self.outbox: queue.Queue[object] = queue.Queue()
        self.worker = RoundWorker(
            params=[self.param],
            optimizer=self.optimizer,
            inbox=self.inbox,
            send=lambda msg, **_: self.outbox.put(msg),
            rank=rank,
            world_size=world,
            staleness=staleness,
        )
        self.worker.start()

    def expect(self, kind):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                msg = self.outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(msg, kind):
                return msg
            if isinstance(msg, RnaFailed):
                raise AssertionError(f"worker {self.worker.rank} failed: {msg.error}")
        raise AssertionError(f"worker {self.worker.rank} sent no {kind.__name__}")

    def global_model(self) -> np.ndarray:
        with self.worker.lock:
            return self.worker.shadow[0].detach().numpy().copy()


def form(members: list[Member], gen: int = 1, source: int = 0) -> None:
    for m in members:
        m.expect(RnaJoin)
    store = members[0]
    store.inbox.put(RnaOpenStore(gen=gen))
    port = store.expect(RnaStoreReady).port
    ranks = [m.worker.rank for m in members]
    group = RnaGroup(
        gen=gen, members=ranks, store_addr="127.0.0.1", store_port=port,
        source_rank=source, timeout_s=WAIT_S,
    )  # fmt: skip
    for m in members:
        m.inbox.put(group)
    for m in members:
        assert m.expect(RnaFormed).gen == gen


def run_round(members: list[Member], gen: int, round_: int, initiator: int) -> None:
    for m in members:
        m.inbox.put(RnaStart(gen=gen, round=round_, initiator=initiator))
    deadline = time.monotonic() + WAIT_S
    while any(m.worker.applied < round_ + 1 for m in members):
        assert time.monotonic() < deadline, "a round did not finish"
        time.sleep(0.005)


def stop(members: list[Member]) -> None:
    for m in members:
        m.worker.stop()


@pytest.fixture
def three():
    members = [Member(rank, 3) for rank in range(3)]
    yield members
    stop(members)


def test_the_local_contribution_is_the_staleness_weighted_mean():
    g = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0]), torch.tensor([0.5, 0.5])]
    # versions 3 (sum of g0 and g1, two gradients) and 5 (g2), at round 5, bound 4:
    # weights t - min + 1: 1 and 1 for version 3, 3 for version 5; normalised by 5.
    got = local_contribution([(3, g[0] + g[1], 2), (5, g[2], 1)], current=5, bound=4)
    expected = (1 * g[0] + 1 * g[1] + 3 * g[2]) / 5
    assert torch.allclose(got.gradient, expected, atol=1e-12)
    assert got.staleness == 2
    # Bound 1: version 3 is two rounds old and dropped.
    got = local_contribution([(3, g[0] + g[1], 2), (5, g[2], 1)], current=5, bound=1)
    assert torch.equal(got.gradient, g[2]) and got.staleness == 0
    assert local_contribution([], current=5, bound=1).gradient is None


def test_rounds_average_the_contributions_and_scale_the_learning_rate(three):
    members = three
    start = three[0].global_model()
    form(members)
    # After forming, every member holds the source's model.
    for m in members:
        np.testing.assert_array_equal(m.global_model(), start)
    rng = np.random.default_rng(7)
    grads = {key: rng.normal(size=DIM) for key in ("a", "b1", "b2", "c", "d", "e")}

    def t(key):
        return torch.tensor(grads[key])

    # Round 0: member 0 has a; member 1 nothing; member 2 has b1 and b2 (version 0).
    members[0].worker.hand_over(0, t("a"))
    members[2].worker.hand_over(0, t("b1"))
    members[2].worker.hand_over(0, t("b2"))
    run_round(members, 1, 0, initiator=0)
    mean0 = (grads["a"] + (grads["b1"] + grads["b2"]) / 2) / 2
    expected = start - LR * (2 / 3) * mean0
    for m in members:
        np.testing.assert_allclose(m.global_model(), expected, atol=1e-6, rtol=0)
    # Round 1: member 1 has c on version 0 (one round stale) and d on version 1;
    # weights t - min + 1 = 1 and 2. Member 0 has e on version 1. Member 2 nothing.
    members[1].worker.hand_over(0, t("c"))
    members[1].worker.hand_over(1, t("d"))
    members[0].worker.hand_over(1, t("e"))
    run_round(members, 1, 1, initiator=1)
    local1 = (1 * grads["c"] + 2 * grads["d"]) / 3
    mean1 = (local1 + grads["e"]) / 2
    expected = expected - LR * (2 / 3) * mean1
    models = [m.global_model() for m in members]
    for model in models:
        np.testing.assert_allclose(model, expected, atol=1e-6, rtol=0)
    # Not just close: every member applied the same update, bit for bit.
    assert all(np.array_equal(models[0], model) for model in models)
    # A round nobody contributes to leaves the model as it is, and counts.
    run_round(members, 1, 2, initiator=2)
    np.testing.assert_array_equal(members[1].global_model(), models[1])
    # The first member reports the rounds (contributions per member).
    members[0].inbox.put(RnaLeft(round=2))
    report = members[0].expect(RnaRounds)
    assert report.rounds == 3 and report.contributions == [2, 1, 1]
    assert report.sampled and report.sampled[0].contributors == [0, 2]


def test_a_probe_is_answered_once_a_gradient_is_ready(three):
    members = three
    form(members)
    members[1].inbox.put(RnaProbe(gen=1, round=0))
    time.sleep(0.2)
    assert all(not isinstance(m, RnaReady) for m in list(members[1].outbox.queue))
    members[1].worker.hand_over(0, torch.ones(DIM, dtype=torch.float64))
    ready = members[1].expect(RnaReady)
    assert (ready.gen, ready.round) == (1, 0) and ready.waited_s >= 0.15
    # A probe for an old generation is not answered.
    members[0].worker.hand_over(0, torch.ones(DIM, dtype=torch.float64))
    members[0].inbox.put(RnaProbe(gen=0, round=0))
    time.sleep(0.2)
    assert not [m for m in list(members[0].outbox.queue) if isinstance(m, RnaReady)]


def test_a_member_that_dies_fails_the_round_and_keeps_its_gradients_for_the_next_group():
    members = [Member(rank, 3) for rank in range(3)]
    try:
        form(members)
        members[0].worker.hand_over(0, torch.ones(DIM, dtype=torch.float64))
        dead = members.pop()
        dead.worker.stop()
        dead.worker._group = None  # its sockets close, as a killed process's would
        gc.collect()
        for m in members:
            m.inbox.put(RnaStart(gen=1, round=0, initiator=0))
        failures = [m.expect(RnaFailed) for m in members]
        assert all(f.gen == 1 and f.round == 0 for f in failures)
        # Survivors re-form without it; the gradient handed over is still there.
        members[0].inbox.put(RnaOpenStore(gen=2))
        port = members[0].expect(RnaStoreReady).port
        group = RnaGroup(
            gen=2, members=[0, 1], store_addr="127.0.0.1", store_port=port,
            source_rank=0, timeout_s=WAIT_S,
        )  # fmt: skip
        before = members[0].global_model()
        for m in members:
            m.inbox.put(group)
        for m in members:
            assert m.expect(RnaFormed).gen == 2
        run_round(members, 2, 0, initiator=0)
        expected = before - LR * (1 / 3) * np.ones(DIM)
        for m in members:
            np.testing.assert_allclose(m.global_model(), expected, atol=1e-6, rtol=0)
    finally:
        stop(members)


def test_the_optimizer_state_travels_to_a_newcomer():
    members = [Member(rank, 2, momentum=0.9) for rank in range(2)]
    try:
        form(members)
        for round_ in range(3):
            members[0].worker.hand_over(round_, torch.ones(DIM, dtype=torch.float64))
            run_round(members, 1, round_, initiator=0)
        # Worker 1 restarts: a fresh thread, fresh model, no momentum.
        members[1].worker.stop()
        members[1] = Member(1, 2, momentum=0.9)
        members[1].expect(RnaJoin)
        members[0].inbox.put(RnaOpenStore(gen=2))
        port = members[0].expect(RnaStoreReady).port
        group = RnaGroup(
            gen=2, members=[0, 1], store_addr="127.0.0.1", store_port=port,
            source_rank=0, timeout_s=WAIT_S,
        )  # fmt: skip
        for m in members:
            m.inbox.put(group)
        formed = [m.expect(RnaFormed) for m in members]
        assert {f.applied for f in formed} == {3}, "the round count comes from the source"
        for m in members:
            m.worker.hand_over(3, torch.full((DIM,), 2.0, dtype=torch.float64))
        run_round(members, 2, 3, initiator=1)
        models = [m.global_model() for m in members]
        assert np.array_equal(models[0], models[1]), "momentum must have travelled too"
    finally:
        stop(members)


def test_threads_stop_and_leave_nothing_behind(three):
    form(three)
    stop(three)
    assert not any(m.worker.is_alive() for m in three)
    assert not [t for t in threading.enumerate() if t.name.startswith("dtlaunch-rna-")]
