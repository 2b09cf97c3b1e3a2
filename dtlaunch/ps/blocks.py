"""Parameter blocks and their placement on servers (PSLD §2.2, §3, §5.2).

Pure: no I/O, no torch. A model's parameters are described by ``ParamSpec``
(name, shape, dtype, item size); ``split_blocks`` cuts every tensor larger than
``block_bytes`` along dim 0 into blocks of whole rows, and keeps smaller tensors
whole. ``place_lpt`` puts blocks on ``M`` servers balanced by bytes with the
greedy longest-processing-time rule (largest block first, onto the least loaded
server): unlike TensorFlow's round-robin by count or MXNet's random placement of
small tensors, the load of the fullest server is within one block of the mean.

A ``Placement`` is versioned: every change (``reassign``) makes a new map with
``version + 1``, so a worker or server holding an older map can tell and ask for
the current one. The supervisor owns the current map; servers and workers only
ever follow it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dtlaunch.errors import ConfigError

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "Block",
    "ParamSpec",
    "Placement",
    "check_layout",
    "place_lpt",
    "plan",
    "split_blocks",
]

DEFAULT_BLOCK_BYTES = 4 * 1024 * 1024  # PSLD §3 and MXNet's 4 MB threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamSpec:
    """One parameter tensor as the block planner sees it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    itemsize: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """Rows ``[row_start, row_end)`` of parameter number ``param`` (dim 0).

    A 0-dim parameter is one block with ``row_start = row_end = 0``.
    """

    block_id: int
    param: int  # index into the model's parameter list
    name: str
    row_start: int
    row_end: int
    shape: tuple[int, ...]  # the block's own shape
    dtype: str
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Which server holds each block, under a version counter."""

    version: int
    servers: int
    blocks: tuple[Block, ...]
    owner: tuple[int, ...]  # owner[block_id] = server index

    def __post_init__(self) -> None:
        if len(self.owner) != len(self.blocks):
            raise ValueError(f"{len(self.owner)} owners for {len(self.blocks)} blocks")
        for i, block in enumerate(self.blocks):
            if block.block_id != i:
                raise ValueError(f"block {i} has block_id {block.block_id}")
        bad = [s for s in self.owner if not 0 <= s < self.servers]
        if bad:
            raise ValueError(f"owner {bad[0]} is not a server index in 0..{self.servers - 1}")

    def blocks_on(self, server: int) -> tuple[Block, ...]:
        return tuple(b for b, s in zip(self.blocks, self.owner, strict=True) if s == server)

    def load(self) -> tuple[int, ...]:
        """Bytes held by each server."""
        loads = [0] * self.servers
        for block, server in zip(self.blocks, self.owner, strict=True):
            loads[server] += block.nbytes
        return tuple(loads)

    def reassign(self, moves: Mapping[int, int], servers: int | None = None) -> Placement:
        """A new map (``version + 1``) with ``moves`` (block_id -> server) applied.

        ``servers`` changes the server count (scale out/in); every block must
        then still have an owner in range.

        Raises:
            ValueError: an unknown block, or an owner out of range.
        """
        owner = list(self.owner)
        for block_id, server in moves.items():
            if not 0 <= block_id < len(owner):
                raise ValueError(f"block {block_id} does not exist (0..{len(owner) - 1})")
            owner[block_id] = server
        return Placement(
            version=self.version + 1,
            servers=self.servers if servers is None else servers,
            blocks=self.blocks,
            owner=tuple(owner),
        )

    def moves_to(self, new: Placement) -> tuple[tuple[int, int, int], ...]:
        """``(block_id, from_server, to_server)`` for every block that changes owner."""
        if new.blocks != self.blocks:
            raise ValueError("the two placements are of different block layouts")
        return tuple(
            (i, old, now)
            for i, (old, now) in enumerate(zip(self.owner, new.owner, strict=True))
            if old != now
        )


def split_blocks(
    params: Sequence[ParamSpec], block_bytes: int = DEFAULT_BLOCK_BYTES
) -> tuple[Block, ...]:
    """Cut parameters into blocks of at most ``block_bytes`` (whole rows of dim 0).

    A single row larger than ``block_bytes`` becomes a block of its own.

    Raises:
        ConfigError: ``block_bytes`` is not positive.
    """
    if type(block_bytes) is not int or block_bytes < 1:
        raise ConfigError(f"--ps-block-bytes must be a positive integer, got {block_bytes!r}")
    blocks: list[Block] = []
    for index, spec in enumerate(params):
        if spec.nbytes <= block_bytes or len(spec.shape) == 0 or spec.shape[0] <= 1:
            rows = spec.shape[0] if spec.shape else 0
            blocks.append(_block(len(blocks), index, spec, 0, rows))
            continue
        row_bytes = spec.nbytes // spec.shape[0]
        step = max(1, block_bytes // max(1, row_bytes))
        for start in range(0, spec.shape[0], step):
            blocks.append(_block(len(blocks), index, spec, start, min(spec.shape[0], start + step)))
    return tuple(blocks)


def place_lpt(blocks: Sequence[Block], servers: int, *, version: int = 0) -> Placement:
    """Greedy LPT: largest block first, onto the server with the fewest bytes so far.

    Ties go to the lower block id and the lower server index, so every process
    computing the plan from the same model gets the same map.

    Raises:
        ConfigError: ``servers`` is less than 1.
    """
    if type(servers) is not int or servers < 1:
        raise ConfigError(f"a parameter-server placement needs --servers >= 1, got {servers!r}")
    loads = [0] * servers
    owner = [0] * len(blocks)
    for block in sorted(blocks, key=lambda b: (-b.nbytes, b.block_id)):
        server = min(range(servers), key=lambda s: (loads[s], s))
        owner[block.block_id] = server
        loads[server] += block.nbytes
    return Placement(version=version, servers=servers, blocks=tuple(blocks), owner=tuple(owner))


def plan(
    params: Sequence[ParamSpec], servers: int, block_bytes: int = DEFAULT_BLOCK_BYTES
) -> Placement:
    """``split_blocks`` then ``place_lpt``: the version-0 placement of a model."""
    return place_lpt(split_blocks(params, block_bytes), servers)


def _block(block_id: int, index: int, spec: ParamSpec, start: int, end: int) -> Block:
    shape = (end - start, *spec.shape[1:]) if spec.shape else ()
    return Block(
        block_id=block_id,
        param=index,
        name=spec.name,
        row_start=start,
        row_end=end,
        shape=shape,
        dtype=spec.dtype,
        nbytes=math.prod(shape) * spec.itemsize,
    )


def check_layout(placement: Placement, specs: Sequence[ParamSpec], servers: int) -> None:
    """Raises: ConfigError when ``placement`` does not fit the parameters or servers."""
    if placement.servers != servers:
        raise ConfigError(
            f"the placement is for {placement.servers} servers, {servers} endpoints were given"
        )
    for block in placement.blocks:
        if not 0 <= block.param < len(specs) or specs[block.param].name != block.name:
            raise ConfigError(
                f"placement block {block.block_id} ({block.name}) does not match this model's "
                "parameters; every worker must build the same model"
            )
    covered = {b.param for b in placement.blocks}
    if covered != set(range(len(specs))):
        raise ConfigError("the placement does not cover every parameter of the model")
