"""PSLD's live reassignment under ASP (``--ps-consistency asp``), on real
servers and clients: ASP has no step boundary, so a source holds the moved
blocks from its export on, every push naming them waits there, and once the
new map is committed the clients send those pushes on to the blocks' new
servers, only those blocks. No update may be lost or applied twice.

Every gradient here is a constant (worker 0 pushes 1.0, worker 1 pushes 0.5
for every element, SGD with lr 0.5): whatever order ASP applies the pushes in,
each element ends at exactly ``start - 0.5 x (1.0 + 0.5) x STEPS``, so one push
lost or applied twice shows as a wrong value in the blocks it named."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from dtlaunch.events import EventRecorder
from dtlaunch.ps import Client, Placement
from dtlaunch.ps.control import ServerControl
from dtlaunch.ps.placement_map import from_wire, to_wire
from dtlaunch.supervisor.psfleet.placement import PlacementKeeper
from dtlaunch.supervisor.psfleet.reassign import BlockReassigner
from tests.test_ps_reassign import TIMEOUT_S, new_keys, run_threads, serving

pytestmark = pytest.mark.integration

STEPS = 60
GRADS = (1.0, 0.5)  # per worker, every element
LR = 0.5
BLOCK_BYTES = 64  # 16 floats a block


def make_model() -> torch.nn.Module:
    model = torch.nn.Module()
    model.a = torch.nn.Parameter(torch.zeros(40))  # 3 blocks
    model.b = torch.nn.Parameter(torch.full((2, 16), 3.0))  # 2 blocks
    model.c = torch.nn.Parameter(torch.ones(8))  # 1 block
    return model


def test_blocks_moved_while_asp_workers_push_lose_and_repeat_no_update(tmp_path: Path) -> None:
    keys = new_keys(tmp_path)
    keeper = PlacementKeeper(tmp_path, EventRecorder([]))
    done: list[object] = []
    with serving(keys, 3, workers=(0, 1), mode="asp") as endpoints:

        def source() -> Placement:
            assert keeper.placement is not None
            return from_wire(keeper.placement)

        models = [make_model() for _ in GRADS]
        clients = [
            Client(model, "sgd", lr=LR, servers=endpoints, keys=keys, worker=w,
                   block_bytes=BLOCK_BYTES, timeout=TIMEOUT_S, placement_source=source)
            for w, model in enumerate(models)
        ]  # fmt: skip
        try:
            keeper.register(0, to_wire(clients[0].placement))

            def worker(w: int):
                def train() -> None:
                    ps, model = clients[w], models[w]
                    for _ in range(STEPS):
                        ps.pull()
                        for p in model.parameters():
                            p.grad = torch.full_like(p, GRADS[w])
                        ps.push(1)
                        assert ps.dropped == [], ps.dropped
                        time.sleep(0.005)  # the moves land among the pushes

                return train

            def supervisor() -> None:
                reassigner = BlockReassigner(
                    keeper=keeper, endpoint_of=lambda j: endpoints[j], keys=keys,
                    timeout=TIMEOUT_S, stop=threading.Event(),
                )  # fmt: skip
                with ServerControl(endpoints[0], keys, timeout=TIMEOUT_S) as ctl:
                    while ctl.stats().version < 10:
                        time.sleep(0.005)
                assert keeper.placement is not None
                owner = list(from_wire(keeper.placement).owner)
                # Server 2's blocks to 0, then everything of server 0 to 1 and 2.
                done.append(reassigner.carry_out([0 if s == 2 else s for s in owner]))
                time.sleep(0.05)
                assert keeper.placement is not None
                owner = list(from_wire(keeper.placement).owner)
                done.append(reassigner.carry_out([1 + i % 2 if s == 0 else s
                                                  for i, s in enumerate(owner)]))  # fmt: skip

            run_threads([worker(0), worker(1), supervisor])
            assert len(done) == 2 and keeper.placement is not None
            assert keeper.placement.version == 2
            final = from_wire(keeper.placement)
            ps = clients[0]
            ps.pull()
            assert ps.placement.version == 2 and ps.placement == final
            expected = {"a": 0.0, "b": 3.0, "c": 1.0}
            total = sum(GRADS) * LR * STEPS
            for name, start in expected.items():
                got = getattr(models[0], name).detach()
                assert torch.equal(got, torch.full_like(got, start - total)), (name, got)
        finally:
            for c in clients:
                c.close()
