"""A worker's connection to the supervisor's DDS: one daemon thread, one asyncio loop.

All socket I/O happens in that thread (``runtime.link.SupervisorLink``, which
also documents the protocol); the training thread talks to it only through
thread-safe queues and ``call_soon_threadsafe``, so ``step()`` never waits on the
network and ``next_lease()`` waits only when the prefetched leases have run out.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from dtlaunch.errors import ConfigError, DtlaunchError
from dtlaunch.runtime.data import NOT_READY, NotReady
from dtlaunch.runtime.link import Ask, Connection, End, Failed, Item, Shared, SupervisorLink
from dtlaunch.runtime.steps import REPORT_EVERY_S, TimedReport
from dtlaunch.sharding import DatasetSpec, dataset_spec
from dtlaunch.wire.messages import (
    DatasetInfo,
    DatasetReady,
    Lease,
    Message,
    PlacementReady,
    PsPlacementMap,
    RegisterDataset,
    RegisterPlacement,
    RegroupGo,
)

__all__ = ["NO_DATASET", "Connection", "SupervisorClient"]

logger = logging.getLogger(__name__)

WAIT_WARNING_S = 30.0  # log while the training thread waits this long for shards
THREAD_JOIN_MARGIN_S = 5.0

NO_DATASET = (
    "the job has no data set: pass dataset_size= and shard_size= to dtlaunch.init(), "
    "or --dataset-size and --shard-size to dtlaunch run"
)


class SupervisorClient:
    """A ``LeaseSource`` backed by the supervisor; see the module docstring."""

    def __init__(
        self,
        conn: Connection,
        *,
        prefetch: int,
        joining: bool = False,
        report_every_s: float = REPORT_EVERY_S,
    ) -> None:
        self._conn = conn
        self._shared = Shared()
        # A replacement waiting to join has its own identity: the worker it
        # replaces is still connected under its own. The attempt is part of a
        # worker's identity (see dtlaunch.supervisor.jobstate.workers).
        identity = (
            b"join:%d" % conn.rank if joining else b"worker:%d@%d" % (conn.rank, conn.attempt)
        )
        self._link = SupervisorLink(
            conn, self._shared, prefetch=prefetch, identity=identity, report_every_s=report_every_s
        )
        self._negotiated: DatasetSpec | None = None  # negotiate()'s answer
        self._ended = False  # END or a failure was taken
        self._closed = False
        self._thread = threading.Thread(
            target=self._link.run, name=f"dtlaunch-runtime-{conn.rank}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------- training thread

    def negotiate(self, request: DatasetInfo | None, timeout: float) -> DatasetSpec:
        """The job's data set: register ``request``, or ask for it when None.

        Raises:
            ConfigError: the supervisor refused (mismatch), has no data set, or did
                not answer within ``timeout`` seconds.
        """
        msg: Message = (
            DatasetReady(dataset=None) if request is None else RegisterDataset(dataset=request)
        )
        answer = self._ask(msg, DatasetReady, timeout)
        assert isinstance(answer, DatasetReady)
        if answer.error:
            raise ConfigError(answer.error)
        if answer.dataset is None:
            raise ConfigError(NO_DATASET)
        self._negotiated = dataset_spec(answer.dataset).validate()
        return self._negotiated

    def negotiate_placement(
        self, offer: PsPlacementMap, timeout: float
    ) -> tuple[PsPlacementMap, list[str]]:
        """The job's PS block placement: register ``offer``, get the map to follow
        and where its servers listen (empty when the supervisor does not know all).

        Raises:
            ConfigError: the supervisor refused (another model) or did not answer.
        """
        answer = self._ask(RegisterPlacement(placement=offer), PlacementReady, timeout)
        assert isinstance(answer, PlacementReady)
        if answer.error or answer.placement is None:
            raise ConfigError(answer.error or "the supervisor has no placement map")
        return answer.placement, list(answer.endpoints)

    def start_fetching(self) -> None:
        """Begin prefetching shards (after ``negotiate``, once the script accepted them)."""
        if self._negotiated is None:
            raise RuntimeError("start_fetching() before negotiate()")
        self._call(self._link.begin_fetching, self._negotiated)

    def _ask(self, msg: Message, answer: type[Message], timeout: float) -> Message:
        """Send ``msg`` (again after each request timeout) until an ``answer`` comes."""
        future: concurrent.futures.Future[Message] = concurrent.futures.Future()
        if self._link.failure is not None:
            raise self._link.failure
        self._call(self._link.start_ask, answer.TYPE, Ask(msg=msg, future=future))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise ConfigError(
                f"the supervisor at {self._conn.endpoint} did not answer within {timeout:.0f}s. "
                "Fix: check that dtlaunch run is running and that DTLAUNCH_SUPERVISOR and "
                "DTLAUNCH_KEYS are the ones it set"
            ) from None

    def next_lease(self) -> Lease | None:
        if self._ended:
            return None
        try:
            item = self._shared.items.get_nowait()
        except queue.Empty:
            self._call(self._link.set_consumer_waiting)
            item = self._wait_for_item()
        return self._take(item)

    def poll_lease(self, timeout: float) -> Lease | NotReady | None:
        """A lease if one arrives within ``timeout`` s; ``NOT_READY`` if none did."""
        if self._ended:
            return None
        try:
            item = self._shared.items.get_nowait()
        except queue.Empty:
            self._call(self._link.set_consumer_waiting)
            try:
                item = self._shared.items.get(timeout=timeout)
            except queue.Empty:
                return NOT_READY
        return self._take(item)

    def _take(self, item: Item) -> Lease | None:
        if isinstance(item, End):
            self._ended = True
            return None
        if isinstance(item, Failed):
            self._ended = True
            if isinstance(item.error, DtlaunchError):
                raise item.error
            raise RuntimeError(f"the connection to the supervisor failed: {item.error!r}")
        # The loop thread shrinks the queue and clears "waiting" in one callback:
        # done here, its fetch pump could read the consumer as still waiting and
        # the queue as already empty, and fetch a shard nobody asked for.
        self._call(self._link.lease_taken, item.end - item.start)
        return item

    def ack(self, lease_ids: Sequence[int], step: int) -> None:
        self._call(self._link.add_acks, list(lease_ids), step)

    def release(self, lease_ids: Sequence[int], step: int) -> None:
        self._call(self._link.release, list(lease_ids), step)

    def give_back_queued(self, step: int) -> None:
        self._call(self._link.give_back_queued, step)

    def report(self, reports: list[TimedReport]) -> None:
        # No wake-up of the link thread per step: it sends every report interval.
        self._link.hand_reports(reports)

    def flush_reports(self) -> None:
        self._call(self._link.flush_reports)

    def send(self, msg: Message, *, repeat_on_rehello: bool = False) -> None:
        """Send a notice (``Attached``, ``RegroupReady``) after our Hello; with
        ``repeat_on_rehello`` also to a supervisor that restarted (it forgot)."""
        self._call(self._link.queue_send, msg, repeat_on_rehello)

    def wait_regroup_go(self, gen: int, timeout: float) -> RegroupGo:
        """Block until the supervisor says where generation ``gen`` meets.

        Raises:
            TimeoutError: no answer within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                go = self._shared.regroup_go.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(
                    f"the supervisor did not say where regroup generation {gen} meets "
                    f"within {timeout:.0f}s"
                ) from None
            if go.gen == gen or gen == 0:  # 0: whichever comes (a waiting replacement)
                return go

    @property
    def rna_inbox(self) -> queue.Queue[object]:
        """RNA's messages from the supervisor, for the communication thread
        (``dtlaunch.runtime.rna``), which also wakes itself through it."""
        return self._shared.rna

    def actions(self) -> list[Message]:
        taken: list[Message] = []
        while True:
            try:
                taken.append(self._shared.actions.get_nowait())
            except queue.Empty:
                return taken

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for acks to be confirmed, then close the socket."""
        if self._closed:
            return
        self._closed = True
        self._call(self._link.begin_close, timeout)
        self._thread.join(timeout + THREAD_JOIN_MARGIN_S)
        if self._thread.is_alive():
            logger.warning("the dtlaunch runtime thread did not stop; leaving it (daemon)")

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._link.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the thread ended (failed or closed)
            logger.debug("runtime thread gone; %s dropped", fn.__name__)

    def _wait_for_item(self) -> Item:
        waited = 0.0
        while True:
            try:
                return self._shared.items.get(timeout=WAIT_WARNING_S)
            except queue.Empty:
                waited += WAIT_WARNING_S
                if not self._thread.is_alive():
                    return Failed(RuntimeError("the dtlaunch runtime thread ended"))
                logger.warning(
                    "rank %d has waited %.0fs for data shards from the supervisor at %s",
                    self._conn.rank,
                    waited,
                    self._conn.endpoint,
                )
