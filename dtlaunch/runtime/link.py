"""The loop-thread side of a worker's supervisor connection: the DDS protocol.

``SupervisorClient`` (``runtime.client``) runs a ``SupervisorLink`` in its daemon
thread. All socket I/O happens here, on a wire ``Dealer``; the training thread
reaches this object only through ``loop.call_soon_threadsafe`` (the public
methods above the loop), the thread-safe queues of ``Shared``, and
``hand_reports``, which appends to a deque without waking this thread.

Protocol, as the worker sees it:

* ``Hello`` first (with the leases it holds), then ``Ping`` whenever a heartbeat
  interval passed without any other message, so that the supervisor hears from
  it at least once an interval (a resumed supervisor answers the first message
  of a worker it does not know with ``Rehello``). A worker that reports steps,
  fetches or acks sends no pings: at 1,000 workers they were a sixth of the
  supervisor's messages.
* ``Rehello`` from the supervisor (it restarted and does not know us): send
  ``Hello`` again with the held leases, then re-send whatever is unanswered
  (dataset request, shard request, unconfirmed acks). Several Rehellos answer the
  messages sent before our Hello, and the link keeps order, so Rehellos that
  arrive while that Hello awaits its ``Welcome`` are ignored.
* Dataset: ``RegisterDataset`` when the script gave one, else the query
  ``DatasetReady(dataset=None)``; both are answered by ``DatasetReady``.
* PS placement: ``RegisterPlacement`` (the map this worker planned), answered by
  ``PlacementReady`` with the job's map. Questions like these two are re-sent
  until answered, also to a restarted supervisor.
* Shards: ``FetchShards`` keeps ``prefetch`` shards' worth of records queued
  ahead of the training thread. A grant is authoritative whenever it arrives,
  even for a request given up on; leases are deduplicated by ``lease_id``. A
  request unanswered after a timeout is sent again with a new ``request_id``.
* A lease is held from its grant until the supervisor confirms it DONE
  (``AckDone``); unconfirmed ``AckShards`` are re-sent after a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import os
import queue
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import zmq.asyncio

from dtlaunch.errors import DtlaunchError
from dtlaunch.runtime.data import lease_fits
from dtlaunch.runtime.steps import REPORT_EVERY_S, REPORT_MAX_STEPS, TimedReport
from dtlaunch.sharding import DatasetSpec
from dtlaunch.version import __version__
from dtlaunch.wire.keys import PeerKeys
from dtlaunch.wire.messages import (
    AckDone,
    AckShards,
    AdjustBatchSize,
    AdjustLR,
    DatasetReady,
    FetchShards,
    Hello,
    Lease,
    LeaveJob,
    Message,
    Ping,
    PlacementReady,
    Regroup,
    RegroupGo,
    Rehello,
    ReleaseShards,
    RnaGroup,
    RnaLeft,
    RnaOpenStore,
    RnaProbe,
    RnaStart,
    ShardGrant,
    StepReports,
    Welcome,
)
from dtlaunch.wire.sockets import Dealer

__all__ = ["Ask", "Connection", "End", "Failed", "Item", "Shared", "SupervisorLink"]

logger = logging.getLogger(__name__)

MIN_REPORT_EVERY_S = 0.05  # the shortest report interval the link keeps

REQUEST_TIMEOUT_INTERVALS = 3  # heartbeat intervals without an answer before re-sending
MIN_REQUEST_TIMEOUT_S = 1.0
MIN_RETRY_S = 0.05  # an empty grant with retry_after 0 must not become a busy loop


@dataclass(frozen=True, slots=True, kw_only=True)
class Connection:
    """Who this worker is and where its supervisor listens."""

    endpoint: str
    keys: PeerKeys
    run_id: str
    rank: int
    attempt: int
    heartbeat_interval: float


class End:
    """Queued after the last lease: the supervisor said finished."""


@dataclass(frozen=True, slots=True)
class Failed:
    """Queued when the connection failed: the training thread raises ``error``."""

    error: BaseException


Item = Lease | End | Failed


@dataclass(slots=True, kw_only=True)
class Ask:
    """A question to the supervisor, sent again each request timeout until answered."""

    msg: Message
    future: concurrent.futures.Future[Message]
    sent_at: float = -math.inf


class QueuedRecords:
    """Records granted but not yet taken by the training thread (changed on the
    loop thread only; read from both)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records = 0

    def add(self, records: int) -> None:
        with self._lock:
            self._records += records

    @property
    def value(self) -> int:
        with self._lock:
            return self._records


@dataclass(frozen=True, slots=True)
class Shared:
    """What the loop thread hands to the training thread."""

    items: queue.Queue[Item] = field(default_factory=queue.Queue)
    actions: queue.Queue[Message] = field(default_factory=queue.Queue)
    regroup_go: queue.Queue[RegroupGo] = field(default_factory=queue.Queue)
    # RNA's messages for the communication thread (dtlaunch.runtime.rna), which
    # also wakes itself through this queue when a gradient is handed over.
    rna: queue.Queue[object] = field(default_factory=queue.Queue)
    queued: QueuedRecords = field(default_factory=QueuedRecords)


class SupervisorLink:
    """The DDS protocol over one ``Dealer``; see the module docstring. Everything
    here runs on ``loop`` in the client's thread, except ``failure`` reads and
    ``hand_reports``."""

    def __init__(
        self,
        conn: Connection,
        shared: Shared,
        *,
        prefetch: int,
        identity: bytes,
        report_every_s: float = REPORT_EVERY_S,
    ) -> None:
        self._conn = conn
        self._shared = shared
        self._prefetch = prefetch
        self._identity = identity
        self.failure: BaseException | None = None  # set once; read by the training thread
        self.loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._dealer: Dealer | None = None
        self._interval = conn.heartbeat_interval
        self._need_hello = True
        self._hello_at: float | None = None  # last Hello not yet answered by Welcome
        self._ping_seq = 0
        self._next_ping = 0.0
        self._asks: dict[str, Ask] = {}  # answer TYPE -> the question awaiting it
        self._spec: DatasetSpec | None = None
        self._held: set[int] = set()
        self._seen: set[int] = set()
        self._next_request_id = 1
        self._outstanding: tuple[int, float] | None = None  # (request_id, sent at)
        self._retry_at = 0.0
        self._finished = False
        self._consumer_waiting = False
        self._pending_acks: dict[int, tuple[int, float]] = {}  # lease -> (step, sent at)
        # Step measurements not sent yet: the training thread appends (a deque's
        # append is thread-safe), this thread sends them every report interval.
        self._reports: deque[TimedReport] = deque()
        # The link looks for reports this often: a tiny --control-interval must not
        # wake every worker's thread a thousand times a second.
        self._report_every_s = max(MIN_REPORT_EVERY_S, report_every_s)
        self._reports_sent_at = 0.0  # on self.loop.time()
        self._reports_now = False  # flush_reports() asked for them
        self._outbox: list[Message] = []  # notices from the training thread
        self._sticky: list[Message] = []  # notices every new supervisor must hear
        self._close_deadline: float | None = None
        # LeaveJob heard: no more fetching, and the step the reader left at (0 until
        # its next step() says; the shards' ReleaseShards carry it).
        self._leaving = False
        self._leaving_at = 0

    # ------------------------------------- called by the training thread, run here

    def start_ask(self, answer_type: str, ask: Ask) -> None:
        if self.failure is not None:
            ask.future.set_exception(self.failure)
            return
        self._asks[answer_type] = ask
        self._wake.set()

    def begin_fetching(self, spec: DatasetSpec) -> None:
        self._spec = spec
        self._wake.set()

    def set_consumer_waiting(self) -> None:
        self._consumer_waiting = True
        self._wake.set()

    def lease_taken(self, records: int) -> None:
        """The training thread took a lease of ``records``: on this thread, so
        the fetch pump sees the queue and the waiting flag change together."""
        self._consumer_waiting = False
        self._shared.queued.add(-records)
        self._wake.set()

    def add_acks(self, lease_ids: list[int], step: int) -> None:
        for lease_id in lease_ids:
            self._pending_acks[lease_id] = (step, -math.inf)
        self._wake.set()

    def release(self, lease_ids: list[int], step: int, reason: str = "") -> None:
        # Not ours any more: a Hello after a supervisor restart must not claim
        # them (the supervisor then releases them itself if this notice is lost).
        for lease_id in lease_ids:
            self._held.discard(lease_id)
            self._pending_acks.pop(lease_id, None)
        reason = reason or f"step {step} of worker {self._conn.rank} was dropped (BACKUP_WORKERS)"
        self.queue_send(ReleaseShards(lease_ids=lease_ids, step=step, reason=reason), False)

    def give_back_queued(self, step: int) -> None:
        """The worker leaves (LeaveJob): no more fetching; the leases queued for
        the training thread, which reads none of them now, go back, and so does
        any a grant still brings (``_on_grant``)."""
        self._leaving, self._leaving_at = True, step
        queued: list[int] = []
        while True:
            try:
                item = self._shared.items.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Lease):
                queued.append(item.lease_id)
            else:
                self._shared.items.put(item)  # End or Failed: keep it for the reader
                break
        if queued:
            self.release(queued, step, self._leave_reason(step))

    def _leave_reason(self, step: int) -> str:
        return f"worker {self._conn.rank} leaves the job at step {step} (dtlaunch scale)"

    def queue_send(self, msg: Message, repeat_on_rehello: bool) -> None:
        self._outbox.append(msg)
        if repeat_on_rehello:
            self._sticky.append(msg)
        self._wake.set()

    def hand_reports(self, reports: list[TimedReport]) -> None:
        """From the training thread: queued without waking this thread (and
        dropped once the thread has failed: nobody would send them)."""
        if self.failure is None:
            self._reports.extend(reports)

    def flush_reports(self) -> None:
        """On this thread's loop: send the queued reports at once."""
        self._reports_now = True
        self._wake.set()

    def begin_close(self, timeout: float) -> None:
        self._close_deadline = self.loop.time() + timeout
        self._wake.set()

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        ctx = zmq.asyncio.Context()
        try:
            self._dealer = Dealer(ctx, self._conn.endpoint, self._conn.keys, self._identity)
            tasks = [
                asyncio.create_task(self._receive_loop(self._dealer)),
                asyncio.create_task(self._control_loop()),
            ]
            try:
                # The control loop returns when closed; the receive loop only by failing.
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                task.result()  # re-raise a failure
        except DtlaunchError as exc:
            logger.error("dtlaunch runtime: %s", exc)
            self._fail(exc)
        except Exception as exc:
            logger.exception("dtlaunch runtime: the supervisor connection failed")
            self._fail(exc)
        finally:
            if self._dealer is not None:
                self._dealer.close()
            ctx.term()

    def _fail(self, error: BaseException) -> None:
        self.failure = error
        for ask in self._asks.values():
            if not ask.future.done():
                ask.future.set_exception(error)
        self._asks.clear()
        self._shared.items.put(Failed(error))

    async def _control_loop(self) -> None:
        while True:
            now = self.loop.time()
            # Pump first: what close() queued (the last step reports) goes out too.
            await self._pump(now)
            if self._close_deadline is not None:
                if not self._pending_acks:
                    return
                if now >= self._close_deadline:
                    logger.warning(
                        "the supervisor did not confirm %d finished lease(s) in time; "
                        "it will hand them out again",
                        len(self._pending_acks),
                    )
                    return
            delay = max(0.0, self._next_deadline() - self.loop.time())
            # asyncio.timeout, not wait_for: in Python 3.11 wait_for can swallow a
            # cancellation that comes with the wake-up, and this loop never ends.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.clear()

    @property
    def _timeout(self) -> float:
        return max(MIN_REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_INTERVALS * self._interval)

    def _next_deadline(self) -> float:
        # Reports are handed over without a wake-up: look every report interval.
        deadlines = [self._next_ping, self._reports_sent_at + self._report_every_s]
        deadlines += [ask.sent_at + self._timeout for ask in self._asks.values()]
        if self._outstanding is not None:
            deadlines.append(self._outstanding[1] + self._timeout)
        elif self._spec is not None and not self._finished and self._retry_at > self.loop.time():
            deadlines.append(self._retry_at)  # a past retry time would spin this loop
        if self._pending_acks:
            deadlines.append(min(sent for _, sent in self._pending_acks.values()) + self._timeout)
        if self._close_deadline is not None:
            deadlines.append(self._close_deadline)
        return min(deadlines)

    async def _send(self, msg: Message) -> bool:
        """Queue ``msg``; False when the send queue is full (it is not sent)."""
        assert self._dealer is not None
        if not await self._dealer.send(msg):
            logger.debug("%s not queued (send queue full); retried later", msg.TYPE)
            return False
        self._next_ping = self.loop.time() + self._interval  # this message says "alive"
        return True

    async def _pump(self, now: float) -> None:
        """Send whatever is due; every decision is made from state, never blocks."""
        if self._need_hello:
            self._need_hello = False
            self._hello_at = now
            # The link keeps order: what we re-send now arrives after the Hello.
            for ask in self._asks.values():
                ask.sent_at = -math.inf
            self._outstanding = None
            self._pending_acks = {
                lease_id: (step, -math.inf) for lease_id, (step, _) in self._pending_acks.items()
            }
            await self._send(
                Hello(
                    role="worker",
                    run_id=self._conn.run_id,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    version=__version__,
                    rank=self._conn.rank,
                    attempt=self._conn.attempt,
                    leases=sorted(self._held),
                )
            )
        if now >= self._next_ping:
            self._ping_seq += 1
            self._next_ping = now + self._interval  # also when the queue is full
            await self._send(Ping(seq=self._ping_seq))
        for ask in list(self._asks.values()):  # an answer may come while we send
            if now - ask.sent_at >= self._timeout:
                ask.sent_at = now
                await self._send(ask.msg)
        if self._outbox and self._hello_at is None:
            outbox, self._outbox = self._outbox, []
            for msg in outbox:
                await self._send(msg)
        await self._pump_fetch(now)
        await self._pump_acks(now)
        await self._pump_reports(now)

    async def _pump_reports(self, now: float) -> None:
        due = self._reports_now or now - self._reports_sent_at >= self._report_every_s
        if not due:
            return
        self._reports_sent_at = now  # the next look is an interval from now
        if not self._reports or self._hello_at is not None:
            return
        self._reports_now = False
        # What is queued now (the training thread may add while we send), in
        # messages of at most REPORT_MAX_STEPS. Measurements are best effort: a
        # message the full send queue refuses is dropped, and the rest wait.
        left = len(self._reports)
        while left > 0:
            taken = [self._reports.popleft() for _ in range(min(REPORT_MAX_STEPS, left))]
            left -= len(taken)
            reports = [
                dataclasses.replace(t.report, age_s=max(0.0, time.monotonic() - t.ended))
                for t in taken
            ]
            if not await self._send(StepReports.of(reports)):
                return

    async def _pump_fetch(self, now: float) -> None:
        spec = self._spec
        if spec is None or self._finished or self._close_deadline is not None:
            return
        if self._leaving:
            return
        if self._outstanding is not None:
            request_id, sent_at = self._outstanding
            if now - sent_at < self._timeout:
                return
            logger.info("no answer to shard request %d; asking again", request_id)
            self._outstanding = None
        if now < self._retry_at:
            return
        target = self._prefetch * spec.shard_size
        if self._consumer_waiting:
            target = max(target, spec.shard_size)
        wanted = target - self._shared.queued.value
        if wanted <= 0:
            return
        request_id = self._next_request_id
        self._next_request_id += 1
        self._outstanding = (request_id, now)
        count = math.ceil(wanted / spec.shard_size)
        await self._send(FetchShards(request_id=request_id, count=count))

    async def _pump_acks(self, now: float) -> None:
        by_step: dict[int, list[int]] = {}
        for lease_id, (step, sent_at) in list(self._pending_acks.items()):
            if now - sent_at >= self._timeout:
                by_step.setdefault(step, []).append(lease_id)
                self._pending_acks[lease_id] = (step, now)
        for step, lease_ids in sorted(by_step.items()):
            await self._send(AckShards(lease_ids=sorted(lease_ids), step=step))

    async def _receive_loop(self, dealer: Dealer) -> None:
        while True:
            msg = await dealer.recv()
            if msg is None:
                continue
            try:
                self._on_message(msg, self.loop.time())
            except Exception:  # one odd message must not end the connection
                logger.exception("error handling %s from the supervisor", msg.TYPE)
            self._wake.set()

    def _on_message(self, msg: Message, now: float) -> None:
        if isinstance(msg, ShardGrant):
            self._on_grant(msg, now)
        elif isinstance(msg, AckDone):
            for lease_id in msg.lease_ids:
                self._pending_acks.pop(lease_id, None)
                self._held.discard(lease_id)
        elif isinstance(msg, Welcome):
            self._hello_at = None
            self._interval = msg.heartbeat_interval
        elif isinstance(msg, Rehello):
            if self._hello_at is not None and now - self._hello_at < self._timeout:
                return  # answers a message sent before our latest Hello
            logger.info(
                "the supervisor asks for a new Hello (it restarted); holding leases %s",
                sorted(self._held),
            )
            self._need_hello = True
            self._outbox.extend(self._sticky)
        elif isinstance(msg, (DatasetReady, PlacementReady)):
            self._on_answer(msg)
        elif isinstance(msg, (AdjustBatchSize, AdjustLR, Regroup)):
            self._shared.actions.put(msg)
        elif isinstance(msg, LeaveJob):
            # The reader leaves at its next step (Job._take_actions); one blocked
            # waiting for data has no next step: the End after the leases queued
            # so far ends its batches (it reads none of them: give_back_queued).
            self._shared.actions.put(msg)
            if not self._leaving:
                self._leaving = True
                self._shared.items.put(End())
        elif isinstance(msg, RegroupGo):
            self._shared.regroup_go.put(msg)
        elif isinstance(msg, (RnaProbe, RnaStart, RnaGroup, RnaOpenStore, RnaLeft)):
            self._shared.rna.put(msg)
        elif not isinstance(msg, Ping):
            logger.debug("ignoring %s from the supervisor", msg.TYPE)

    def _on_answer(self, msg: Message) -> None:
        ask = self._asks.pop(msg.TYPE, None)
        if ask is None or ask.future.done():
            return  # an answer to a question re-sent after the first answer
        ask.future.set_result(msg)

    def _on_grant(self, msg: ShardGrant, now: float) -> None:
        if self._outstanding is not None and self._outstanding[0] == msg.request_id:
            self._outstanding = None
        spec = self._spec
        if spec is None:
            logger.warning("shard grant before the data set is known; ignored")
            return
        for lease in msg.leases:
            if lease.lease_id in self._seen:
                continue  # a grant we already had (answers to re-sent requests)
            self._seen.add(lease.lease_id)
            if not lease_fits(spec, lease):
                logger.error("lease %r does not fit the data set %s; ignored", lease, spec)
                continue
            if self._leaving:  # asked for before the worker left
                self.release(
                    [lease.lease_id], self._leaving_at, self._leave_reason(self._leaving_at)
                )
                continue
            self._held.add(lease.lease_id)
            self._shared.queued.add(lease.end - lease.start)
            self._shared.items.put(lease)
        if msg.finished:
            if not self._finished:
                self._finished = True
                self._shared.items.put(End())
        elif not msg.leases:
            self._retry_at = now + max(MIN_RETRY_S, msg.retry_after)
