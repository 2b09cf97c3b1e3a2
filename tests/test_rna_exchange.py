"""Hierarchical RNA's exchange with the parameter server (RNA §4), worker side,
over real gloo groups and a real built-in server (ASP) on loopback.

Four ``RoundWorker`` threads in two groups of two get the coordinator's
messages by hand; the models they end with are held against the arithmetic
of asynchronous model averaging: the server starts at the groups' common
model ``x0`` and moves by ``weight x (model - base)`` at each group's
exchange (weight 2/4: each group is half the workers), and a group takes the
server's model after its exchange. Inside a group the learning rate is scaled
by the group's size, not the job's.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dtlaunch.ps import Client  # noqa: E402
from dtlaunch.runtime.rna_exchange import ServerExchange  # noqa: E402
from dtlaunch.wire.messages import (  # noqa: E402
    RnaExchanged,
    RnaFormed,
    RnaGroup,
    RnaJoin,
    RnaOpenStore,
    RnaStart,
    RnaStoreReady,
)
from tests.test_ps_reassign import TIMEOUT_S, new_keys, serving  # noqa: E402
from tests.test_rna_rounds import DIM, LR, Member  # noqa: E402

WAIT_S = 30.0
WORLD = 4


def member(rank: int, x0: np.ndarray, endpoints=None, keys=None, average=0.0) -> Member:
    """A RoundWorker of a world of four starting at ``x0``, exchanging through
    the servers at ``endpoints`` (None: it has no server)."""
    exchange = None
    if endpoints is not None:
        exchange = ServerExchange(
            lambda model: Client(
                model, "sgd", lr=1.0, servers=endpoints, keys=keys, worker=rank,
                timeout=TIMEOUT_S,
            )
        )  # fmt: skip
    return Member(rank, WORLD, x0=x0, exchange=exchange, average=average)


def form(members: list[Member], gen: int, group_size: int) -> None:
    for m in members:
        m.expect(RnaJoin)
    members[0].inbox.put(RnaOpenStore(gen=gen))
    port = members[0].expect(RnaStoreReady).port
    group = RnaGroup(
        gen=gen, members=[m.worker.rank for m in members], store_addr="127.0.0.1",
        store_port=port, source_rank=members[0].worker.rank, timeout_s=WAIT_S,
        group_size=group_size,
    )  # fmt: skip
    for m in members:
        m.inbox.put(group)
    for m in members:
        assert m.expect(RnaFormed).gen == gen


def run_round(
    members: list[Member], gen: int, round_: int, initiator: int, exchange=False, final=False
):
    before = [m.worker.exchanges for m in members]
    for m in members:
        m.inbox.put(
            RnaStart(gen=gen, round=round_, initiator=initiator, exchange=exchange, final=final)
        )
    deadline = time.monotonic() + WAIT_S
    while any(m.worker.applied < round_ + 1 for m in members) or (
        exchange and any(m.worker.exchanges == b for m, b in zip(members, before, strict=True))
    ):
        assert time.monotonic() < deadline, "a round did not finish"
        time.sleep(0.005)


def test_groups_average_their_progress_through_the_server(tmp_path: Path) -> None:
    keys = new_keys(tmp_path)
    rng = np.random.default_rng(11)
    x0 = rng.normal(size=DIM)
    g = {k: rng.normal(size=DIM) for k in ("a0", "a1", "b2", "b3", "b2'")}
    with serving(keys, 1, workers=tuple(range(WORLD)), mode="asp") as endpoints:
        members = [member(rank, x0, endpoints, keys) for rank in range(WORLD)]
        a, b = members[:2], members[2:]
        try:
            form(a, gen=1, group_size=2)
            form(b, gen=2, group_size=2)
            # Group a: both contribute; the rate is scaled by 2/2 (its size), not 2/4.
            a[0].worker.hand_over(0, torch.tensor(g["a0"]))
            a[1].worker.hand_over(0, torch.tensor(g["a1"]))
            run_round(a, 1, 0, initiator=1, exchange=True)
            d_a = -LR * (g["a0"] + g["a1"]) / 2
            # The server was empty: seeded with a's base x0, then + 2/4 of a's progress.
            server = x0 + 0.5 * d_a
            for m in a:
                np.testing.assert_allclose(m.global_model(), server, atol=1e-9, rtol=0)
            sent = a[1].expect(RnaExchanged)  # the initiator says it exchanged
            assert (sent.gen, sent.round, sent.ok) == (1, 0, True) and sent.seconds > 0
            # Group b: two rounds of its own (one contributor of 2: rate x 1/2), then
            # its exchange: the server adds half of b's progress to what a left there.
            b[0].worker.hand_over(0, torch.tensor(g["b2"]))
            run_round(b, 2, 0, initiator=2)
            b[1].worker.hand_over(1, torch.tensor(g["b3"]))
            b[0].worker.hand_over(1, torch.tensor(g["b2'"]))
            run_round(b, 2, 1, initiator=3, exchange=True)
            d_b = -LR * 0.5 * g["b2"] - LR * (g["b3"] + g["b2'"]) / 2
            server = server + 0.5 * d_b
            models = [m.global_model() for m in b]
            for model in models:
                np.testing.assert_allclose(model, server, atol=1e-9, rtol=0)
            assert np.array_equal(models[0], models[1])  # bit for bit within the group
            # Group a exchanges again without progress: it takes b's work too.
            run_round(a, 1, 1, initiator=0, exchange=True)
            for m in members:
                np.testing.assert_allclose(m.global_model(), server, atol=1e-9, rtol=0)
            assert [m.worker.exchanges for m in members] == [2, 2, 1, 1]
        finally:
            for m in members:
                m.worker.stop()


def test_a_group_s_last_exchange_pushes_the_average_of_its_updates(tmp_path: Path) -> None:
    """``average=b``: the exchange a group holds after (``final``) pushes
    ``weight x (average - base)``, so the server's final model, which every
    worker ends with, is smoothed too; the other exchanges push the model."""
    beta = 0.5
    keys = new_keys(tmp_path)
    rng = np.random.default_rng(5)
    x0 = rng.normal(size=DIM)
    g0, g1 = rng.normal(size=DIM), rng.normal(size=DIM)
    with serving(keys, 1, workers=tuple(range(WORLD)), mode="asp") as endpoints:
        group = [member(rank, x0, endpoints, keys, average=beta) for rank in range(2)]
        try:
            form(group, gen=1, group_size=2)
            group[0].worker.hand_over(0, torch.tensor(g0))
            run_round(group, 1, 0, initiator=0, exchange=True)
            x_r0 = x0 - LR * 0.5 * g0  # one contributor of the group's two
            first, second = min(beta, 1 / 10), min(beta, 2 / 11)  # the decay warms up
            averaged = first * x0 + (1 - first) * x_r0
            base = x0 + 0.5 * (x_r0 - x0)  # the server's model after an ordinary exchange
            for m in group:
                np.testing.assert_allclose(m.global_model(), base, atol=1e-9, rtol=0)
            group[1].worker.hand_over(1, torch.tensor(g1))
            run_round(group, 1, 1, initiator=1, exchange=True, final=True)
            x_r1 = base - LR * 0.5 * g1
            averaged = second * averaged + (1 - second) * x_r1
            server = base + 0.5 * (averaged - base)
            for m in group:
                np.testing.assert_allclose(m.global_model(), server, atol=1e-9, rtol=0)
                # Once a group exchanged, the server's model is the one it ends with.
                np.testing.assert_array_equal(m.final_model(), m.global_model())
        finally:
            for m in group:
                m.worker.stop()


def test_an_exchange_that_fails_leaves_the_group_its_own_model() -> None:
    x0 = np.arange(DIM, dtype=np.float64)
    members = [member(rank, x0) for rank in range(2)]  # no server to exchange with
    try:
        form(members, gen=1, group_size=2)
        members[0].worker.hand_over(0, torch.ones(DIM, dtype=torch.float64))
        run_round(members, 1, 0, initiator=0, exchange=False)
        expected = x0 - LR * 0.5  # one contributor of the group's two
        for m in members:
            m.inbox.put(RnaStart(gen=1, round=1, initiator=0, exchange=True))
        failed = members[0].expect(RnaExchanged)
        assert not failed.ok and "no parameter server" in failed.error
        # A round after it ends after its broadcast of the verdict (rounds are in order).
        run_round(members, 1, 2, initiator=1)
        for m in members:
            np.testing.assert_allclose(m.global_model(), expected, atol=1e-12, rtol=0)
            assert m.worker.exchanges == 0
    finally:
        for m in members:
            m.worker.stop()
