"""Asking the agents for the Python stacks of stuck processes (the stall diagnosis).

The stall watchdog (``control.stall``) decides *that* the job is stuck; before
the stuck processes are restarted, the supervisor asks each of their agents for
py-spy dumps (``DumpStacks`` -> ``Stacks``, see ``dtlaunch.agent.stacks``) and
waits a bounded time for the answers. A host that does not answer in time is
named in place of its stacks, so the diagnosis never waits on a dead agent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dtlaunch.supervisor.jobstate import AgentState, JobState, ProcState
from dtlaunch.wire.messages import DumpStacks, Message, Stacks

__all__ = ["STACKS_TIMEOUT_S", "StackRequests", "innermost_frames", "stuck_processes"]

log = logging.getLogger(__name__)

STACKS_TIMEOUT_S = 15.0  # the agents' own py-spy bound (10 s) plus the round trip
MAX_TEXT = 64 << 10  # per process, as the agent cuts it: a bad answer cannot grow us

SendToHost = Callable[[str, Message], Awaitable[None]]


class StackRequests:
    """Requests in flight, keyed by id; an answer counts only from the host asked."""

    def __init__(self, send: SendToHost) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[str, list[str], asyncio.Future[dict[str, str]]]] = {}

    async def collect(
        self, targets: Mapping[str, list[str]], *, timeout_s: float = STACKS_TIMEOUT_S
    ) -> dict[str, str]:
        """``targets``: host -> its stuck proc ids. Returns proc id -> stacks text
        (or why there is none), for every proc asked, within ``timeout_s``."""
        loop = asyncio.get_running_loop()
        asked: dict[int, tuple[str, list[str]]] = {}
        for host, proc_ids in targets.items():
            if not proc_ids:
                continue
            request_id = next(self._ids)
            self._waiting[request_id] = (host, list(proc_ids), loop.create_future())
            asked[request_id] = (host, list(proc_ids))
        try:
            for request_id, (host, proc_ids) in asked.items():
                await self._send(host, DumpStacks(request_id=request_id, proc_ids=proc_ids))
            futures = [self._waiting[request_id][2] for request_id in asked]
            if futures:
                await asyncio.wait(futures, timeout=timeout_s)
            stacks: dict[str, str] = {}
            for request_id, (host, proc_ids) in asked.items():
                future = self._waiting[request_id][2]
                answered = future.result() if future.done() else {}
                for proc_id in proc_ids:
                    stacks[proc_id] = answered.get(proc_id) or (
                        f"no stacks: the agent on {host} did not answer within {timeout_s:g} s"
                    )
            return stacks
        finally:
            for request_id in asked:
                self._waiting.pop(request_id, None)

    def answer(self, host: str, msg: Stacks) -> None:
        """An agent's ``Stacks``; late, unknown or foreign answers are dropped."""
        waiting = self._waiting.get(msg.request_id)
        if waiting is None or waiting[0] != host:
            log.debug("ignoring stacks %d from %s: not asked or too late", msg.request_id, host)
            return
        _, proc_ids, future = waiting
        if not future.done():
            future.set_result(
                {p: str(msg.stacks[p])[:MAX_TEXT] for p in proc_ids if p in msg.stacks}
            )


def innermost_frames(text: str, count: int = 3) -> list[str]:
    """The first thread's innermost ``count`` frames of a py-spy dump (or its
    one-line reason when there are none), for the event log and ``replay``."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Thread "):
            frames = []
            for frame in lines[index + 1 :]:
                if not frame.startswith("    "):
                    break
                frames.append(frame.strip())
                if len(frames) == count:
                    break
            return frames
    first = text.strip().splitlines()
    return first[:1]


def stuck_processes(
    state: JobState, last_step: Mapping[int, tuple[int, float]], now: float
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """What every running process did last, for the ``stall`` event (``last_step``:
    a worker's rank -> its last step and when it was reported), and the procs
    to ask stacks for, by host (those whose agent is up)."""
    procs: list[dict[str, Any]] = []
    targets: dict[str, list[str]] = {}
    for slot in state.procs.values():
        if slot.state is not ProcState.RUNNING:
            continue
        entry: dict[str, Any] = {
            "proc": slot.proc_id,
            "host": slot.host,
            "pid": slot.pid,
            "attempt": slot.attempt,
            "unresponsive": slot.unresponsive,
        }
        if slot.role == "worker" and slot.rank in last_step:
            step, at = last_step[slot.rank]
            entry["last_step"] = step
            entry["last_report_ago_s"] = round(now - at, 1)
        procs.append(entry)
        agent = state.agents.get(slot.host)
        if agent is not None and agent.state is AgentState.UP:
            targets.setdefault(slot.host, []).append(slot.proc_id)
    return procs, targets
