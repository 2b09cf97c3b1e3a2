"""``dtlaunch run --metrics-port``: the live job as a Prometheus/OpenMetrics endpoint.

What is exposed is what ``dtlaunch status`` shows (the ``StatusTracker``'s
snapshot: progress, per-node BPT, batch size, throughput, restarts, stragglers),
plus what only the node table, the shard queue and the Controller count
(failures, queue depths, records, policy actions), read at scrape time: no
metric is bookkept twice. The WAL's fsync latency is the one metric observed as
it happens (a histogram the WAL is handed as a plain callback), and the
supervisor's own CPU and memory come from prometheus_client's
``ProcessCollector``. Every job has its own ``CollectorRegistry``, never the
library's global one.

Thread safety: the HTTP server answers in its own threads, while the job's
state is plain Python objects that only the asyncio loop changes. Reading them
from another thread could see a dict change size mid-iteration, or a half-done
update. So a scrape does not read them itself: it asks the loop to build an
immutable ``JobReading`` (``loop.call_soon_threadsafe``) and waits for it at
most ``READ_TIMEOUT_S``. The loop builds it between two of its own steps,
which makes the reading consistent, with no lock added to the job. A loop too
busy to answer in time costs that scrape the job's metrics (the process
metrics and the loop lag still come), never a stuck HTTP thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, make_wsgi_app
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)

from dtlaunch.config import JobSpec
from dtlaunch.errors import ConfigError
from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.control.actions import (
    AdjustBatchSize,
    AdjustLR,
    BackupWorkers,
    KillRestart,
)
from dtlaunch.supervisor.control.controller import Controller
from dtlaunch.supervisor.dds.queue import ShardQueue
from dtlaunch.supervisor.dds.service import DdsService
from dtlaunch.supervisor.jobstate.machine import JobState, Phase
from dtlaunch.supervisor.rundir import RunDir, write_json_atomic
from dtlaunch.supervisor.status.tracker import StatusTracker
from dtlaunch.version import __version__
from dtlaunch.wire.messages import StatusSnapshot

log = logging.getLogger(__name__)

PREFIX = "dtlaunch"
METRICS_FILE = "metrics.json"  # in the run directory: where the endpoint listens
DEFAULT_ADDRESS = "127.0.0.1"  # without --bind: the endpoint has no authentication
READ_TIMEOUT_S = 2.0  # a scrape waits this long for the loop (Prometheus allows 10 s)
REQUEST_TIMEOUT_S = 10.0  # an idle or slow HTTP client is dropped after this
SHUTDOWN_TIMEOUT_S = 5.0  # serve_forever notices a shutdown within its 0.5 s poll
# fsync of a group commit: tens of microseconds on tmpfs/NVMe, tens of ms on disks.
FSYNC_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
# Zero from the start, so that increase() sees the first action of each kind.
POLICY_ACTIONS = tuple(a.NAME for a in (AdjustBatchSize, AdjustLR, BackupWorkers, KillRestart))


# ------------------------------------------------------------------ reading


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepths:
    """The shard queue: every shard of every epoch is in exactly one of these."""

    todo: int  # TODO, epochs not started yet included
    leased: int  # DOING: held by a worker
    done: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobReading:
    """The job at one instant of the loop, as plain values any thread may read."""

    status: StatusSnapshot  # what ``dtlaunch status`` would show now
    samples_trained: int  # samples the workers reported trained (re-runs included)
    records_done: int  # records in DONE shards
    records_planned: int  # records over all epochs (0: no data sharding)
    queue: QueueDepths | None  # None: no data set registered (yet)
    failures: dict[tuple[str, int], int]  # (role, rank) -> failures, as the node table counts
    actions: dict[str, int] | None  # policy actions by kind; None: --policy none


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveJob:
    """The supervisor's own objects the readings are built from (loop thread only)."""

    state: JobState
    status: StatusTracker
    dds: DdsService
    controller: Controller | None
    clock: Callable[[], float] = time.monotonic  # the supervisor's clock

    def read(self) -> JobReading:
        """A reading of the job now; call on the loop that runs the job."""
        snapshot = self.status.snapshot(
            state=self.state, dds=self.dds, controller=self.controller, now=self.clock()
        )
        queue, spec = self.dds.queue, self.dds.spec
        depths = (
            QueueDepths(todo=queue.todo_count, leased=queue.doing_count, done=queue.done_count)
            if queue is not None
            else None
        )
        failures = Counter((f.role, f.rank) for f in self.state.failures)
        return JobReading(
            status=snapshot,
            samples_trained=self.status.fold.samples_total,
            records_done=records_done(queue) if queue is not None else 0,
            records_planned=spec.dataset_size * spec.epochs if spec is not None else 0,
            queue=depths,
            failures=dict(failures),
            actions=dict(self.controller.counts) if self.controller is not None else None,
        )


def records_done(queue: ShardQueue) -> int:
    """Records in the queue's DONE shards, exactly.

    Every shard holds ``shard_size`` records but the last of each epoch, which may
    hold fewer. Whether that one is DONE is known for free in a complete epoch;
    in an epoch under way it is DONE when it is neither TODO nor leased.
    """
    spec = queue.spec
    last = spec.num_shards - 1
    shortfall = spec.shard_size - spec.shard_length(last)
    records = queue.done_count * spec.shard_size
    if shortfall == 0:
        return records
    under_way = []
    for epoch, (done, shards) in enumerate(queue.epoch_progress):
        if done == shards:
            records -= shortfall
        elif done:
            under_way.append(epoch)
    if under_way:
        pending = set(queue.queued())
        for worker in queue.fetched_by_worker:
            pending.update((lease.epoch, lease.shard) for lease in queue.leases_of(worker))
        records -= shortfall * sum((epoch, last) not in pending for epoch in under_way)
    return records


# ----------------------------------------------------------------- families


def job_families(reading: JobReading) -> list[Metric]:
    """The Prometheus metric families of one reading (pure: no I/O, no clock)."""
    status = reading.status
    progress = _progress_families(reading)
    nodes = _node_families(status)
    processes = GaugeMetricFamily(
        f"{PREFIX}_job_processes",
        "Workers and servers by the node table's state.",
        labels=["role", "state"],
    )
    for (role, state), count in sorted(
        Counter((n.role, n.proc_state) for n in status.nodes).items()
    ):
        processes.add_metric([role, state], count)
    phase = StateSetMetricFamily(f"{PREFIX}_job_phase", "The job's phase (one is 1).", labels=[])
    phase.add_metric([], {p.value: p.value == status.phase for p in Phase})
    failures = CounterMetricFamily(
        f"{PREFIX}_failures",
        "Failures (a process that ended badly) of a worker or server rank.",
        labels=["role", "rank"],
    )
    # Every node from the start at 0, so that increase() sees its first failure.
    counts = {(n.role, n.rank): 0 for n in status.nodes} | reading.failures
    for (role, rank), count in sorted(counts.items()):
        failures.add_metric([role, str(rank)], count)
    families: list[Metric] = [*progress, *nodes, processes, phase, failures]
    if reading.actions is not None:
        actions = CounterMetricFamily(
            f"{PREFIX}_policy_actions",
            "Actions the straggler policy took, by kind (AntDT Table II).",
            labels=["action"],
        )
        for name in sorted(set(POLICY_ACTIONS) | set(reading.actions)):
            actions.add_metric([name], reading.actions.get(name, 0))
        families.append(actions)
    return families


def _progress_families(reading: JobReading) -> list[Metric]:
    status = reading.status
    families: list[Metric] = [
        GaugeMetricFamily(
            f"{PREFIX}_job_shards_done",
            "Data shards DONE, over all epochs.",
            value=status.shards_done,
        ),
        GaugeMetricFamily(
            f"{PREFIX}_job_shards_planned",
            "Data shards of all epochs (0: the job uses no data sharding).",
            value=status.shards_total,
        ),
        GaugeMetricFamily(
            f"{PREFIX}_job_records_done",
            "Records in DONE shards, over all epochs.",
            value=reading.records_done,
        ),
        GaugeMetricFamily(
            f"{PREFIX}_job_records_planned",
            "Records of all epochs: data set size x epochs (0: no data sharding).",
            value=reading.records_planned,
        ),
        CounterMetricFamily(
            f"{PREFIX}_job_samples_trained",
            "Samples the workers reported trained, re-runs of released shards included.",
            value=reading.samples_trained,
        ),
        GaugeMetricFamily(
            f"{PREFIX}_job_samples_per_second",
            "Samples per second of all workers over the last seconds, in wall time "
            "(waits included).",
            value=status.throughput,
        ),
    ]
    if status.eta_s is not None:
        families.append(
            GaugeMetricFamily(
                f"{PREFIX}_job_eta_seconds",
                "Seconds until every shard is DONE at the recent rate.",
                value=status.eta_s,
                unit="seconds",
            )
        )
    if reading.queue is not None:
        depths = GaugeMetricFamily(
            f"{PREFIX}_dds_queue_shards",
            "Shards by queue state: todo (epochs not started included), leased, done.",
            labels=["state"],
        )
        depths.add_metric(["todo"], reading.queue.todo)
        depths.add_metric(["leased"], reading.queue.leased)
        depths.add_metric(["done"], reading.queue.done)
        families.append(depths)
    return families


def _node_families(status: StatusSnapshot) -> list[Metric]:
    bpt = GaugeMetricFamily(
        f"{PREFIX}_worker_bpt_seconds",
        "A worker's recent mean batch processing time (compute + communication per step).",
        labels=["rank"],
        unit="seconds",
    )
    batch = GaugeMetricFamily(
        f"{PREFIX}_worker_batch_size",
        "A worker's local batch size in its latest step (samples).",
        labels=["rank"],
    )
    rate = GaugeMetricFamily(
        f"{PREFIX}_worker_samples_per_second",
        "A worker's recent samples per second of its own step time (0 when it is silent).",
        labels=["rank"],
    )
    shards = GaugeMetricFamily(
        f"{PREFIX}_worker_shards_done",
        "Shards a worker's acknowledgements made DONE (its share of the data).",
        labels=["rank"],
    )
    update = GaugeMetricFamily(
        f"{PREFIX}_server_update_seconds",
        "A parameter server's recent mean time to apply one update.",
        labels=["rank"],
        unit="seconds",
    )
    restarts = CounterMetricFamily(
        f"{PREFIX}_restarts",
        "Restarts of a worker or server rank.",
        labels=["role", "rank"],
    )
    straggler = GaugeMetricFamily(
        f"{PREFIX}_straggler",
        "1 while the Monitor (or, with --policy none, the BPT ratio) counts the node "
        "as a straggler.",
        labels=["role", "rank"],
    )
    for node in status.nodes:
        rank = str(node.rank)
        if node.role == "worker":
            if node.bpt_s > 0:  # absent until it reports: a 0 would drag averages down
                bpt.add_metric([rank], node.bpt_s)
            if node.batch_size > 0:
                batch.add_metric([rank], node.batch_size)
            rate.add_metric([rank], node.throughput)
            shards.add_metric([rank], node.shards_done)
        elif node.bpt_s > 0:
            update.add_metric([rank], node.bpt_s)
        restarts.add_metric([node.role, rank], node.restarts)
        straggler.add_metric([node.role, rank], 1 if node.straggler else 0)
    return [bpt, batch, rate, shards, update, restarts, straggler]


# ---------------------------------------------------------------- collector


class JobCollector:
    """Reads the job on its loop at each scrape; see the module doc for why."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        run_id: str,
        policy: str,
        mode: str,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._loop = loop
        self._info = {"run_id": run_id, "policy": policy, "mode": mode, "version": __version__}
        self._read_timeout_s = read_timeout_s
        self._job: LiveJob | None = None  # set once on the loop; a reference swap is atomic

    def watch(self, job: LiveJob) -> None:
        """Serve ``job``'s metrics from now on (before: only the job's info)."""
        self._job = job

    def collect(self) -> Iterable[Metric]:
        info = InfoMetricFamily(f"{PREFIX}_job", "The job this supervisor runs.", value=self._info)
        yield info
        job = self._job
        if job is None:
            return
        began = time.monotonic()
        reading = self._read_on_loop(job)
        lag = time.monotonic() - began
        yield GaugeMetricFamily(
            f"{PREFIX}_supervisor_loop_lag_seconds",
            "How long this scrape waited for the supervisor's event loop to read the job.",
            value=lag,
            unit="seconds",
        )
        if reading is not None:
            yield from job_families(reading)

    def _read_on_loop(self, job: LiveJob) -> JobReading | None:
        with contextlib.suppress(RuntimeError):  # no loop running in this thread
            if asyncio.get_running_loop() is self._loop:
                return job.read()  # already on the loop (a test's direct scrape)

        # Not run_coroutine_threadsafe: its task would still run after a timed-out
        # scrape cancelled it. A future that is only started if nobody cancelled it
        # first spares a busy loop the reading nobody waits for any more.
        future: concurrent.futures.Future[JobReading] = concurrent.futures.Future()

        def read() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(job.read())
            except Exception as err:
                future.set_exception(err)

        try:
            self._loop.call_soon_threadsafe(read)
        except RuntimeError:  # the loop has closed: the job is over
            return None
        try:
            return future.result(timeout=self._read_timeout_s)
        except TimeoutError:
            future.cancel()
            log.warning(
                "metrics: the supervisor's loop did not answer within %.1f s; this scrape "
                "has no job metrics",
                self._read_timeout_s,
            )
        except Exception:  # a bug in a reading must cost one scrape, not the endpoint
            log.exception("metrics: reading the job failed")
        return None


# ------------------------------------------------------------------- server


class _MetricsServer(ThreadingMixIn, WSGIServer):
    """One thread per request, as prometheus_client's own server; daemon threads,
    so a request still running at the job's end never holds the process."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # socket timeout: an idle client cannot hold a thread

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes come every few seconds: not worth a log line each."""


class MetricsEndpoint:
    """An HTTP server for one registry, in a daemon thread; ``close`` stops it."""

    def __init__(self, registry: CollectorRegistry, *, address: str, port: int) -> None:
        """Bind ``address:port`` (port 0: a free one) and start serving.

        Raises:
            ConfigError: the address or port cannot be bound, naming why and the fix.
        """
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(
                address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]

            class Server(_MetricsServer):
                address_family = family  # an IPv6 --bind needs an IPv6 socket

            self._server = make_server(
                str(sockaddr[0]), port, make_wsgi_app(registry), Server, _QuietHandler
            )
        except OSError as err:
            raise ConfigError(_bind_error(address, port, err)) from None
        self.address = address
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"metrics-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host = socket.gethostname() if self.address in ("0.0.0.0", "::") else self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and close the listening socket; blocks about half a second.

        ``serve_forever`` looks for the shutdown every 0.5 s and never runs a
        request itself (each has its own thread), so the wait is bounded.
        """
        self._server.shutdown()
        self._thread.join(SHUTDOWN_TIMEOUT_S)
        self._server.server_close()


def _bind_error(address: str, port: int, err: OSError) -> str:
    where = f"{address}:{port}"
    if isinstance(err, socket.gaierror):
        return (
            f"--metrics-port {port}: cannot serve metrics on {address!r} ({err.strerror}); "
            "the endpoint binds the address of --bind: give --bind an IP address"
        )
    if err.errno == errno.EADDRINUSE:
        return (
            f"--metrics-port {port}: {where} is already in use (another exporter or job?); "
            "pass a free port, or --metrics-port 0 for any free one (the port chosen is in "
            f"the run directory's {METRICS_FILE})"
        )
    if err.errno in (errno.EACCES, errno.EPERM):
        return (
            f"--metrics-port {port}: not allowed to bind {where} ({err.strerror}); ports below "
            "1024 need privileges: pass a port of 1024 or more, or 0 for any free one"
        )
    return (
        f"--metrics-port {port}: cannot bind {where} ({err.strerror or err}); pass another "
        "port, or 0 for any free one"
    )


def metrics_address(bind: str) -> str:
    """The address of the supervisor's ``--bind`` (``*`` and brackets resolved), or
    loopback without one: scrapes carry no key, so only --bind opens them to others."""
    if not bind:
        return DEFAULT_ADDRESS
    host = bind.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    return "0.0.0.0" if host == "*" else host


# -------------------------------------------------------------------- job


class JobMetrics:
    """A job's registry, collector and endpoint, as ``job.py`` wires them in."""

    def __init__(self, spec: JobSpec, loop: asyncio.AbstractEventLoop, port: int) -> None:
        """Start serving (the job's metrics come once ``watch`` is called).

        Raises:
            ConfigError: the port cannot be bound.
        """
        self.registry = CollectorRegistry()
        self.collector = JobCollector(loop, run_id=spec.run_id, policy=spec.policy, mode=spec.mode)
        self.registry.register(self.collector)
        ProcessCollector(namespace=PREFIX, registry=self.registry)  # CPU seconds, RSS, fds
        self._fsync = Histogram(
            "wal_fsync_seconds",
            "Seconds the data-sharding WAL's group commit spent in fsync.",
            namespace=PREFIX,
            buckets=FSYNC_BUCKETS_S,
            registry=self.registry,
        )
        self.endpoint = MetricsEndpoint(
            self.registry, address=metrics_address(spec.bind), port=port
        )

    def observe_wal_fsync(self, seconds: float) -> None:
        """The WAL's fsync observer; called in the WAL's sync thread (thread-safe)."""
        self._fsync.observe(seconds)

    def announce(self, run: RunDir, recorder: EventRecorder) -> None:
        """Say where the endpoint listens: ``metrics.json`` and a ``metrics_serving`` event."""
        url, address, port = self.endpoint.url, self.endpoint.address, self.endpoint.port
        write_json_atomic(run.path / METRICS_FILE, {"url": url, "address": address, "port": port})
        recorder.emit("metrics_serving", url=url, address=address, port=port)
        log.info("serving metrics on %s", url)

    def watch(self, job: LiveJob) -> None:
        self.collector.watch(job)


@contextlib.asynccontextmanager
async def serve_metrics(spec: JobSpec) -> AsyncIterator[JobMetrics | None]:
    """The job's metrics endpoint while the block runs (None without --metrics-port).

    Bound first thing, so that a port in use stops the job before anything exists;
    stopped when the block ends, however it ends.

    Raises:
        ConfigError: the port cannot be bound.
    """
    if spec.metrics_port is None:
        yield None
        return
    metrics = JobMetrics(spec, asyncio.get_running_loop(), spec.metrics_port)
    try:
        yield metrics
    finally:
        # In a thread: the shutdown waits up to a poll interval, the loop must not.
        await asyncio.to_thread(metrics.endpoint.close)
