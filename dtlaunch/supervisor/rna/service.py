"""The supervisor's side of RNA's rounds: messages in, the coordinator's commands out.

``RoundService`` feeds each worker's RNA message to the I/O-free
``GroupedCoordinator`` (one ``RoundCoordinator`` per group; one group unless
the policy partitions the workers, §4), sends the messages it asks for and
records its events.
A group's reports of its rounds (``RnaRounds``) become ``rna_rounds`` events,
from which ``dtlaunch status`` shows rounds per second and each worker's share
of them, and ``dtlaunch replay`` draws them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.rna.coordinator import Command, Note, SendTo
from dtlaunch.supervisor.rna.groups import GroupedCoordinator
from dtlaunch.wire.messages import (
    Message,
    RnaExchanged,
    RnaFailed,
    RnaFormed,
    RnaJoin,
    RnaLeave,
    RnaReady,
    RnaRounds,
    RnaStoreReady,
)

__all__ = ["RNA_MESSAGES", "RoundService"]

log = logging.getLogger(__name__)

# Well under the shortest re-probe delay (coordinator.MIN_REPROBE_S).
TICK_S = 0.02

RNA_MESSAGES = (
    RnaJoin,
    RnaStoreReady,
    RnaFormed,
    RnaReady,
    RnaFailed,
    RnaLeave,
    RnaRounds,
    RnaExchanged,
)


class RoundService:
    def __init__(
        self,
        coordinator: GroupedCoordinator,
        *,
        send: Callable[[int, Message], Awaitable[None]],
        recorder: EventRecorder,
        address_of: Callable[[int], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coordinator = coordinator
        self._send = send
        self._recorder = recorder
        self._address_of = address_of
        self._clock = clock

    async def receive(self, rank: int, msg: Message) -> None:
        """One message from worker ``rank`` (one of ``RNA_MESSAGES``)."""
        coord = self.coordinator
        now = self._clock()
        if isinstance(msg, RnaReady):
            commands = coord.ready(rank, msg.gen, msg.round, now)
        elif isinstance(msg, RnaJoin):
            commands = coord.join(rank, msg.applied, now, finished=msg.finished)
        elif isinstance(msg, RnaStoreReady):
            commands = coord.store_ready(rank, msg.gen, msg.port, self._address_of(rank))
        elif isinstance(msg, RnaFormed):
            commands = coord.formed(rank, msg.gen, msg.applied, now)
        elif isinstance(msg, RnaFailed):
            commands = coord.failed(rank, msg.gen, msg.round, msg.error, now)
        elif isinstance(msg, RnaLeave):
            commands = coord.leave(rank, msg.applied, now)
        elif isinstance(msg, RnaExchanged):
            commands = coord.exchanged(
                rank, msg.gen, msg.round, now, seconds=msg.seconds, ok=msg.ok, error=msg.error
            )
        elif isinstance(msg, RnaRounds):
            self._recorder.emit(
                "rna_rounds",
                gen=msg.gen,
                members=list(msg.members),
                rounds=msg.rounds,
                contributions=list(msg.contributions),
                sampled=[
                    {
                        "round": r.round,
                        "initiator": r.initiator,
                        "contributors": list(r.contributors),
                        "staleness": list(r.staleness),
                        "comm_s": r.comm_s,
                    }
                    for r in msg.sampled
                ],
            )
            return
        else:
            return
        await self._carry_out(commands)

    async def run(self) -> None:
        """Tick the coordinator often enough to widen an unanswered round in time."""
        while True:
            await asyncio.sleep(TICK_S)
            await self._carry_out(self.coordinator.tick(self._clock()))

    async def partition(self, groups: Sequence[Sequence[int]], reason: str) -> str | None:
        """Replace the groups (hierarchical RNA, the policy's PARTITION_RNA);
        the reason it cannot be done now, or None."""
        refusal = self.coordinator.partition_refusal(groups)
        await self._carry_out(self.coordinator.partition(groups, self._clock(), reason))
        return refusal

    async def worker_gone(self, rank: int, *, succeeded: bool = False) -> None:
        now = self._clock()
        await self._carry_out(self.coordinator.worker_gone(rank, now, succeeded=succeeded))

    async def _carry_out(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, SendTo):
                await self._send(command.rank, command.msg)
            elif isinstance(command, Note):
                self._recorder.emit(command.kind, **command.fields)
