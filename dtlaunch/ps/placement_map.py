"""A block ``Placement`` as the wire carries it (``PsPlacementMap``), and back.

Under ``dtlaunch run`` the supervisor keeps the job's placement map: the first
worker to ask registers the map it planned from its model, and every worker,
including one restarted later, follows the map the supervisor answers with
(``dtlaunch.supervisor.psfleet.placement``), and where its servers listen
(``job_map``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dtlaunch.errors import PsError
from dtlaunch.ps.blocks import Block, Placement
from dtlaunch.wire.messages import PsPlacedBlock, PsPlacementMap

__all__ = ["MAP_WAIT_S", "from_wire", "job_map", "to_wire"]

MAP_WAIT_S = 60.0  # for the supervisor to say where a map's servers listen
_ASK_AGAIN_S = 0.2


def job_map(
    job: Any, planned: Placement, known: Sequence[str], *, wait_s: float = MAP_WAIT_S
) -> tuple[Placement, list[str]]:
    """The job's map (registering ``planned``) and where its servers listen.

    As the supervisor says with the map; when it does not know them all (a
    resumed supervisor before the agents said hello), ``known`` (the servers by
    rank, as this process was started with or follows) when they are enough: a
    scale's servers beyond the map hold no block of it. Else asked again until
    the supervisor knows.

    Raises:
        PsError: the map has more servers than this process knows, and the
            supervisor did not say where they listen within ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    while True:
        placement = from_wire(job.ps_placement(to_wire(planned)))
        told = list(getattr(job, "ps_endpoints", ()))
        if len(told) == placement.servers:
            return placement, told
        if len(known) >= placement.servers:
            return placement, list(known[: placement.servers])
        if time.monotonic() >= deadline:
            raise PsError(
                f"the job's placement map has {placement.servers} servers, this worker "
                f"knows {len(known)}, and the supervisor did not say where the others "
                f"listen within {wait_s:.0f} s; check dtlaunch status for the servers"
            )
        time.sleep(_ASK_AGAIN_S)


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
