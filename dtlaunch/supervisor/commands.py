"""What a control client asks of the running job: ``dtlaunch stop`` and ``dtlaunch scale``
(and asking the workers a scale-down removed to leave).

A control client holds the run's client key (only someone who can read the run
directory has it). Each request is recorded as a ``command`` event and answered
with an ``Ack`` that says what is done, or why nothing is (a scale the job
cannot carry out is refused with the reason and the fix, and nothing changes).

In a parameter-server job the node table's scale is all there is; an allreduce
job's group also re-forms with the new size (``regroup.RegroupDriver.resize``),
or, when no worker attached its model (an unmodified torchrun script), restarts
with it as torchrun's elastic agent does.
A scale of the built-in servers sets the node table's target and starts the
added servers; the parameter servers' keeper (``psfleet``) moves the blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.jobstate import AskToLeave, Command, JobState, WorkerPeers
from dtlaunch.supervisor.regroup import RegroupDriver
from dtlaunch.wire.messages import Ack, LeaveJob, Message, ScaleJob, StopJob

__all__ = ["CONTROL_MESSAGES", "ControlCommands"]

log = logging.getLogger(__name__)

CONTROL_MESSAGES = (StopJob, ScaleJob)

Reply = Callable[[bytes, Message], Awaitable[None]]


class ControlCommands:
    def __init__(
        self,
        *,
        state: JobState,
        recorder: EventRecorder,
        apply: Callable[[list[Command]], None],
        reply: Reply,
        workers: WorkerPeers,
        workers_changed: Callable[[list[int], list[int]], None],
        servers_refusal: Callable[[int], str | None] = lambda count: None,
        group: RegroupDriver | None = None,
        global_batch: Callable[[], int] = lambda: 0,
        spawn: Callable[[Coroutine[Any, Any, None], str], object] | None = None,
    ) -> None:
        """``workers_changed(before, after)``: told the worker ranks after a scale
        changed them (the parameter servers' membership follows them).
        ``servers_refusal(count)``: why the built-in servers cannot be scaled to
        ``count`` now.
        ``group``: an allreduce job's regroups, which a scale resizes (run as a
        task by ``spawn``); ``global_batch``: the data set's, which bounds it."""
        self._state = state
        self._recorder = recorder
        self._apply = apply
        self._reply = reply
        self._workers = workers
        self._workers_changed = workers_changed
        self._servers_refusal = servers_refusal
        self._group = group
        self._global_batch = global_batch
        self._spawn = spawn

    async def handle(self, peer: bytes, msg: StopJob | ScaleJob, now: float) -> None:
        if isinstance(msg, StopJob):
            self._recorder.emit("command", command="stop", reason=msg.reason)
            await self._reply(peer, Ack(ok=True, detail="stopping"))
            self._apply(self._state.stop(msg.reason, now))
            return
        self._recorder.emit(
            "command", command="scale", workers=msg.workers, servers=msg.servers, reason=msg.reason
        )
        said: list[str] = []
        # The servers first: a refused request changes nothing, the workers included.
        for what, count, before, scale in (
            ("server", msg.servers, self._state.server_target, self.scale_servers),
            ("worker", msg.workers, len(self._state.worker_ranks()), self.scale),
        ):
            if count == 0:  # not asked
                continue
            refused = scale(count, now, msg.reason)
            if refused is not None:
                done = f" ({'; '.join(said)})" if said else ""
                await self._reply(peer, Ack(ok=False, detail=refused + done))
                return
            said.append(
                f"the job runs {before} {what}(s) already"
                if before == count
                else f"{what}s {before} -> {count}"
            )
        await self._reply(peer, Ack(ok=bool(said), detail="; ".join(said) or "nothing to scale"))

    def scale_servers(self, count: int, now: float, reason: str) -> str | None:
        """Run ``count`` built-in parameter servers from now on; returns why not
        when the job refuses, and then nothing changed."""
        before = self._state.server_target
        try:
            refusal = self._servers_refusal(count) if count != before else None
            if refusal is not None:
                raise ConfigError(refusal)
            commands = self._state.scale_servers(count, now, reason=reason)
        except ConfigError as err:
            log.warning("scale to %d servers refused: %s", count, err)
            self._recorder.emit("scale_refused", servers=count, reason=reason, error=str(err))
            return str(err)
        self._apply(commands)
        if commands:
            log.info("scaling: servers %d -> %d (%s)", before, count, reason)
        return None

    def scale(self, count: int, now: float, reason: str) -> str | None:
        """Run ``count`` workers from now on (``dtlaunch scale``, or SCALE_WORKERS of
        a policy); returns why not when the job refuses, and then nothing changed."""
        before = self._state.worker_ranks()
        group = self._group
        restart = group is not None and group.restarts_to_resize()
        try:
            if group is not None and count != len(before):
                refusal = group.resize_refusal(count, global_batch=self._global_batch())
                if refusal is not None:
                    raise ConfigError(refusal)
            commands = self._state.scale_workers(
                count, now, reason=reason, regroup=group is not None and not restart,
                restart=restart,
            )  # fmt: skip
        except ConfigError as err:
            log.warning("scale to %d workers refused: %s", count, err)
            self._recorder.emit("scale_refused", workers=count, reason=reason, error=str(err))
            return str(err)
        self._apply(commands)
        if commands:
            after = self._state.worker_ranks()
            log.info("scaling: workers %d -> %d (%s)", len(before), count, reason)
            if group is not None and restart:
                group.restarted(count, reason=reason)
            elif group is not None and self._spawn is not None:
                joining = [rank for rank in after if rank not in before]
                self._spawn(group.resize(count, joining=joining, reason=reason), "resize")
            self._workers_changed(before, after)
        return None

    async def ask_to_leave(self, command: AskToLeave) -> None:
        """A worker a scale-down removed ends its batches with the shard it reads
        (``LeaveJob``); one whose SDK never said hello cannot be asked: stopped."""
        if self._workers.said_hello(command.rank, command.attempt):
            peer = self._workers.peer_of(command.rank)
            await self._reply(peer, LeaveJob(reason=command.reason))
            return
        why = "its SDK never said hello, so it cannot be asked to leave"
        self._apply(self._state.leave_unheard(command.rank, command.attempt, why))
