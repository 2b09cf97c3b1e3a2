"""RNA's communication threads over real gloo, driven message by message.

Three ``RoundWorker`` threads (one per simulated worker, real TCPStore and gloo
groups on loopback) get the coordinator's messages by hand, so each round's
inputs are known; the global models they end with are held against a
single-process computation of RNA §3.3: each member's staleness-weighted local
mean, ``sum(w g) / sum(w)`` over the members, and SGD with the learning rate
times ``contributors / world``.
"""

from __future__ import annotations

import contextlib
import gc
import queue
import socket
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch._C._distributed_c10d import TCPStore  # noqa: E402

from dtlaunch.runtime.rna_meeting import SUPERSEDED_VISIT_S  # noqa: E402
from dtlaunch.runtime.rna_pending import local_contribution, state_source  # noqa: E402
from dtlaunch.runtime.rna_rounds import RoundWorker  # noqa: E402
from dtlaunch.runtime.store import CONNECT_GRACE_S  # noqa: E402
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
    """One RoundWorker with a model of its own and a record of what it sent;
    ``x0``: its model's start (default: random, every member elsewhere);
    ``exchange``: hierarchical RNA's exchange with a parameter server."""

    def __init__(
        self,
        rank: int,
        world: int,
        *,
        staleness: int = 4,
        momentum: float = 0.0,
        dampening: float = 0.0,
        correct_momentum: bool = False,
        x0: np.ndarray | None = None,
        exchange=None,
        run: bool = True,
        average: float = 0.0,
    ):
        torch.manual_seed(100 + rank)  # every member starts elsewhere; the source wins
        start = torch.randn(DIM, dtype=torch.float64) if x0 is None else torch.tensor(x0)
        self.param = torch.nn.Parameter(start)
        self.optimizer = torch.optim.SGD(
            [self.param], lr=LR, momentum=momentum, dampening=dampening
        )
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
            correct_momentum=correct_momentum,
            exchange=exchange,
            average=average,
        )
        if run:
            self.worker.start()

    def expect(self, kind, *, given_up=()):
        """The next message of ``kind``; a failure (other than forming one of the
        generations ``given_up``) is an error."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                msg = self.outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(msg, kind):
                return msg
            if isinstance(msg, RnaFailed) and not (msg.round == -1 and msg.gen in given_up):
                raise AssertionError(f"worker {self.worker.rank} failed: {msg.error}")
        raise AssertionError(f"worker {self.worker.rank} sent no {kind.__name__}")

    def global_model(self) -> np.ndarray:
        with self.worker.lock:
            return self.worker.shadow[0].detach().numpy().copy()

    def final_model(self) -> np.ndarray:
        with self.worker.lock:
            return self.worker.final_model()[0].detach().numpy().copy()


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


@pytest.mark.parametrize(
    ("correct", "dampening"), [(True, 0.0), (False, 0.0), (True, 0.2)],
    ids=["auto", "keep", "auto-dampened"],
)  # fmt: skip
def test_momentum_is_lightened_by_the_rounds_mean_staleness(correct, dampening):
    """``momentum=auto``: each round's SGD momentum is ``0.9 x (1 - mean
    staleness)`` over that round's contributors, its rate raised to keep the step
    ``lr / (1 - 0.9)``; ``keep`` applies 0.9 and the rate, and so does ``auto``
    for a momentum with dampening (its step is another formula). Held against a
    single-process SGD with those momenta and rates."""
    members = [
        Member(r, 3, momentum=0.9, dampening=dampening, correct_momentum=correct) for r in range(3)
    ]
    try:
        start = members[0].global_model()
        form(members)
        rng = np.random.default_rng(11)
        g = {key: rng.normal(size=DIM) for key in ("a", "b", "c", "d")}
        # Round 0: fresh gradients from members 0 and 2 (staleness 0).
        members[0].worker.hand_over(0, torch.tensor(g["a"]))
        members[2].worker.hand_over(0, torch.tensor(g["b"]))
        run_round(members, 1, 0, initiator=0)
        # Round 1: member 0's gradient is of version 0 (one round stale), member
        # 1's of version 1 (fresh): mean staleness 0.5, momentum 0.45, the rate
        # times (1 - 0.45) / (1 - 0.9).
        members[0].worker.hand_over(0, torch.tensor(g["c"]))
        members[1].worker.hand_over(1, torch.tensor(g["d"]))
        run_round(members, 1, 1, initiator=1)
        momentum, rate = (0.45, 5.5) if correct and not dampening else (0.9, 1.0)
        buf = (g["a"] + g["b"]) / 2  # torch's first step: the buffer is the gradient
        expected = start - LR * (2 / 3) * buf
        buf = momentum * buf + (1 - dampening) * (g["c"] + g["d"]) / 2
        expected = expected - LR * (2 / 3) * rate * buf
        models = [m.global_model() for m in members]
        for model in models:
            np.testing.assert_allclose(model, expected, atol=1e-9, rtol=0)
        assert all(np.array_equal(models[0], model) for model in models)
    finally:
        stop(members)


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


def regroup(members: list[Member], gen: int, source: int, given_up=()) -> list[RnaFormed]:
    """Form generation ``gen`` of ``members`` (already joined), as the
    coordinator does after a failure; the first member hosts the store."""
    members[0].inbox.put(RnaOpenStore(gen=gen))
    port = members[0].expect(RnaStoreReady).port
    group = RnaGroup(
        gen=gen, members=[m.worker.rank for m in members], store_addr="127.0.0.1",
        store_port=port, source_rank=source, timeout_s=WAIT_S,
    )  # fmt: skip
    for m in members:
        m.inbox.put(group)
    return [m.expect(RnaFormed, given_up=given_up) for m in members]


class ResetAfterTheData:
    """A member's gloo group whose allreduce receives every contribution and
    then fails: its last send went to a peer that had just been killed. The
    members that received everything complete the round; this one does not."""

    def __init__(self, group):
        self.group = group

    def allreduce(self, tensors):
        work = self.group.allreduce(tensors)

        class Failing:
            def wait(self):
                work.wait()
                raise RuntimeError("Connection reset by peer")

        return Failing()


class FailsAtOnce:
    """A member's gloo group whose peer is gone before the round sends anything."""

    def allreduce(self, tensors):
        raise RuntimeError("Connection reset by peer")


def test_the_state_comes_from_the_member_with_the_most_rounds():
    assert state_source([7, 7, 7], 1) == 1  # equals: the coordinator's source
    assert state_source([7, 8, 8], 0) == 1  # a round ended on workers 1 and 2 only
    assert state_source([8, 7, 8], 2) == 2
    assert state_source([0, 5, 0], 0) == 1
    # Hierarchical RNA: (rounds, exchanges); an exchange whose broadcast ended on
    # worker 1 only put the server's model there: it is ahead at equal rounds.
    assert state_source([(7, 2), (7, 3), (7, 2)], 0) == 1
    assert state_source([(8, 2), (7, 3)], 1) == 0  # rounds first


def test_a_round_that_ended_on_some_members_only_is_kept_by_the_next_group():
    """Worker 1 is killed in round 0: workers 1 and 2 got every contribution and
    applied it, worker 0's collective failed. The coordinator re-forms [0, 2]
    and names worker 0 (the first survivor) the source: worker 2 must not be set
    back a round (it may have trained on, and recorded, the model of round 0's
    result), and worker 0's gradient, which is in round 0, is not used twice."""
    members = [Member(rank, 3) for rank in range(3)]
    try:
        form(members)
        for m in members:
            m.worker.hand_over(0, torch.full((DIM,), m.worker.rank + 1.0, dtype=torch.float64))
        members[0].worker._group = ResetAfterTheData(members[0].worker._group)
        for m in members:
            m.inbox.put(RnaStart(gen=1, round=0, initiator=0))
        assert members[0].expect(RnaFailed).round == 0
        members[0].expect(RnaJoin)  # it asks back in
        deadline = time.monotonic() + WAIT_S
        while members[1].worker.applied < 1 or members[2].worker.applied < 1:
            assert time.monotonic() < deadline, "round 0 did not end on workers 1 and 2"
            time.sleep(0.005)
        assert members[0].worker.applied == 0
        ahead = members[2].global_model()
        published = members[2].worker.published
        killed = members.pop(1)
        killed.worker.stop()
        formed = regroup(members, gen=2, source=0)
        assert [f.applied for f in formed] == [1, 1], "nobody goes back a round"
        for m in members:
            np.testing.assert_array_equal(m.global_model(), ahead)
        assert members[1].worker.published == published, "worker 2's model did not change"
        assert not members[0].worker._pending, "its gradient went into round 0 already"
        run_round(members, 2, 1, initiator=2)  # nothing to add: the model stays
        for m in members:
            np.testing.assert_array_equal(m.global_model(), ahead)
    finally:
        stop(members)


def test_a_failed_round_s_gradients_come_back_when_the_round_ran_without_them():
    members = [Member(rank, 3) for rank in range(3)]
    try:
        form(members)
        members[0].worker.hand_over(0, torch.ones(DIM, dtype=torch.float64))
        members[0].worker._group = FailsAtOnce()
        members[0].inbox.put(RnaStart(gen=1, round=0, initiator=0))
        assert members[0].expect(RnaFailed).round == 0
        # The others ran rounds 0 and 1 in a group without it (it did not answer).
        others = members[1:]
        regroup(others, gen=2, source=1)
        run_round(others, 2, 0, initiator=1)
        run_round(others, 2, 1, initiator=2)
        before = members[1].global_model()
        formed = regroup(members, gen=3, source=1)
        assert [f.applied for f in formed] == [2, 2, 2]
        assert members[0].worker._pending, "round 0 ran without its gradient: pending again"
        run_round(members, 3, 2, initiator=0)
        expected = before - LR * (1 / 3) * np.ones(DIM)
        for m in members:
            np.testing.assert_allclose(m.global_model(), expected, atol=1e-9, rtol=0)
    finally:
        stop(members)


def test_a_group_given_up_while_it_forms_does_not_hold_its_members_up():
    """A collective failed, so the coordinator formed [0, 1, 2], then heard that
    worker 1 had died (it never comes) and opened [0, 2]: the living members
    leave the first formation for the second at once, not after its timeout."""
    members = [Member(rank, 3) for rank in range(3)]
    try:
        for m in members:
            m.expect(RnaJoin)
        members[0].inbox.put(RnaOpenStore(gen=1))
        port = members[0].expect(RnaStoreReady).port
        doomed = RnaGroup(
            gen=1, members=[0, 1, 2], store_addr="127.0.0.1", store_port=port,
            source_rank=0, timeout_s=WAIT_S,
        )  # fmt: skip
        members[0].inbox.put(doomed)
        members[2].inbox.put(doomed)
        began = time.monotonic()
        living = [members[0], members[2]]
        # Worker 0 hosts both stores: opening the second closes the first, so
        # worker 2 may fail forming generation 1 before it hears of 2 (the
        # coordinator ignores a failure of a generation it gave up).
        formed = regroup(living, gen=2, source=0, given_up=(1,))
        assert [f.gen for f in formed] == [2, 2]
        assert time.monotonic() - began < WAIT_S / 3
        run_round(living, 2, 0, initiator=0)
    finally:
        stop(members)


def test_a_member_that_comes_late_to_a_group_given_up_fails_it_at_once():
    """Worker 0 gave generation 1 up for generation 2 while worker 2 was not at
    its store yet; worker 2 comes later, finds both there, and must not form it
    (worker 0 never will): it fails the formation and asks back in."""
    stores = [TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False) for _ in range(2)]
    members = [Member(rank, 3) for rank in (0, 1, 2)]
    try:
        for m in members:
            m.expect(RnaJoin)

        def group(gen: int, ranks: list[int]) -> RnaGroup:
            return RnaGroup(
                gen=gen, members=ranks, store_addr="127.0.0.1", store_port=stores[gen - 1].port,
                source_rank=0, timeout_s=WAIT_S,
            )  # fmt: skip

        members[0].inbox.put(group(1, [0, 2]))
        members[0].inbox.put(group(2, [0]))  # alone, say
        assert members[0].expect(RnaFormed).gen == 2
        began = time.monotonic()
        members[2].inbox.put(group(1, [0, 2]))
        failed = members[2].expect(RnaFailed)
        assert failed.gen == 1 and "given up" in failed.error
        assert time.monotonic() - began < WAIT_S / 3
        members[2].expect(RnaJoin)
    finally:
        stop(members)


class SilentListener:
    """A port where something accepts connections and never answers (as a gloo
    pair's listener does to a store client): where a store that went away may
    have been."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                self.accepted.append(self.sock.accept()[0])

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_store_that_never_answers_fails_the_formation_within_its_timeout():
    """Told to meet at a port where something accepts and stays silent, torch's
    store client would wait for its ping's answer forever: the formation fails
    within the group's timeout plus the connect's grace, the worker asks back
    in, and forms the next group."""
    silent = SilentListener()
    members = [Member(rank, 2) for rank in range(2)]
    try:
        for m in members:
            m.expect(RnaJoin)
        lost = RnaGroup(
            gen=1, members=[0, 1], store_addr="127.0.0.1", store_port=silent.port,
            source_rank=0, timeout_s=1.0,
        )  # fmt: skip
        began = time.monotonic()
        members[1].inbox.put(lost)
        failed = members[1].expect(RnaFailed)
        took = time.monotonic() - began
        assert failed.gen == 1 and "did not answer" in failed.error, failed.error
        assert took < 1.0 + CONNECT_GRACE_S + 3.0, took
        members[1].expect(RnaJoin)
        assert [f.gen for f in regroup(members, gen=2, source=0)] == [2, 2]
        run_round(members, 2, 0, initiator=0)
    finally:
        stop(members)
        silent.close()


def test_a_group_already_superseded_when_read_gets_only_a_short_visit():
    """A group read after a newer one arrived (the thread was busy, or the
    message is a crashed supervisor's) names a store that may be gone, or
    whose port something else took (here: a listener that never answers): the
    worker visits it only briefly, then forms the newer group."""
    silent = SilentListener()
    members = [Member(rank, 2, run=False) for rank in range(2)]
    try:
        store = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        stale = RnaGroup(
            gen=1, members=[0, 1], store_addr="127.0.0.1", store_port=silent.port,
            source_rank=0, timeout_s=WAIT_S,
        )  # fmt: skip
        newer = RnaGroup(
            gen=2, members=[0, 1], store_addr="127.0.0.1", store_port=store.port,
            source_rank=0, timeout_s=WAIT_S,
        )  # fmt: skip
        began = time.monotonic()
        for m in members:
            m.inbox.put(stale)
            m.inbox.put(newer)
            m.worker.start()
        assert [m.expect(RnaFormed).gen for m in members] == [2, 2]
        assert time.monotonic() - began < 2 * SUPERSEDED_VISIT_S + 2.0
        run_round(members, 2, 0, initiator=1)
    finally:
        stop(members)
        silent.close()


def test_the_final_model_is_the_moving_average_of_the_global_model_s_updates():
    """``average=b``: the model a worker ends with is ``a_k = d_k a_(k-1) + (1 -
    d_k) x_k`` over the global model's updates ``x_k``, from the model the group
    formed with, ``d_k = min(b, (1 + k) / (10 + k))`` (the decay warms up); a
    round without contributions is no update. Every member holds the same
    average; a newcomer gets it with the state, and the count of updates."""
    beta = 0.6
    updates = 0

    def decay():
        return min(beta, (1 + updates) / (10 + updates))

    members = [Member(rank, 2, average=beta) for rank in range(2)]
    try:
        form(members)
        x = members[0].global_model()
        expected = x.copy()
        rng = np.random.default_rng(3)
        for round_ in range(4):
            if round_ != 2:  # round 2: nobody contributes
                members[round_ % 2].worker.hand_over(round_, torch.tensor(rng.normal(size=DIM)))
            run_round(members, 1, round_, initiator=0)
            if round_ != 2:
                x = members[0].global_model()
                expected = decay() * expected + (1 - decay()) * x
                updates += 1
        for m in members:
            np.testing.assert_allclose(m.final_model(), expected, atol=1e-12, rtol=0)
            assert not np.allclose(m.final_model(), m.global_model())
        # Worker 1 restarts: a fresh thread, no average of its own.
        members[1].worker.stop()
        members[1] = Member(1, 2, average=beta)
        members[1].expect(RnaJoin)
        regroup(members, gen=2, source=0)
        np.testing.assert_array_equal(members[1].final_model(), members[0].final_model())
        members[1].worker.hand_over(4, torch.tensor(rng.normal(size=DIM)))
        run_round(members, 2, 4, initiator=1)
        expected = decay() * expected + (1 - decay()) * members[0].global_model()
        for m in members:
            np.testing.assert_allclose(m.final_model(), expected, atol=1e-12, rtol=0)
    finally:
        stop(members)


def test_without_an_average_the_final_model_is_the_last_one(three):
    form(three)
    three[0].worker.hand_over(0, torch.ones(DIM, dtype=torch.float64))
    run_round(three, 1, 0, initiator=0)
    for m in three:
        np.testing.assert_array_equal(m.final_model(), m.global_model())
    stop(three)


def test_a_group_message_older_than_the_running_group_is_ignored(three):
    """An older generation's group, read after a newer one formed, leaves the
    running group as it is (its store may be gone; its members moved on)."""
    form(three, gen=2)
    silent = SilentListener()
    try:
        stale = RnaGroup(
            gen=1, members=[0, 1, 2], store_addr="127.0.0.1", store_port=silent.port,
            source_rank=0, timeout_s=WAIT_S,
        )  # fmt: skip
        for m in three:
            m.inbox.put(stale)
        three[0].worker.hand_over(0, torch.ones(DIM, dtype=torch.float64))
        run_round(three, 2, 0, initiator=0)
        assert not silent.accepted
    finally:
        stop(three)
        silent.close()


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


def test_the_policy_tells_the_workers_how_to_treat_the_momentum_and_the_final_model():
    from dtlaunch.errors import ConfigError
    from dtlaunch.runtime.rna import RnaSettings, parse_rna_env
    from dtlaunch.supervisor.control.policies import parse_policy

    def told(policy: str) -> RnaSettings | None:
        return parse_rna_env(parse_policy(policy).worker_env()["DTLAUNCH_RNA"])

    assert told("rna") == RnaSettings(staleness=8, momentum="auto", average=0.9)
    assert told("rna:momentum=keep,staleness=3,average=0") == RnaSettings(
        staleness=3, momentum="keep", average=0.0
    )
    assert told("rna:average=0.75").average == 0.75
    # A supervisor of an earlier version says only the bound: the momentum is
    # kept, and the final model is the last one.
    assert parse_rna_env("staleness=8") == RnaSettings(staleness=8, momentum="keep")
    for bad in ("1", "-0.1", "x"):
        with pytest.raises(ConfigError, match="average must be a number"):
            parse_policy(f"rna:average={bad}")
        with pytest.raises(ConfigError, match="average must be a number in"):
            parse_rna_env(f"staleness=8,average={bad}")
    with pytest.raises(ConfigError, match="momentum must be one of auto, keep"):
        parse_rna_env("staleness=8,momentum=off")
    with pytest.raises(ConfigError, match="momentum must be one of auto, keep, got 'off'"):
        parse_policy("rna:momentum=off")
