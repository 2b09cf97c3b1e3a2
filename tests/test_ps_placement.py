"""The supervisor's PS placement map (``dtlaunch.supervisor.psfleet.placement``): the
first registration is kept on disk and answered to everyone; another model's
blocks are refused with the difference named; a resumed supervisor reads it back;
``dtlaunch.ps.placement_map`` carries a Placement over the wire unchanged."""

from __future__ import annotations

import json

import pytest

from dtlaunch.errors import RunDirError
from dtlaunch.events import EventRecorder, MemorySink
from dtlaunch.ps.blocks import ParamSpec, plan
from dtlaunch.ps.placement_map import from_wire, to_wire
from dtlaunch.supervisor.psfleet.placement import PLACEMENT_FILE, PlacementKeeper
from dtlaunch.wire.codec import decode, encode
from dtlaunch.wire.messages import PlacementReady, RegisterPlacement

MODEL = [
    ParamSpec(name="emb.weight", shape=(1000, 16), dtype="float32", itemsize=4),
    ParamSpec(name="fc.weight", shape=(1, 16), dtype="float32", itemsize=4),
    ParamSpec(name="fc.bias", shape=(1,), dtype="float32", itemsize=4),
]


def keeper(tmp_path):
    sink = MemorySink()
    return PlacementKeeper(tmp_path, EventRecorder([sink])), sink


def test_placement_survives_the_wire_and_back():
    placement = plan(MODEL, 3, block_bytes=8192)
    msg = decode(encode(RegisterPlacement(placement=to_wire(placement))))
    assert isinstance(msg, RegisterPlacement)
    assert from_wire(msg.placement) == placement


def test_the_first_map_is_kept_and_every_worker_gets_it(tmp_path):
    keep, sink = keeper(tmp_path)
    first = to_wire(plan(MODEL, 2, block_bytes=8192))
    assert keep.register(0, first) == PlacementReady(placement=first)
    # A later worker planned the same cut with another owner for a block: it
    # follows the kept map, not its own.
    other = to_wire(from_wire(first).reassign({0: 1 - first.blocks[0].server}))
    assert keep.register(1, other) == PlacementReady(placement=first)
    [event] = [e for e in sink.events if e.kind == "ps_placement"]
    assert (event.rank, event.data["servers"], event.data["blocks"]) == (0, 2, len(first.blocks))
    assert sum(event.data["bytes_per_server"]) == sum(p.nbytes for p in MODEL)
    on_disk = json.loads((tmp_path / PLACEMENT_FILE).read_text())
    assert on_disk["placement"]["version"] == first.version
    # A supervisor resumed on the run directory answers with the same map.
    again, sink2 = keeper(tmp_path)
    assert again.register(3, other) == PlacementReady(placement=first)
    assert not [e for e in sink2.events if e.kind == "ps_placement"]
    # A worker started after a scale of the servers plans for another count: it
    # follows the job's map too, told where that map's servers listen (once the
    # supervisor knows them all).
    elsewhere = to_wire(plan(MODEL, 3, block_bytes=8192))
    ports = {0: "tcp://127.0.0.2:7000"}
    again.tell_endpoints(lambda server: ports.get(server, ""))
    assert again.register(4, elsewhere) == PlacementReady(placement=first, endpoints=[])
    ports[1] = "tcp://127.0.0.3:7001"
    assert again.register(4, elsewhere) == PlacementReady(
        placement=first, endpoints=[ports[0], ports[1]]
    )


@pytest.mark.parametrize(
    ("model", "servers", "block_bytes", "named"),
    [
        (MODEL, 2, 4096, "blocks instead of"),
        (
            [
                MODEL[0],
                ParamSpec(name="fc.w", shape=(1, 16), dtype="float32", itemsize=4),
                MODEL[2],
            ],
            2,
            8192,
            "fc.w[0:1] [1, 16] float32, the job's is fc.weight[0:1]",
        ),
    ],
)
def test_another_models_blocks_are_refused_with_the_difference(
    tmp_path, model, servers, block_bytes, named
):
    keep, _ = keeper(tmp_path)
    keep.register(0, to_wire(plan(MODEL, 2, block_bytes=8192)))
    answer = keep.register(2, to_wire(plan(model, servers, block_bytes=block_bytes)))
    assert answer.placement is None
    assert "worker 2's parameter blocks differ" in answer.error and named in answer.error
    assert "every worker must build the same model" in answer.error


def test_a_damaged_placement_file_is_named(tmp_path):
    (tmp_path / PLACEMENT_FILE).write_text('{"placement": {"version": "x"}}')
    with pytest.raises(RunDirError, match=PLACEMENT_FILE):
        keeper(tmp_path)
