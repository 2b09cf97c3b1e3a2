"""The part of ``dtlaunch.ps.Client`` that brings it and the servers back in step
(a mixin, as ``migration`` is for the server; the attributes are ``Client``'s):

* **membership**: a worker waiting for data tells every server it is idle, so
  BSP steps go on without it, and rejoins them at one common step when data
  comes (``waiting_for_data``, ``data_arrived``);
* **resync**: a server that restarted is offered this worker's copy of its
  blocks and, if it lost it, this worker's last gradient (``_resync``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import zmq

from dtlaunch.errors import PlacementChanged, PsError, ServerRestarted
from dtlaunch.ps.blocks import Placement
from dtlaunch.ps.exchange import Exchanger, Request, expect, expecting
from dtlaunch.ps.model_blocks import GradMark, ModelTensors
from dtlaunch.wire.messages import (
    Message,
    PsIdle,
    PsIdleReply,
    PsInitReply,
    PsParams,
    PsPull,
    PsPushAck,
)

__all__ = ["MAX_RESYNCS", "CatchUp"]

logger = logging.getLogger("dtlaunch.ps.client")

MAX_RESYNCS = 5  # a server that restarts again during a resync is resynced again
# A rank ``dtlaunch scale`` added is counted by the servers once the supervisor
# heard its hello; its first push waits for that (asked again this often, so long).
MEMBER_POLL_S = 0.2
MEMBER_WAIT_S = 60.0


class CatchUp:
    """``Client``'s membership and resync (see the module docstring)."""

    worker: int
    _exch: Exchanger
    _tensors: ModelTensors
    _versions: list[int]
    _want: list[int]
    _pushed_step: list[int]
    _applied_by: list[int]
    _pushed_samples: int
    _pushed_grads: list[GradMark]
    _pushing: bool
    _closed: bool
    _left: bool
    _idle: bool
    placement: Placement

    if TYPE_CHECKING:  # defined by Client

        @property
        def endpoints(self) -> list[str]: ...

        def _init_request(self, j: int, with_data: bool) -> Request: ...

        def _push_request(
            self, j: int, step: int, samples: int, *, zeros: bool, blocks: Sequence[int] = ()
        ) -> Request: ...

        def _ids(self, server: int) -> list[int]: ...

        def _note_applied(self, j: int, ack: PsPushAck) -> None: ...

        def _follow_placement(self, changed: PlacementChanged) -> None: ...

    def waiting_for_data(self) -> None:
        """The job waits for data: BSP steps stop waiting for this worker.

        The job calls it again while it waits, so a server that restarted
        meanwhile (its idle set lost) hears it again.
        """
        if self._closed or self._left:
            return
        if not self._idle:
            logger.info("ps: worker %d waits for data; steps go on without it", self.worker)
        self._idle = True
        links = range(len(self._exch.links))
        requests: dict[int, Request] = {
            j: (PsIdle(request_id=0, worker=self.worker, idle=True), []) for j in links
        }
        self._exch.run("idle", requests, expecting(PsIdleReply, "PsIdle"), on_restart=self._resync)

    def data_arrived(self) -> None:
        """Data came after a wait: a member of every server's steps again."""
        if self._closed or self._left or not self._idle:
            return
        self._idle = False
        self._rejoin()

    def _rejoin(self, *, until_counted: bool = False) -> None:
        """Be a member again, from one step common to every server.

        Each server answers the first step that waits for this worker (its
        current one, or the next if that one went on without it). The worker
        trains next on the latest of those; for an earlier step a server
        expects from it, it pushes zeros (once that step is the server's), so
        no step waits for it and the parameters it computes on are one version.

        ``until_counted`` (a new process under ``dtlaunch run``): first wait, up
        to ``MEMBER_WAIT_S``, until every server counts this worker. A rank a
        scale added is counted once the supervisor heard its hello; a push
        before that joins a step only if it comes in time, and a dropped one
        gives its shard back to be read again, records already trained included.
        """
        n = len(self._exch.links)
        member_from = [0] * n
        counted = [True] * n

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            answer = expect(PsIdleReply, j, reply, "PsIdle")
            member_from[j], counted[j] = answer.member_from, answer.member
            return 0

        def ask() -> None:
            requests: dict[int, Request] = {
                j: (PsIdle(request_id=0, worker=self.worker, idle=False), []) for j in range(n)
            }
            self._exch.run("rejoin", requests, take, on_restart=self._resync)

        ask()
        if until_counted and not all(counted):
            logger.info(
                "ps: worker %d waits until servers %s count it (the supervisor tells them "
                "once it heard this worker's hello)",
                self.worker,
                [j for j in range(n) if not counted[j]],
            )
            deadline = time.monotonic() + MEMBER_WAIT_S
            while not all(counted) and time.monotonic() < deadline:
                time.sleep(MEMBER_POLL_S)
                ask()
            if not all(counted):
                logger.warning(
                    "ps: servers %s still do not count worker %d after %.0f s; training "
                    "anyway: a push that comes after its step is dropped and its shard read again",
                    [j for j in range(n) if not counted[j]],
                    self.worker,
                    MEMBER_WAIT_S,
                )
        common = max(member_from, default=0)
        for step in range(min(member_from, default=0), common):
            behind = [j for j in range(n) if member_from[j] <= step]
            wait_for_step: dict[int, Request] = {
                j: (PsPull(request_id=0, min_version=step, blocks=[], worker=self.worker), [])
                for j in behind
            }
            self._exch.run(
                "rejoin", wait_for_step, expecting(PsParams, "a pull"), on_restart=self._resync
            )
            self._exch.run_following(
                "rejoin",
                functools.partial(self._zero_pushes, behind, step),
                expecting(PsPushAck, "a push"),
                follow=self._follow_placement,
                on_restart=self._resync,
            )
            for j in behind:
                member_from[j] = step + 1
        self._want = [max(w, common) for w in self._want]

    def _push_moved(self, changed: PlacementChanged, samples: int) -> None:
        """ASP: the push that servers ``changed.servers`` held while a reassignment
        moved their blocks goes on to the blocks' new servers (only those blocks:
        the new servers applied this push's other blocks already), following the
        job's map, again if it moves on meanwhile."""
        moved = sorted(b for j in changed.servers for b in self._ids(j))
        self._follow_placement(changed)

        def requests() -> dict[int, Request]:
            owners: dict[int, list[int]] = {}
            for block in moved:
                owners.setdefault(self.placement.owner[block], []).append(block)
            return {
                j: self._push_request(j, self._versions[j], samples, zeros=False, blocks=ids)
                for j, ids in owners.items()
            }

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            expect(PsPushAck, j, reply, "a push")  # ASP takes every push
            return 0

        self._exch.run_following(
            "push", requests, take, follow=self._follow_placement, on_restart=self._resync
        )

    def _zero_pushes(self, servers: Sequence[int], step: int) -> dict[int, Request]:
        return {j: self._push_request(j, step, 0, zeros=True) for j in servers}

    def _resync(self, j: int, incarnation: int) -> None:
        """Bring restarted server ``j`` up to date (see the module docstring)."""
        for _ in range(MAX_RESYNCS):
            logger.warning(
                "ps: server %d (%s) restarted (incarnation %d); offering my copy at version %d",
                j,
                self.endpoints[j],
                incarnation,
                self._versions[j],
            )
            try:
                if self._offer(j) >= self._applied_by[j]:
                    pass  # the server's parameters include this worker's last gradient
                elif self._pushing:  # only under ASP: that gradient is gone from p.grad
                    logger.warning(
                        "ps: server %d lost this worker's gradient of step %d",
                        j,
                        self._pushed_step[j],
                    )
                    self._applied_by[j] = 0
                else:
                    self._repush(j)
                return
            except ServerRestarted as again:
                incarnation = again.incarnation
        raise PsError(
            f"parameter server {j} ({self.endpoints[j]}) restarted {MAX_RESYNCS} times while "
            "this worker resynced it; check its log"
        )

    def _offer(self, j: int) -> int:
        """Offer server ``j`` this worker's copy; returns the version of the copy the
        server holds after (its ``recovered_at``)."""
        answer: list[PsInitReply] = []

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            answer.append(expect(PsInitReply, j, reply, "PsInit"))
            return 0

        self._exch.run("resync", {j: self._init_request(j, False)}, take, on_restart=_restarted)
        held = answer[-1]
        takes_copies = held.version == held.recovered_at  # no update of its own yet
        if not held.seeded or (takes_copies and held.version < self._versions[j]):
            request = self._init_request(j, True)
            self._exch.run("resync", {j: request}, take, on_restart=_restarted)
        return answer[-1].recovered_at

    def _repush(self, j: int) -> None:
        """Send the last accepted gradient again: the restarted server lost it."""
        intact = self._tensors.grads_unchanged(self._pushed_grads)
        if not intact:
            logger.warning(
                "ps: p.grad changed since the push of step %d; server %d applies that step "
                "without this worker's gradient (leave p.grad alone until the next pull)",
                self._pushed_step[j],
                j,
            )
        samples = self._pushed_samples if intact else 0
        request = self._push_request(j, self._pushed_step[j], samples, zeros=not intact)

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            reply = expect(PsPushAck, j, reply, "a push")
            if reply.accepted:  # else a newer copy, which has it, was taken meanwhile
                self._note_applied(j, reply)
            return 0

        self._exch.run("repush", {j: request}, take, on_restart=_restarted)


def _restarted(server: int, incarnation: int) -> None:
    raise ServerRestarted(server, incarnation)
