"""Reaching many hosts at once, at most ``limit`` of them in progress at a time.

``dtlaunch check`` and the supervisor's agent launch both go through a
:class:`FanOut`: a host waits in the queue until one of the ``limit`` turns is
free, and every per-host budget (the check's timeout, the connect and probe
timeouts of a launch, ``--agent-timeout``) starts when its turn starts, not
while it waits behind other hosts. A check holds its turn for its one SSH
connection; a launch from its probe until the agent says Hello, so the turns
also bound the agents starting up side by side. The wait for a turn has no
timeout of its own: every turn ahead is bounded by its own budgets.

Without a bound, 256 hosts open 256 SSH handshakes at once: sshd drops
unauthenticated connections beyond its ``MaxStartups`` (10 by default on many
systems, per listening daemon) and a slow host's timeout runs out in the crowd.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from dtlaunch.config import DEFAULT_SSH_CONCURRENCY, check_concurrency

__all__ = ["DEFAULT_SSH_CONCURRENCY", "FanOut", "check_concurrency", "fan_out"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class FanOut:
    """At most ``limit`` hosts in progress at once; the others wait their turn in
    the order they asked for it. ``active`` and ``peak`` count the turns in use."""

    def __init__(self, limit: int) -> None:
        self.limit = check_concurrency(limit)
        self._slots = asyncio.Semaphore(limit)
        self.active = 0
        self.peak = 0

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for a free turn (no timeout: the turns ahead are bounded by their
        own budgets), hold it for the body, free it on the way out."""
        async with self._slots:
            self.active += 1
            self.peak = max(self.peak, self.active)
            try:
                yield
            finally:
                self.active -= 1


async def fan_out(
    items: Sequence[_T], work: Callable[[_T], Awaitable[_R]], *, limit: int
) -> list[_R]:
    """``work(item)`` for every item, at most ``limit`` at once; results in the
    order of ``items``. ``work`` applies its own per-item budget (it starts when
    the item's turn does) and turns failures into results: an exception it lets
    through cancels the rest.

    Raises:
        ConfigError: ``limit`` is below 1.
    """
    gate = FanOut(limit)

    async def one(item: _T) -> _R:
        async with gate.turn():
            return await work(item)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(item)) for item in items]
    return [task.result() for task in tasks]
