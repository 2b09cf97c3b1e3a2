"""A server slowed with ``--inject slowdown:role=server,...,link=RATE``: its
transfers take ``factor`` times what a healthy link's would, one after another,
while it answers everything else; a client that pings during the wait hears
its request is held (no resend); the training is unchanged, only slower at that
server, and the client's per-server timings (PSLD's profile) show it."""

from __future__ import annotations

import logging
import statistics

import pytest
import torch

from dtlaunch.inject import parse_injections
from tests.test_ps_reassign import (
    RECORDS,
    ROWS,
    client,
    gradients,
    make_model,
    serving,
)

pytestmark = pytest.mark.integration

STEPS = 3


def train(keys, **config) -> tuple[torch.nn.Module, list[float], list[float]]:
    """Three BSP steps of one worker on two servers; the model and each server's
    pull and push service times."""
    model = make_model()
    with serving(keys, 2, workers=(0,), **config) as endpoints, client(
        model, endpoints, keys, 0
    ) as ps:
        for _ in range(STEPS):
            ps.pull()
            gradients(model, ROWS[0])
            ps.push(RECORDS)
        ps.pull()
        timings = ps.take_timings()
    per_server = [[t.seconds for t in timings if t.server == j] for j in (0, 1)]
    return model, per_server[0], per_server[1]


def test_a_slow_link_slows_only_that_server_s_transfers_and_changes_no_result(keys, caplog):
    healthy, _, fast1 = train(keys)
    nbytes = sum(p.numel() * 4 for p in make_model().parameters()) // 2  # about half a side
    # 8 x nbytes / link is about 0.6 s a transfer: longer than a client waits before it
    # pings (0.5 s), so the pings must hear "held", not "lost".
    link = int(8 * nbytes / 0.6)
    spec = f"slowdown:role=server,ranks=1,factor=9,link={link}"
    with caplog.at_level(logging.WARNING, logger="dtlaunch.ps.exchange"):
        slowed, slow0, slow1 = train(keys, injections=parse_injections([spec]))
    assert not [r for r in caplog.records if "sending it again" in r.getMessage()]
    for p, q in zip(slowed.parameters(), healthy.parameters(), strict=True):
        assert torch.equal(p.detach(), q.detach())
    assert statistics.median(slow1) > 0.3 > statistics.median(slow0)
    assert statistics.median(slow1) > 10 * statistics.median(fast1)
