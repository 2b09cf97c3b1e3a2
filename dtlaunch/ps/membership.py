"""Which workers a BSP step waits for, as the server hears it: the supervisor's
membership (``PsMembership``: the workers it assigned, and BACKUP's b), a
worker that waits for data or has data again (``PsIdle``), and one that takes
no more steps (``PsLeave``). The ``PsServer`` handlers (a mixin, as
``migration`` is; the attributes are ``PsServer``'s); the rules are
``ParamStore``'s."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dtlaunch.ps.store import ParamStore
from dtlaunch.ps.transport import Incoming, ServerSocket
from dtlaunch.wire.messages import PsIdle, PsIdleReply, PsLeave, PsMembership, PsUpdate

__all__ = ["Membership"]

logger = logging.getLogger("dtlaunch.ps.server")


class Membership:
    """``PsServer``'s membership handlers; the attributes are ``PsServer``'s."""

    store: ParamStore
    incarnation: int
    _sock: ServerSocket

    if TYPE_CHECKING:  # defined by PsServer

        def _reply(self, incoming: Incoming, detail: str = "") -> None: ...

        def _after_update(self, update: PsUpdate | None) -> None: ...

    def _on_membership(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsMembership)
        workers = self.store.assigned if msg.backup_only else msg.workers
        update = self.store.set_members(sorted(workers), msg.backup)
        self._reply(incoming)
        self._after_update(update)

    def _on_idle(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsIdle)
        was_idle = msg.worker in self.store.idle
        if msg.idle:
            update, member_from = self.store.set_idle(msg.worker), self.store.version
            if not was_idle:
                logger.info("worker %d waits for data; steps go on without it", msg.worker)
        else:
            update, member_from = None, self.store.activate(msg.worker)
            if was_idle:
                logger.info("worker %d has data again: a member from step %d", msg.worker,
                            member_from)  # fmt: skip
        self._sock.send(
            incoming.peer,
            PsIdleReply(
                request_id=msg.request_id,
                member_from=member_from,
                version=self.store.version,
                incarnation=self.incarnation,
                member=self.store.counts(msg.worker),
            ),
        )
        self._after_update(update)

    def _on_leave(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsLeave)
        update = self.store.leave(msg.worker)
        self._reply(incoming)
        self._after_update(update)
