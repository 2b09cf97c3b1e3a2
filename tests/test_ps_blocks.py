"""Block splitting and LPT placement: pure, deterministic, balanced, versioned."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtlaunch.errors import ConfigError
from dtlaunch.ps.blocks import ParamSpec, place_lpt, plan, split_blocks

MB = 1024 * 1024


def spec(name, *shape, itemsize=4):
    return ParamSpec(name=name, shape=tuple(shape), dtype="float32", itemsize=itemsize)


def vgg16_like():
    """VGG16's tensors (PSLD §2.2: one 400 MB tensor in a 538 MB model)."""
    shapes = [
        (64, 3, 3, 3),
        (64,),
        (64, 64, 3, 3),
        (64,),
        (128, 64, 3, 3),
        (128,),
        (128, 128, 3, 3),
        (128,),
        (256, 128, 3, 3),
        (256,),
        (256, 256, 3, 3),
        (256,),
        (256, 256, 3, 3),
        (256,),
        (512, 256, 3, 3),
        (512,),
        (512, 512, 3, 3),
        (512,),
        (512, 512, 3, 3),
        (512,),
        (512, 512, 3, 3),
        (512,),
        (512, 512, 3, 3),
        (512,),
        (512, 512, 3, 3),
        (512,),
        (4096, 25088),
        (4096,),
        (4096, 4096),
        (4096,),
        (1000, 4096),
        (1000,),
    ]
    return [spec(f"p{i}", *s) for i, s in enumerate(shapes)]


def test_large_tensors_are_cut_along_dim0_and_small_ones_kept_whole():
    params = [spec("emb", 1000, 2048), spec("bias", 10), spec("scalar")]
    blocks = split_blocks(params, block_bytes=1 * MB)
    emb = [b for b in blocks if b.name == "emb"]
    assert [(b.row_start, b.row_end) for b in emb] == [
        (0, 128),
        (128, 256),
        (256, 384),
        (384, 512),
        (512, 640),
        (640, 768),
        (768, 896),
        (896, 1000),
    ]
    assert all(b.nbytes <= 1 * MB for b in emb)
    assert [b.shape for b in blocks if b.name == "bias"] == [(10,)]
    assert [b.shape for b in blocks if b.name == "scalar"] == [()]
    assert [b.block_id for b in blocks] == list(range(len(blocks)))


def test_a_row_larger_than_the_block_size_is_a_block_of_its_own():
    blocks = split_blocks([spec("wide", 3, 1000)], block_bytes=100)
    assert [(b.row_start, b.row_end, b.nbytes) for b in blocks] == [
        (0, 1, 4000),
        (1, 2, 4000),
        (2, 3, 4000),
    ]


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 40), min_size=0, max_size=3), min_size=1, max_size=12),
    block_bytes=st.integers(4, 2000),
    servers=st.integers(1, 6),
)
def test_blocks_cover_every_row_once_and_lpt_is_balanced(shapes, block_bytes, servers):
    params = [spec(f"p{i}", *s) for i, s in enumerate(shapes)]
    placement = plan(params, servers, block_bytes)
    for index, p in enumerate(params):
        mine = [b for b in placement.blocks if b.param == index]
        if not p.shape:
            assert len(mine) == 1 and mine[0].nbytes == p.nbytes
            continue
        rows = [r for b in mine for r in range(b.row_start, b.row_end)]
        assert rows == list(range(p.shape[0]))
        assert sum(b.nbytes for b in mine) == p.nbytes
    loads = placement.load()
    assert sum(loads) == sum(p.nbytes for p in params)
    largest = max(b.nbytes for b in placement.blocks)
    # LPT: no server exceeds the mean by more than one block.
    assert max(loads) <= sum(loads) / servers + largest


def test_lpt_balances_vgg16_where_round_robin_does_not():
    params = vgg16_like()
    placement = plan(params, 3)
    loads = placement.load()
    assert max(loads) / min(loads) < 1.01
    round_robin = [sum(p.nbytes for p in params[s::3]) for s in range(3)]
    assert max(round_robin) / min(round_robin) > 10  # PSLD Table 1's problem


def test_the_plan_is_deterministic_and_ties_go_to_the_lower_server():
    params = [spec(f"p{i}", 100) for i in range(4)]
    assert plan(params, 2) == plan(params, 2)
    assert plan(params, 2).owner == (0, 1, 0, 1)


def test_reassign_bumps_the_version_and_reports_moves():
    placement = plan([spec("a", 100), spec("b", 100), spec("c", 50)], 2)
    moved = placement.reassign({0: 1})
    assert moved.version == placement.version + 1
    assert moved.owner[0] == 1 and moved.blocks == placement.blocks
    assert placement.moves_to(moved) == ((0, placement.owner[0], 1),)
    grown = moved.reassign({1: 2}, servers=3)
    assert grown.servers == 3 and grown.blocks_on(2) == (placement.blocks[1],)
    with pytest.raises(ValueError, match="does not exist"):
        placement.reassign({7: 0})
    with pytest.raises(ValueError, match="not a server index"):
        placement.reassign({0: 5})


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="--ps-block-bytes"):
        split_blocks([spec("a", 4)], block_bytes=0)
    with pytest.raises(ConfigError, match="--servers >= 1"):
        place_lpt(split_blocks([spec("a", 4)]), 0)
    assert math.prod(()) == 1  # a 0-dim tensor holds one item
