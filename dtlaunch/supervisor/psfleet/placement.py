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

A reassignment (PSLD, ``psfleet.reassign``) changes which server holds which
block. It is two-phase so that a supervisor killed half-way never leaves a
half-applied map: ``begin`` writes the new map with its fence version to
``ps_placement.pending.json``; the blocks travel; ``commit`` makes the new map
the job's (``ps_placement.json``, one atomic write: the commit point); the
sources are told to let the blocks go; ``finish`` removes the pending file. A
resumed supervisor that finds a pending file completes the step when the map
was committed and rolls it back when not (``pending``, ``committed``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dtlaunch.errors import RunDirError, WireError
from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.rundir import write_json_atomic
from dtlaunch.wire.codec import from_dict, to_dict
from dtlaunch.wire.messages import PlacementReady, PsPlacedBlock, PsPlacementMap

__all__ = [
    "PENDING_FILE",
    "PLACEMENT_FILE",
    "BlockMove",
    "PendingReassignment",
    "PlacementKeeper",
    "bytes_per_server",
    "layout_difference",
    "with_owners",
]

PLACEMENT_FILE = "ps_placement.json"
PENDING_FILE = "ps_placement.pending.json"


@dataclass(frozen=True, slots=True)
class BlockMove:
    """Blocks that go from server ``source`` to server ``target``."""

    source: int
    target: int
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PendingReassignment:
    """A reassignment under way: the map it makes and the moves that make it."""

    placement: PsPlacementMap  # the new map (its version: the old one's + 1)
    at_version: int  # the servers' step boundary at which the blocks move
    moves: tuple[BlockMove, ...]

    def by_source(self) -> dict[int, list[int]]:
        """Each source server and every block it gives away, ascending."""
        giving: dict[int, list[int]] = {}
        for move in self.moves:
            giving.setdefault(move.source, []).extend(move.blocks)
        return {source: sorted(blocks) for source, blocks in sorted(giving.items())}

    def servers(self) -> list[int]:
        """Every server a move gives blocks away from or to, ascending: those
        that must answer before the reassignment can be completed or rolled back."""
        return sorted({m.source for m in self.moves} | {m.target for m in self.moves})


PlacementListener = Callable[[PsPlacementMap], None]


class PlacementKeeper:
    """Adopts the first registered placement and answers every worker with it."""

    def __init__(self, run_dir: Path, recorder: EventRecorder) -> None:
        self._path = run_dir / PLACEMENT_FILE
        self._pending_path = run_dir / PENDING_FILE
        self._recorder = recorder
        self.placement = self._load()
        self.pending = self._load_pending()
        self._listeners: list[PlacementListener] = []
        self._endpoint_of: Callable[[int], str] = lambda server: ""

    def tell_endpoints(self, endpoint_of: Callable[[int], str]) -> None:
        """Answer every worker with where the map's servers listen now, from
        ``endpoint_of(server)`` ("" while unknown): a scale changes the servers."""
        self._endpoint_of = endpoint_of

    def listen(self, listener: PlacementListener) -> None:
        """Call ``listener`` with the map now (if any), at the first registration,
        and at every ``announce``."""
        self._listeners.append(listener)
        if self.placement is not None:
            listener(self.placement)

    # ------------------------------------------------------------ reassignment

    @property
    def committed(self) -> bool:
        """Whether the pending reassignment's map is the job's already (the
        commit point passed; what is left is telling the sources)."""
        pending = self.pending
        return (
            pending is not None
            and self.placement is not None
            and self.placement.version >= pending.placement.version
        )

    def begin(
        self, owner: Sequence[int], at_version: int, servers: int | None = None
    ) -> PendingReassignment:
        """Record a reassignment to ``owner`` (block -> server) at the servers'
        version ``at_version``, onto ``servers`` servers (a scale of the servers;
        default: as many as now); the job's map stays the old one until ``commit``.

        Raises:
            RunDirError: no map yet, another reassignment under way, or an
                ``owner`` that does not fit the map (the caller's bug).
        """
        if self.placement is None:
            raise RunDirError("no placement map yet: nothing to reassign")
        if self.pending is not None:
            raise RunDirError("a reassignment is already under way")
        new = with_owners(self.placement, owner, servers)
        moves: dict[tuple[int, int], list[int]] = {}
        for i, (old_block, new_block) in enumerate(
            zip(self.placement.blocks, new.blocks, strict=True)
        ):
            if old_block.server != new_block.server:
                moves.setdefault((old_block.server, new_block.server), []).append(i)
        pending = PendingReassignment(
            placement=new,
            at_version=at_version,
            moves=tuple(BlockMove(s, t, tuple(b)) for (s, t), b in sorted(moves.items())),
        )
        write_json_atomic(self._pending_path, _pending_to_json(pending))
        self.pending = pending
        return pending

    def commit(self) -> PsPlacementMap:
        """Make the pending map the job's: from now on every worker is answered
        with it. The commit point (one atomic write)."""
        pending = self.pending
        if pending is None:
            raise RunDirError("no reassignment under way to commit")
        write_json_atomic(self._path, to_dict(PlacementReady(placement=pending.placement)))
        self.placement = pending.placement
        self._recorder.emit(
            "ps_placement",
            role="supervisor",
            rank=0,
            version=pending.placement.version,
            servers=pending.placement.servers,
            blocks=len(pending.placement.blocks),
            bytes_per_server=bytes_per_server(pending.placement),
            block_bytes=[b.nbytes for b in pending.placement.blocks],
            owner=[b.server for b in pending.placement.blocks],
            at_version=pending.at_version,
        )
        return pending.placement

    def announce(self) -> None:
        """Tell the listeners the map in force (after a ``commit``: called on the
        supervisor's loop, where the listeners live, not on the mover's thread)."""
        if self.placement is not None:
            self._tell(self.placement)

    def finish(self) -> None:
        """The reassignment is over (completed or rolled back): forget it."""
        self._pending_path.unlink(missing_ok=True)
        self.pending = None

    def _tell(self, placement: PsPlacementMap) -> None:
        for listener in self._listeners:
            listener(placement)

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
                block_bytes=[b.nbytes for b in offer.blocks],
                owner=[b.server for b in offer.blocks],
            )
            self._tell(offer)
            return self._ready(offer)
        problem = layout_difference(self.placement, offer)
        if problem:
            return PlacementReady(
                placement=None,
                error=f"worker {rank}'s parameter blocks differ from the job's: {problem}. "
                "Fix: every worker must build the same model, and the run must keep its "
                "--ps-block-bytes",
            )
        return self._ready(self.placement)

    def _ready(self, placement: PsPlacementMap) -> PlacementReady:
        endpoints = [self._endpoint_of(server) for server in range(placement.servers)]
        return PlacementReady(placement=placement, endpoints=endpoints if all(endpoints) else [])

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

    def _load_pending(self) -> PendingReassignment | None:
        try:
            text = self._pending_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise RunDirError(f"{self._pending_path} is unreadable: {err}") from err
        try:
            return _pending_from_json(json.loads(text))
        except (ValueError, KeyError, TypeError, WireError) as err:
            raise RunDirError(
                f"{self._pending_path} is not a pending reassignment ({err}); the servers may "
                "hold blocks on hold: restore the file from a backup, or start a new run"
            ) from err


def with_owners(
    placement: PsPlacementMap, owner: Sequence[int], servers: int | None = None
) -> PsPlacementMap:
    """``placement`` with block ``i`` on server ``owner[i]``, one version newer,
    on ``servers`` servers (default: as many as now).

    Raises:
        RunDirError: ``owner`` has another length or names a server out of range.
    """
    count = placement.servers if servers is None else servers
    if len(owner) != len(placement.blocks):
        raise RunDirError(f"{len(owner)} owners for {len(placement.blocks)} blocks")
    bad = [s for s in owner if not 0 <= s < count]
    if bad or count < 1:
        raise RunDirError(f"servers {sorted(set(bad))} are not among the map's {count}")
    return PsPlacementMap(
        version=placement.version + 1,
        servers=count,
        blocks=[
            dataclasses.replace(block, server=int(server))
            for block, server in zip(placement.blocks, owner, strict=True)
        ],
    )


def _pending_to_json(pending: PendingReassignment) -> dict[str, object]:
    return {
        "placement": to_dict(PlacementReady(placement=pending.placement)),
        "at_version": pending.at_version,
        "moves": [[m.source, m.target, list(m.blocks)] for m in pending.moves],
    }


def _pending_from_json(data: dict[str, object]) -> PendingReassignment:
    raw = data["placement"]
    if not isinstance(raw, dict):
        raise ValueError("the pending map is not an object")
    placement = from_dict(PlacementReady, raw).placement
    if placement is None:
        raise ValueError("the pending map is empty")
    moves = data["moves"]
    at_version = data["at_version"]
    if not isinstance(moves, list) or not isinstance(at_version, int):
        raise ValueError("moves must be a list and at_version an int")
    return PendingReassignment(
        placement=placement,
        at_version=at_version,
        moves=tuple(
            BlockMove(int(s), int(t), tuple(int(b) for b in blocks)) for s, t, blocks in moves
        ),
    )


def bytes_per_server(placement: PsPlacementMap) -> list[int]:
    loads = [0] * placement.servers
    for block in placement.blocks:
        if 0 <= block.server < placement.servers:
            loads[block.server] += block.nbytes
    return loads


def layout_difference(kept: PsPlacementMap, offer: PsPlacementMap) -> str:
    """How ``offer`` cuts the parameters differently from ``kept`` ("" when alike;
    which server holds a block, and how many servers there are, do not matter:
    the kept map decides that, a scale of the servers changes it)."""
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
