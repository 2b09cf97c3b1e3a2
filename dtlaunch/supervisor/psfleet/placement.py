"""The job's parameter-server placement map, kept by the supervisor (PSLD §3, §5.2).

The first PS worker to ask registers the map it planned from its model
(``RegisterPlacement``: blocks of at most ``--ps-block-bytes``, placed on the
servers by bytes). The supervisor keeps that map, with its version, in
``<run_dir>/ps_placement.json`` (a resumed supervisor reads it back) and answers
every worker with it (``PlacementReady``): the first, the others, and any that is
restarted or added later, so all of them follow one map whatever they computed.
A worker whose model cuts into other blocks is refused, with the first
difference named. Moving a server (a KILL_RESTART) keeps its server index, so the
map stays as it is; the endpoints are the supervisor's too (``JobState``).
"""

from __future__ import annotations

import json
from pathlib import Path

from dtlaunch.errors import RunDirError, WireError
from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.rundir import write_json_atomic
from dtlaunch.wire.codec import from_dict, to_dict
from dtlaunch.wire.messages import PlacementReady, PsPlacedBlock, PsPlacementMap

__all__ = ["PLACEMENT_FILE", "PlacementKeeper", "layout_difference"]

PLACEMENT_FILE = "ps_placement.json"


class PlacementKeeper:
    """Adopts the first registered placement and answers every worker with it."""

    def __init__(self, run_dir: Path, recorder: EventRecorder) -> None:
        self._path = run_dir / PLACEMENT_FILE
        self._recorder = recorder
        self.placement = self._load()

    def register(self, rank: int, offer: PsPlacementMap) -> PlacementReady:
        """Worker ``rank``'s planned map: adopt it if the job has none, else check
        that it cuts the model the same way and answer with the job's map."""
        if self.placement is None:
            write_json_atomic(self._path, to_dict(PlacementReady(placement=offer)))
            self.placement = offer
            self._recorder.emit(
                "ps_placement",
                role="worker",
                rank=rank,
                version=offer.version,
                servers=offer.servers,
                blocks=len(offer.blocks),
                bytes_per_server=bytes_per_server(offer),
            )
            return PlacementReady(placement=offer)
        problem = layout_difference(self.placement, offer)
        if problem:
            return PlacementReady(
                placement=None,
                error=f"worker {rank}'s parameter blocks differ from the job's: {problem}. "
                "Fix: every worker must build the same model, and the run must keep its "
                "--servers and --ps-block-bytes",
            )
        return PlacementReady(placement=self.placement)

    def _load(self) -> PsPlacementMap | None:
        try:
            text = self._path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise RunDirError(f"{self._path} is unreadable: {err}") from err
        try:
            return from_dict(PlacementReady, json.loads(text)).placement
        except (ValueError, WireError) as err:
            raise RunDirError(
                f"{self._path} is not a placement map ({err}); restore it from a backup "
                "or start a new run"
            ) from err


def bytes_per_server(placement: PsPlacementMap) -> list[int]:
    loads = [0] * placement.servers
    for block in placement.blocks:
        if 0 <= block.server < placement.servers:
            loads[block.server] += block.nbytes
    return loads


def layout_difference(kept: PsPlacementMap, offer: PsPlacementMap) -> str:
    """How ``offer`` cuts the parameters differently from ``kept`` ("" when alike;
    which server holds a block does not matter: the kept map decides that)."""
    if offer.servers != kept.servers:
        return f"{offer.servers} servers instead of {kept.servers}"
    if len(offer.blocks) != len(kept.blocks):
        return f"{len(offer.blocks)} blocks instead of {len(kept.blocks)}"
    for i, (mine, theirs) in enumerate(zip(offer.blocks, kept.blocks, strict=True)):
        if _cut(mine) != _cut(theirs):
            return (
                f"block {i} is {mine.name}[{mine.row_start}:{mine.row_end}] {mine.shape} "
                f"{mine.dtype}, the job's is {theirs.name}[{theirs.row_start}:{theirs.row_end}] "
                f"{theirs.shape} {theirs.dtype}"
            )
    return ""


def _cut(block: PsPlacedBlock) -> tuple[object, ...]:
    return (block.param, block.name, block.row_start, block.row_end, block.shape, block.dtype)
