"""Blocks that left this server, or are on hold to leave it, and who was told where.

Blocks leave a server in one of two ways:

* **A whole server's move** (a server replaced by a new process elsewhere).
  After ``PsExport(remove=True, moved_to=E)`` the blocks live on the server at
  ``E``. A client that still asks this one for them (it had not heard of the
  move: the move happens between two of its steps, whenever the step boundary
  comes) gets ``PsReply(ok=False, moved_to=E)``, switches, and asks again there.
  The supervisor retires this server once every member of the new one was
  redirected (``PsStats.redirected``, worker ranks; a worker told a block's new
  map version counts too).

* **A reassignment between running servers** (PSLD §5.2). The supervisor picks a
  fence version ``F`` and sends ``PsExport(hold=True, at_version=F)``: at ``F``
  the server exports the blocks, keeps them, and *holds* them (``hold``): no
  pull naming one of them is answered, and no push of step ``F`` or later
  taken, until the hold ends. It ends with ``PsRelease(placement_version=V)``
  (the blocks went elsewhere in the job's map ``V``: every request naming one
  of them is answered ``PsReply(ok=False, placement_version=V)`` from then on,
  and the client follows the map) or ``PsHoldEnd`` (rolled back: they stay, and
  the waiting requests are answered as usual; the targets drop what they
  imported first, as the workers let go push the old map's blocks at once). A
  hold must begin before any pull of ``F`` for its blocks was answered from
  here, or a worker would compute step ``F`` on the old placement:
  ``fence_passed`` says when it is too late, from the highest version this
  server sent of each block (``sent``).

A block imported back later is served here again (``returned``).

Under ASP there is no step boundary: the source exports at once and holds the
blocks from then on, and every push naming them waits (``holds_push``), to be
sent on by its client to the blocks' new servers once the map is committed.
"""

from __future__ import annotations

from collections.abc import Iterable

from dtlaunch.wire.messages import Message, PsIdle, PsInit, PsLeave, PsPull, PsPush

__all__ = ["MovedBlocks"]


class MovedBlocks:
    def __init__(self) -> None:
        self._where: dict[int, str] = {}  # block -> the endpoint it moved to
        self._told: set[int] = set()  # worker ranks
        self._placement: dict[int, int] = {}  # block -> the map version that put it elsewhere
        self._fence: dict[int, int] = {}  # held block -> the version from which it is held
        self._sent: dict[int, int] = {}  # block -> the highest version sent in a PsParams

    # ------------------------------------------------------- whole-server moves

    def moved(self, blocks: Iterable[int], endpoint: str) -> None:
        for block in blocks:
            self._where[block] = endpoint

    def redirect(self, msg: Message, *, holds_blocks: bool) -> str:
        """Where ``msg`` should go instead ("" to handle it here).

        Pulls, pushes and seeds for a moved block go where it went; a worker
        leaving, or idle or active again, goes there too once nothing is left
        here (its steps run there).
        """
        if not self._where:
            return ""
        if isinstance(msg, PsPull | PsPush):
            return self.destination(msg.blocks, worker=msg.worker)
        if isinstance(msg, PsInit):
            return self.destination([b.block_id for b in msg.blocks], worker=msg.worker)
        if isinstance(msg, PsLeave | PsIdle) and not holds_blocks:
            self._told.add(msg.worker)
            return next(iter(self._where.values()))
        return ""

    def destination(self, blocks: Iterable[int], *, worker: int) -> str:
        """Where the first of ``blocks`` that moved went ("" if none did); counts
        ``worker`` as redirected when it did."""
        for block in blocks:
            endpoint = self._where.get(block)
            if endpoint:
                self._told.add(worker)
                return endpoint
        return ""

    def returned(self, blocks: Iterable[int]) -> None:
        """These blocks live here again (imported back): no redirect for them."""
        for block in blocks:
            self._where.pop(block, None)
            self._placement.pop(block, None)

    @property
    def redirected(self) -> list[int]:
        return sorted(self._told)

    # ------------------------------------------------------------ reassignment

    def sent(self, blocks: Iterable[int], version: int) -> None:
        """A PsParams of ``version`` went out with ``blocks``."""
        for block in blocks:
            if self._sent.get(block, -1) < version:
                self._sent[block] = version

    def fence_passed(self, blocks: Iterable[int], fence: int, version: int) -> str:
        """Why a hold of ``blocks`` from version ``fence`` comes too late for a
        server at ``version`` ("" when it does not): a pull of the fence version
        may have been answered, or was, from the old placement."""
        if version > fence:
            return (
                f"this server is at version {version}, past the fence {fence}: pulls of "
                "the fence version may have been answered from the old placement; pick a "
                "later fence"
            )
        answered = sorted(b for b in blocks if self._sent.get(b, -1) >= fence)
        if answered:
            return (
                f"a pull of version {fence} was answered with blocks {answered} already; "
                "pick a later fence"
            )
        return ""

    def hold(self, blocks: Iterable[int], fence: int) -> None:
        """Answer nothing of version ``fence`` or later for ``blocks`` until
        ``end_hold`` (see the module docstring)."""
        for block in blocks:
            self._fence[block] = fence

    def held(self, blocks: Iterable[int]) -> list[int]:
        """Those of ``blocks`` on hold."""
        return [b for b in blocks if b in self._fence]

    def fence_of(self, blocks: Iterable[int]) -> int | None:
        """The earliest fence of the held blocks among ``blocks`` (None: none held)."""
        fences = [self._fence[b] for b in blocks if b in self._fence]
        return min(fences) if fences else None

    def holds_push(self, msg: PsPush, *, asp: bool) -> bool:
        """Whether push ``msg`` must wait for the hold of a block it names to end:
        one of step ``F`` or later (BSP: an earlier step is a late push, answered
        as ever); under ASP any push, since every push applies at once and the
        blocks' state left with the export."""
        fence = self.fence_of(msg.blocks)
        return fence is not None and (asp or msg.step >= fence)

    def end_hold(self, blocks: Iterable[int]) -> list[int]:
        """Hold ``blocks`` no longer; returns those that were held."""
        return [b for b in blocks if self._fence.pop(b, None) is not None]

    def reassigned(self, blocks: Iterable[int], placement_version: int) -> None:
        """``blocks`` went elsewhere in the job's map ``placement_version``."""
        for block in blocks:
            self._placement[block] = max(placement_version, self._placement.get(block, 0))

    def placement_version(self, msg: Message) -> int:
        """The job's map version that put a block ``msg`` names elsewhere (0: none
        does), counting its worker as told (``redirected``: a server a scale-in
        emptied is stopped once every member was). Pulls, pushes and seeds name
        blocks; other requests are handled here."""
        if not self._placement:
            return 0
        if isinstance(msg, PsPull | PsPush):
            blocks = msg.blocks
        elif isinstance(msg, PsInit):
            blocks = [b.block_id for b in msg.blocks]
        else:
            return 0
        version = max((self._placement.get(b, 0) for b in blocks), default=0)
        if version:
            self._told.add(msg.worker)
        return version
