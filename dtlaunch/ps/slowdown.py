"""Straggler injection on a parameter server (``--inject ...role=server...``).

A contended server (AntDT §VII-A-4, §VII-B-1b) is slow at what it does per
step: after each applied update the server holds the pulls waiting for it for
the injected delay, so every worker's next step waits with it, as behind a real
slow server (the server goes on answering control requests meanwhile). The
delay counts in the update's time, the server's T_s that the Monitor compares,
and is reported apart as ``injected_s``. Specs, windows and coins are ``dtlaunch.inject``'s; a
``slowdown`` factor scales the update's own aggregation + optimizer time.

A ``slowdown`` with ``link=RATE`` slows the server's transfers by the factor
too, as a slow link would (PSLD §7's slow servers): a pull's answer goes out,
and a push is taken, only once the link has moved its bytes, ``(factor - 1) x
bytes / RATE`` after the transfers before it ended (``transfer_delay``). The
server defers those sends and intakes here (``defer``; ``run_due`` in its loop),
so it goes on answering everything else meanwhile.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import time
from collections.abc import Callable

from dtlaunch.inject import InjectionSpec, injected_delay
from dtlaunch.ps.transport import Incoming
from dtlaunch.wire.messages import PsUpdate

__all__ = ["ServerSlowdown"]


class ServerSlowdown:
    def __init__(
        self,
        specs: tuple[InjectionSpec, ...],
        *,
        rank: int,
        host: str,
        job_start_wall: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._specs = tuple(s for s in specs if s.role == "server")
        self._rank = rank
        self._host = host
        self._job_start = job_start_wall or time.time()
        self._rng = random.Random(seed)  # read only: every process tosses the same coins
        self._links = tuple(s for s in self._specs if s.kind == "slowdown" and s.link > 0)
        self._link_free_at = 0.0  # monotonic: when the slowed link ends its last transfer
        # (due, seq, the request it answers or takes, action)
        self._deferred: list[tuple[float, int, Incoming, Callable[[], None]]] = []
        self._seq = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._specs)

    def apply(self, update: PsUpdate) -> tuple[PsUpdate, float]:
        """This update's injected delay: the update with it counted in, and the delay."""
        if not self._specs:
            return update, 0.0
        delay = injected_delay(
            self._specs,
            role="server",
            rank=self._rank,
            host=self._host,
            now=time.time() - self._job_start,
            step_compute_s=update.update_s,
            rng=self._rng,
        )
        if delay <= 0:
            return update, 0.0
        counted = dataclasses.replace(
            update, update_s=update.update_s + delay, injected_s=update.injected_s + delay
        )
        return counted, delay

    # ------------------------------------------------------------ a slow link

    def transfer_delay(self, nbytes: int) -> float:
        """Seconds from now until a transfer of ``nbytes`` starting now has gone
        over this server's slowed link (0: no ``link=`` slowdown applies now):
        it waits for the transfers before it, then takes ``(factor - 1) x bytes
        / link`` of each spec."""
        if not self._links or nbytes <= 0:
            return 0.0
        now_job = time.time() - self._job_start
        extra = sum(
            (spec.factor - 1.0) * nbytes / spec.link
            for spec in self._links
            if spec.applies_to(role="server", rank=self._rank, host=self._host)
            and spec.active_at(now_job)
        )
        if extra <= 0:
            return 0.0
        now = time.monotonic()
        self._link_free_at = max(now, self._link_free_at) + extra
        return self._link_free_at - now

    def defer(self, delay: float, request: Incoming, action: Callable[[], None]) -> None:
        """Run ``action`` for ``request`` in ``delay`` seconds (from the server's
        loop: ``run_due``); meanwhile the request counts as waiting here (``holds``)."""
        due = time.monotonic() + delay
        heapq.heappush(self._deferred, (due, next(self._seq), request, action))

    def holds(self, peer: bytes, request_id: int) -> bool:
        """Whether ``peer``'s request ``request_id`` waits for the slow link: a
        client that pings for it must not send it again."""
        return any(
            r.peer == peer and getattr(r.message, "request_id", 0) == request_id
            for _, _, r, _ in self._deferred
        )

    def wait_ms(self, longest: int) -> int:
        """How long the server's loop may wait for a message, at most ``longest``."""
        if not self._deferred:
            return longest
        left = int((self._deferred[0][0] - time.monotonic()) * 1000) + 1
        return max(1, min(longest, left))

    def run_due(self) -> None:
        """Run the deferred actions whose time has come, in order."""
        now = time.monotonic()
        while self._deferred and self._deferred[0][0] <= now:
            _, _, _, action = heapq.heappop(self._deferred)
            action()
