"""Straggler injection on a parameter server (``--inject ...role=server...``).

A contended server (AntDT §VII-A-4, §VII-B-1b) is slow at what it does per
step: after each applied update the server holds the pulls waiting for it for
the injected delay, so every worker's next step waits with it, as behind a real
slow server (the server goes on answering control requests meanwhile). The
delay counts in the update's time, the server's T_s that the Monitor compares,
and is reported apart as ``injected_s``. Specs, windows and coins are ``dtlaunch.inject``'s; a
``slowdown`` factor scales the update's own aggregation + optimizer time.
"""

from __future__ import annotations

import dataclasses
import random
import time

from dtlaunch.inject import InjectionSpec, injected_delay
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
