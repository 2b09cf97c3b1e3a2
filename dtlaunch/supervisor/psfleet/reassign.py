"""Live block reassignment between running servers (PSLD §5.2), the supervisor's side.

A ``REASSIGN_BLOCKS`` names a new owner for every block. The blocks move at a
step boundary every server agrees on, the *fence* version ``F``, chosen ahead
of the sources' newest version, in two phases around one commit point
(``PlacementKeeper``):

1. ``begin``: the new map and ``F`` are written to the pending file.
2. Every source is asked, all at once, for the blocks it gives away, at ``F``
   and on hold (``PsExport(hold=True)``): at ``F`` it answers with the blocks
   and their optimizer state, keeps them, and answers no pull of ``F`` or later
   for them. The workers' next pulls wait there: the pause starts.
3. Each target imports its blocks at ``F`` (a target still finishing step
   ``F - 1`` keeps the import waiting until it is at ``F``).
4. ``commit``: the new map is the job's.
5. Every source releases the blocks (``PsRelease``): the waiting pulls are
   answered "placement changed to V", the workers fetch the job's map, now V,
   and pull again from the new owners. The pause ends.

No worker pulls version ``F`` of a moved block before step 5, so no gradient
of step ``F`` is computed on the old placement, and every step before ``F`` was
applied on the old owners before the blocks left: nothing is lost or applied
twice. A source already past ``F`` when its export arrives refuses it; the
reassignment is rolled back and tried again with a fence further ahead.

A fence can also become unreachable: a server that must get to ``F`` (a source,
to export; a target holding blocks, to import at its own version) waits for
the pushes of workers whose pulls are held at a source's fence. BSP servers
advance in step, but not in the same instant, and a worker whose steps are
numbered one ahead on the source (it rejoined, or its push there came late)
wants the source's version ``F`` before it can push the step the other server
lacks. Nothing would ever move again. While the exports and imports wait, the
servers are watched (``PsStats.waiting_for`` and ``held``): a server below the
fence that waits only for held workers rolls the reassignment back, and it is
tried again further ahead (the workers are in step again by then).

Rolling back (anything fails before the commit): wait until no export is still
waiting in a source (one answered later would hold blocks for nobody), drop
what targets imported or may still import (``PsRelease`` with no version), then
end the holds (``PsHoldEnd``): in the other order a worker's next push, on the
old map, would meet a target still holding the imported blocks. After the
commit only step 5 is left, and it is repeated until done.
A supervisor killed anywhere in between finds the pending file when it resumes
(``recover``): committed, it completes step 5; not committed, it rolls back.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dtlaunch.errors import PsError
from dtlaunch.ps.control import ExportedBlocks, ServerControl
from dtlaunch.supervisor.psfleet.placement import (
    BlockMove,
    PendingReassignment,
    PlacementKeeper,
)
from dtlaunch.wire.keys import PeerKeys
from dtlaunch.wire.messages import PsUpdate

__all__ = [
    "FENCE_LEADS",
    "PACE_UPDATES",
    "SLOW_STEP_S",
    "BlockReassigner",
    "Reassigned",
    "step_time",
    "subset",
]

log = logging.getLogger(__name__)

# Versions ahead of the sources' newest at which the blocks move: far enough
# that the export requests arrive first; a source that was quicker refuses, and
# the next try leads by more (steps of a few milliseconds run many versions
# while the requests travel).
FENCE_LEADS = (2, 8, 32)
# Steps at least this long between a server's versions: the first fence is the
# very next version (the requests, milliseconds on the way, arrive well before
# it), so the workers do not wait a further slow step for the blocks to move.
SLOW_STEP_S = 0.1
PACE_UPDATES = 8  # the newest updates of a server its step time is read from
WATCH_S = 0.25  # how often waiting exports and imports check the fence can be reached


@dataclass(frozen=True, slots=True)
class Reassigned:
    """A reassignment carried out."""

    version: int  # the job's map version it made
    at_version: int  # the servers' version at which the blocks moved
    # What the reassignment added to the step: from every source at the fence
    # (the last export in) to the last release. Before that the step waited for
    # the slowest server to reach the fence anyway (as a whole server's move
    # measures from its boundary, ``migrate``).
    pause_s: float
    blocks: int  # blocks moved
    nbytes: int  # their parameter bytes
    tries: int  # fences tried (a refused fence is rolled back and tried further ahead)
    lead: int = 0  # versions ahead of the servers' newest the fence was set
    hold_s: float = 0.0  # from the first source holding its blocks to the last release
    # Where the pause went, seconds from the first hold: every export in (the
    # last source at the fence), every import taken (the last target at the
    # fence), the map committed, the sources released.
    phases_s: dict[str, float] = dataclasses.field(default_factory=dict)


class BlockReassigner:
    """Carries out reassignments on the caller's thread (blocking; see module doc)."""

    def __init__(
        self,
        *,
        keeper: PlacementKeeper,
        endpoint_of: Callable[[int], str],
        keys: PeerKeys,
        timeout: float,
        stop: threading.Event,
    ) -> None:
        self._keeper = keeper
        self._endpoint_of = endpoint_of  # server index -> its endpoint now ("" unknown)
        self._keys = keys
        self._timeout = timeout
        self._stop = stop

    def carry_out(self, owner: Sequence[int], servers: int | None = None) -> Reassigned:
        """Move every block to ``owner[block]``, in a map of ``servers`` servers (a
        scale of the servers: the added ones, running and empty, take their blocks
        with the workers' membership; the removed ones give theirs away; default:
        as many as now); returns what it did.

        Raises:
            PsError: a server refused or was silent at every fence tried (all
                rolled back), or the sources did not confirm the release (the
                map is committed; ``recover`` completes it).
        """
        if self._keeper.pending is not None:
            self.recover()
        why = ""
        for tries, lead in enumerate(FENCE_LEADS, start=1):
            done = self._try(owner, lead, tries, servers, next_if_slow=tries == 1)
            if isinstance(done, Reassigned):
                return done
            why = done
            log.info("reassignment: %s; trying again further ahead", why)
        raise PsError(f"reassignment rolled back at every fence tried: {why}")

    def recover(self) -> str:
        """Complete (committed) or roll back (not) a reassignment left pending by
        an earlier supervisor or attempt: "completed", "rolled back" or "" (none).

        Raises:
            PsError: a server did not answer (the pending file stays; try again).
        """
        pending = self._keeper.pending
        if pending is None:
            return ""
        if self._keeper.committed:
            self._release(pending)
            self._keeper.finish()
            return "completed"
        self._roll_back(pending, imported=[m.target for m in pending.moves])
        self._keeper.finish()
        return "rolled back"

    # ---------------------------------------------------------------- phases

    def _try(
        self,
        owner: Sequence[int],
        lead: int,
        tries: int,
        servers: int | None,
        *,
        next_if_slow: bool = False,
    ) -> Reassigned | str:
        """One fence ``lead`` versions ahead (``next_if_slow``: the next version
        when the servers' steps take ``SLOW_STEP_S`` or more): what was done, or
        why the fence was passed before the exports arrived (rolled back).

        Raises:
            PsError: refused or silent for another reason (rolled back).
        """
        placement = self._keeper.placement
        assert placement is not None  # a policy decides only with a map in force
        count = placement.servers if servers is None else servers
        if list(owner) == [b.server for b in placement.blocks] and count == placement.servers:
            raise PsError("reassignment: every block is on its server already")
        newest = 0
        step_times: list[float] = []
        for server in range(placement.servers):
            with self._control(server) as control:
                stats = control.stats()
            newest = max(newest, stats.version)
            step_times.append(step_time(stats.updates))
        if next_if_slow and min(step_times, default=0.0) >= SLOW_STEP_S:
            lead = 1
        pending = self._keeper.begin(owner, newest + lead, count)
        if not pending.moves:  # servers removed that held no block: only the map changes
            self._keeper.commit()
            self._keeper.finish()
            return Reassigned(pending.placement.version, pending.at_version, 0.0, 0, 0, tries, lead)
        exported, refused, first_hold, stuck = self._export(pending)
        if stuck:  # rolled back already: the waiting exports had to be refused
            self._keeper.finish()
            return f"fence {pending.at_version} cannot be reached ({stuck})"
        if refused:
            self._roll_back(pending, imported=[])
            self._keeper.finish()
            reasons = "; ".join(f"server {j}: {r.reason}" for j, r in sorted(refused.items()))
            if all(r.fence_passed for r in refused.values()):
                return f"fence {pending.at_version} passed ({reasons})"
            raise PsError(f"reassignment rolled back: {reasons}")
        exported_at = time.monotonic()
        stuck, failed = self._import(pending, exported, added_from=placement.servers)
        if stuck or failed:
            # Every target: an import that timed out (or waits) there is refused
            # by the release, and one that arrived holds the blocks.
            self._roll_back(pending, imported=[m.target for m in pending.moves])
            self._keeper.finish()
            if stuck:
                return f"fence {pending.at_version} cannot be reached ({stuck})"
            raise PsError(f"reassignment rolled back: {failed}")
        imported_at = time.monotonic()
        self._keeper.commit()
        committed_at = time.monotonic()
        self._release(pending)
        released_at = time.monotonic()
        self._keeper.finish()
        sizes = [b.nbytes for b in pending.placement.blocks]
        moved = [b for m in pending.moves for b in m.blocks]
        return Reassigned(
            version=pending.placement.version,
            at_version=pending.at_version,
            pause_s=released_at - exported_at,
            blocks=len(moved),
            nbytes=sum(sizes[b] for b in moved),
            tries=tries,
            lead=lead,
            hold_s=released_at - first_hold,
            phases_s={
                name: round(at - first_hold, 4)
                for name, at in (
                    ("exported", exported_at),
                    ("imported", imported_at),
                    ("committed", committed_at),
                    ("released", released_at),
                )
            },
        )

    def _export(
        self, pending: PendingReassignment
    ) -> tuple[dict[int, ExportedBlocks], dict[int, _Refusal], float, str]:
        """Every source's blocks at the fence, all at once (each waits for its own
        step boundary); returns them, the refusals, when the first hold began, and
        why the fence cannot be reached ("" when it was: else everything is
        rolled back). Returns only once no export waits in any source any more."""
        giving = pending.by_source()
        done_at: dict[int, float] = {}

        def export(source: int) -> ExportedBlocks | _Refusal:
            # A control of its own: the exports wait at once, each on its thread.
            with self._control(source) as control:
                try:
                    got = control.export(
                        giving[source],
                        at_version=pending.at_version,
                        remove=False,
                        hold=True,
                    )
                except PsError as exc:
                    # Refused because the source was past the fence already, or else?
                    try:
                        passed = control.stats().version >= pending.at_version
                    except PsError:
                        passed = False
                    return _Refusal(str(exc), fence_passed=passed)
                done_at[source] = time.monotonic()
                return got

        exported: dict[int, ExportedBlocks] = {}
        refused: dict[int, _Refusal] = {}
        with ThreadPoolExecutor(max_workers=len(giving), thread_name_prefix="ps-fence") as pool:
            futures = {source: pool.submit(export, source) for source in giving}
            stuck = self._await(pending, futures.values())
            if stuck:  # the sources' hold ends: the exports still waiting are refused
                self._roll_back(pending, imported=[])
        for source, future in futures.items():
            answer = future.result()
            if isinstance(answer, _Refusal):
                refused[source] = answer
            else:
                exported[source] = answer
        return exported, refused, min(done_at.values(), default=time.monotonic()), stuck

    def _import(
        self,
        pending: PendingReassignment,
        exported: dict[int, ExportedBlocks],
        *,
        added_from: int,
    ) -> tuple[str, str]:
        """Every target takes its blocks, all at once (one holding blocks of its
        own waits until it is at the fence); returns why the fence cannot be
        reached and what failed ("" and "" when every import was taken). A
        target ``added_from`` and up (added by a scale) takes the workers'
        membership with its blocks. Returns once no import waits any more (the
        caller's roll-back refuses those that still do when it was stuck)."""

        def take(move: BlockMove) -> None:
            part = subset(exported[move.source], move.blocks)
            with self._control(move.target) as control:
                control.import_blocks(part, with_members=move.target >= added_from)

        with ThreadPoolExecutor(
            max_workers=len(pending.moves), thread_name_prefix="ps-import"
        ) as pool:
            futures = [pool.submit(take, move) for move in pending.moves]
            stuck = self._await(pending, futures)
            if stuck:  # the targets refuse the imports still waiting
                for move in pending.moves:
                    with contextlib.suppress(PsError), self._control(move.target) as control:
                        control.release(list(move.blocks), 0)
        failed = [str(f.exception()) for f in futures if f.exception() is not None]
        return stuck, "" if stuck else "; ".join(failed)

    def _await(self, pending: PendingReassignment, futures: Collection[Future[Any]]) -> str:
        """Until every one of ``futures`` (exports or imports of ``pending``) is
        done; returns early with why they never will be ("")."""
        while True:
            _, waiting = concurrent.futures.wait(futures, timeout=WATCH_S)
            if not waiting:
                return ""
            why = self._stuck(pending)
            if why:
                log.warning("reassignment at fence %d: %s", pending.at_version, why)
                return why

    def _stuck(self, pending: PendingReassignment) -> str:
        """Why some server of ``pending`` can never reach its fence ("" while
        each can): it is below the fence and every push its coming step lacks
        is from a worker held at a fence (see the module doc). The held workers
        are read first: a worker held then cannot push before the hold ends, so
        a server read after it that still lacks its push waits for good."""
        servers = pending.servers()
        try:
            held: set[int] = set()
            for server in servers:
                with self._control(server) as control:
                    held.update(control.stats().held)
            for server in servers:
                with self._control(server) as control:
                    stats = control.stats()
                lacking = set(stats.waiting_for)
                if stats.version >= pending.at_version or not stats.blocks or not lacking:
                    continue
                if lacking <= held:
                    return (
                        f"server {server} is at version {stats.version}, below the fence, "
                        f"and its next step lacks the pushes of workers {sorted(lacking)}, "
                        "whose pulls are held at the fence"
                    )
        except PsError as exc:  # a silent server: its own request's timeout says so
            log.debug("reassignment watch: %s", exc)
        return ""

    def _release(self, pending: PendingReassignment) -> None:
        for source, blocks in pending.by_source().items():
            with self._control(source) as control:
                control.release(blocks, pending.placement.version)

    def _roll_back(self, pending: PendingReassignment, *, imported: list[int]) -> None:
        """Targets drop what they imported first, then the sources' holds end: once
        a hold ends the workers push step F with the old map's blocks, which a
        target still holding imported ones would refuse as a stale placement."""
        problems: list[str] = []
        for move in pending.moves:
            if move.target in imported:
                try:
                    with self._control(move.target) as control:
                        control.release(list(move.blocks), 0)
                except PsError as exc:
                    problems.append(str(exc))
        for source, blocks in pending.by_source().items():
            try:
                with self._control(source) as control:
                    control.hold_end(blocks)
            except PsError as exc:
                problems.append(str(exc))
        if problems:
            raise PsError("rolling the reassignment back: " + "; ".join(problems))

    # --------------------------------------------------------------- helpers

    def _endpoint(self, server: int) -> str:
        endpoint = self._endpoint_of(server)
        if not endpoint:
            raise PsError(f"server {server} has no known endpoint (not running)")
        return endpoint

    def _control(self, server: int) -> ServerControl:
        """A link to ``server`` for the caller's ``with`` block: none is kept open
        between reassignments, which are many steps apart."""
        return ServerControl(
            self._endpoint(server), self._keys, timeout=self._timeout, stop=self._stop
        )


def step_time(updates: Sequence[PsUpdate]) -> float:
    """A server's recent time between versions (the median over its newest
    ``PACE_UPDATES`` updates), 0.0 when too few are known to tell."""
    ended = sorted(u.ended_s for u in updates if u.ended_s > 0)[-PACE_UPDATES:]
    gaps = sorted(b - a for a, b in itertools.pairwise(ended))
    return gaps[len(gaps) // 2] if gaps else 0.0


@dataclass(frozen=True, slots=True)
class _Refusal:
    reason: str
    fence_passed: bool  # the source was past the fence when the export arrived


def subset(exported: ExportedBlocks, blocks: Sequence[int]) -> ExportedBlocks:
    """The part of ``exported`` that holds ``blocks`` (its records and frames: a
    block's parameter frame, then one frame per optimizer-state tensor).

    Raises:
        PsError: a block is not in ``exported``.
    """
    wanted = set(blocks)
    records, frames = [], []
    at = 0
    for record in exported.message.blocks:
        width = 1 + len(record.tensors)
        if record.block.block_id in wanted:
            records.append(record)
            frames.extend(exported.frames[at : at + width])
        at += width
    missing = wanted - {r.block.block_id for r in records}
    if missing:
        raise PsError(f"blocks {sorted(missing)} were not exported")
    return ExportedBlocks(dataclasses.replace(exported.message, blocks=records), frames)
