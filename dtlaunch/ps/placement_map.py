"""A block ``Placement`` as the wire carries it (``PsPlacementMap``), and back.

Under ``dtlaunch run`` the supervisor keeps the job's placement map: the first
worker to ask registers the map it planned from its model, and every worker,
including one restarted later, follows the map the supervisor answers with
(``dtlaunch.supervisor.psfleet.placement``).
"""

from __future__ import annotations

from dtlaunch.ps.blocks import Block, Placement
from dtlaunch.wire.messages import PsPlacedBlock, PsPlacementMap

__all__ = ["from_wire", "to_wire"]


def to_wire(placement: Placement) -> PsPlacementMap:
    return PsPlacementMap(
        version=placement.version,
        servers=placement.servers,
        blocks=[
            PsPlacedBlock(
                param=b.param,
                name=b.name,
                row_start=b.row_start,
                row_end=b.row_end,
                shape=list(b.shape),
                dtype=b.dtype,
                nbytes=b.nbytes,
                server=server,
            )
            for b, server in zip(placement.blocks, placement.owner, strict=True)
        ],
    )


def from_wire(placed: PsPlacementMap) -> Placement:
    """Raises: ValueError when the map is inconsistent (an owner out of range)."""
    blocks = tuple(
        Block(
            block_id=i,
            param=b.param,
            name=b.name,
            row_start=b.row_start,
            row_end=b.row_end,
            shape=tuple(b.shape),
            dtype=b.dtype,
            nbytes=b.nbytes,
        )
        for i, b in enumerate(placed.blocks)
    )
    return Placement(
        version=placed.version,
        servers=placed.servers,
        blocks=blocks,
        owner=tuple(b.server for b in placed.blocks),
    )
