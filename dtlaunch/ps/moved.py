"""Blocks this server gave away in a migration, and who has been told where.

After ``PsExport(remove=True, moved_to=E)`` the blocks live on the server at
``E``. A client that still asks this one for them (it had not heard of the
move: the move happens between two of its steps, whenever the step boundary
comes) gets ``PsReply(ok=False, moved_to=E)``, switches, and asks again there.
The supervisor retires this server once every member of the new one was
redirected (``PsStats.redirected``, worker ranks).
"""

from __future__ import annotations

from collections.abc import Iterable

from dtlaunch.wire.messages import Message, PsIdle, PsInit, PsLeave, PsPull, PsPush

__all__ = ["MovedBlocks"]


class MovedBlocks:
    def __init__(self) -> None:
        self._where: dict[int, str] = {}
        self._told: set[int] = set()  # worker ranks

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

    @property
    def redirected(self) -> list[int]:
        return sorted(self._told)
