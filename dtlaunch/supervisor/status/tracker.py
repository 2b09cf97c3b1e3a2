"""The supervisor's read-only status endpoint: the live job as a ``StatusSnapshot``.

``StatusTracker`` is an event sink (it folds every event the supervisor emits,
see ``status_events``). On a ``StatusRequest`` it adds what only the running
supervisor knows first-hand: the node table's states, the DDS queue's progress,
and the Monitor's view of stragglers with the policy's own lambda and windows,
so that what ``dtlaunch status`` highlights is what the policy sees. Building a
snapshot does no I/O and changes nothing the job depends on.

Status clients connect to a socket of their own (``supervisor.json``'s
``status_endpoint``, answered by ``StatusTracker.serve``) with the identity
``status:<pid>`` (``STATUS_PREFIX``); the supervisor answers their
``StatusRequest`` and ignores anything else they send, there and on the job's
socket, so a status client can watch a job but never steer it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable

from dtlaunch.events import Event
from dtlaunch.supervisor.control.controller import Controller
from dtlaunch.supervisor.control.monitor import MonitorSnapshot, WindowStats
from dtlaunch.supervisor.dds.service import DdsService
from dtlaunch.supervisor.jobstate.machine import JobState, ProcState
from dtlaunch.supervisor.status.fold import NodeKey, StatusFold, lambda_of
from dtlaunch.supervisor.status.nodetrack import Resources
from dtlaunch.wire.messages import StatusReply, StatusRequest, StatusSnapshot
from dtlaunch.wire.sockets import Router

log = logging.getLogger(__name__)

STATUS_PREFIX = b"status:"
STATUS_BATCH = 8  # status requests taken per wake-up of the status socket's reader
PERSISTENT_FILL = 0.8  # a long window counts once it spans this share of l_per (as nd)


class StatusTracker:
    """Answers status requests for one job; see module doc."""

    def __init__(
        self, *, run_id: str, policy: str, mode: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.fold = StatusFold(run_id=run_id, policy=policy, mode=mode)
        self._clock = clock  # the supervisor's: serve() reads "now" from it
        self._started = clock()  # built next to the event recorder: the same zero

    def emit(self, event: Event) -> None:
        """Fold one event (the ``EventSink`` protocol)."""
        self.fold.emit(event)

    def snapshot(
        self,
        *,
        state: JobState,
        dds: DdsService | None,
        controller: Controller | None,
        now: float,
    ) -> StatusSnapshot:
        """The job at ``now`` (the supervisor's monotonic clock)."""
        restarts = Counter((r.role, r.rank) for r in state.restarts)
        states = {
            (slot.role, slot.rank): (
                slot.host,
                "unresponsive" if slot.unresponsive else slot.state.value,
                restarts[slot.role, slot.rank],
            )
            for slot in state.procs.values()
        }
        resources = {
            (slot.role, slot.rank): Resources(
                memory_bytes=slot.rss_bytes if slot.state is ProcState.RUNNING else 0,
                memory_limit=slot.memory_limit,
                cpu_percent=slot.cpu_percent if slot.state is ProcState.RUNNING else 0.0,
                cpu_limit=slot.cpu_limit,
            )
            for slot in state.procs.values()
            if slot.memory_limit or slot.cpu_limit or slot.rss_bytes
        }
        queue = dds.queue if dds is not None else None
        shards = (queue.done_count, queue.total) if queue is not None else None
        if controller is not None:
            stragglers = monitor_stragglers(controller.recent_view(now), controller.policy.lam)
        else:
            stragglers = self.fold.ratio_stragglers(lambda_of(self.fold.policy), running_only=True)
        snapshot = self.fold.snapshot(
            now=now - self._started,
            source="live",
            stragglers=stragglers,
            states=states,
            shards=shards,
            phase=state.phase.value,
            resources=resources,
        )
        if controller is not None and controller.plan:
            snapshot = dataclasses.replace(snapshot, plan=controller.plan)
        return snapshot

    def reply(
        self,
        request: StatusRequest,
        *,
        state: JobState,
        dds: DdsService | None,
        controller: Controller | None,
        now: float,
    ) -> StatusReply | None:
        """The answer to ``request``; None (and a log line) for another run's."""
        if request.run_id != self.fold.run_id:
            log.warning(
                "status request for run %s, this is run %s; ignored",
                request.run_id,
                self.fold.run_id,
            )
            return None
        snapshot = self.snapshot(state=state, dds=dds, controller=controller, now=now)
        return StatusReply(request_id=request.request_id, snapshot=snapshot)

    async def serve(
        self,
        router: Router,
        *,
        state: JobState,
        dds: DdsService | None,
        controller: Controller | None,
    ) -> None:
        """Answer status clients on their own socket, until cancelled.

        On the job's socket a request queued behind every report, fetch and
        heartbeat that came before it: at 1,000 workers, after the loop had been
        held for ~0.1 s, hundreds of them, and the answer waited for them all
        (status p99 over 200 ms in a 10-minute soak). This task wakes when a
        request comes and runs between two batches of the job's messages.
        """
        while True:
            for peer, msg in await router.recv_many(STATUS_BATCH):
                if not isinstance(msg, StatusRequest):
                    log.debug("%s on the status socket from %r; ignored", type(msg).__name__, peer)
                    continue
                try:
                    reply = self.reply(
                        msg, state=state, dds=dds, controller=controller, now=self._clock()
                    )
                    if reply is not None:
                        await router.send(peer, reply)
                except Exception:  # a status answer must never take the supervisor down
                    log.exception("error answering a status request from %r", peer)


def monitor_stragglers(snap: MonitorSnapshot, lam: float) -> dict[NodeKey, str]:
    """Nodes the Monitor's windows show as stragglers at ``lam``, with why.

    Persistent (long window, once it spans most of ``l_per``) wins over transient
    (short window). Workers are compared with the fastest quarter's equal-share
    BPT, nd's default yardstick (``monitor.fast_reference``); servers with the
    mean update time.
    """
    out: dict[NodeKey, str] = {}
    for rank, ratio, st in _slow(snap.worker_long, snap.ref_bpt_eq_long, lam):
        if st.span_s >= PERSISTENT_FILL * snap.l_per:
            out["worker", rank] = (
                f"persistent straggler: {ratio:.1f}x the fastest BPT over {st.span_s:.0f} s "
                f"(lambda {lam:g})"
            )
    for rank, ratio, _ in _slow(snap.worker_short, snap.ref_bpt_eq_short, lam):
        out.setdefault(
            ("worker", rank),
            f"transient straggler: {ratio:.1f}x the fastest BPT over the last "
            f"{snap.l_trans:g} s (lambda {lam:g})",
        )
    for rank, ratio, st in _slow(snap.server_long, snap.mean_update_long, lam):
        out["server", rank] = (
            f"slow server: update time {ratio:.1f}x the mean over {st.span_s:.0f} s "
            f"(lambda {lam:g})"
        )
    return out


def _slow(
    window: dict[int, WindowStats], mean: float | None, lam: float
) -> list[tuple[int, float, WindowStats]]:
    if mean is None or mean <= 0 or len(window) < 2:
        return []
    return [
        (rank, st.mean_bpt_eq / mean, st)
        for rank, st in sorted(window.items())
        if st.mean_bpt_eq >= lam * mean
    ]
