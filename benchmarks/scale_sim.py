"""Simulated agents and workers for ``benchmarks/scale.py``: light coroutines that
speak dtlaunch's real wire protocol (ZeroMQ + CURVE, the real codec and messages)
to a real supervisor, so that one supervisor can be measured against 1,000 hosts on
one machine.

One simulator process carries many hosts. It reads one ``AgentBootstrap`` per line
on stdin (``scale.py``'s launcher writes them as the supervisor starts agents) and
answers for that host the way ``dtlaunch.agent`` does: ``Hello`` with free ports,
heartbeats with a ``ProcReport`` per process, ``Spawned``/``Exited`` for the
workers it is told to start or stop, ``Bye`` on ``Shutdown``. Each simulated worker
has its own DEALER under its real identity (``worker:<rank>@<attempt>``) and does
what the SDK's link does: ``Hello``, the data set, ``FetchShards`` with prefetch,
``AckShards`` after the step that used a lease's last record, ``StepReports``
every ``REPORT_EVERY_S`` (at most ``REPORT_MAX_STEPS`` steps a message), ``Ping``
after a heartbeat interval without another message, and it
applies ``AdjustBatchSize`` at the step the plan names.

Two paces:

* ``--rate R`` (steps per second per worker): one ticker advances every worker one
  step per 1/R s (one timer for all, not one per worker), so the simulator's own
  cost stays small beside the supervisor's;
* ``--rate 0``: the DDS stress: each worker fetches and acknowledges leases as fast
  as the supervisor grants and confirms them.

Written to stdout, one line each: ``exit <host>`` when a host's agent has said Bye,
and at the end ``stats <json>``. With ``--send-log FILE``, every StepReports sent is
logged as (rank, last step, monotonic send time) in a ``.npy`` file, for
report-to-decision latency (CLOCK_MONOTONIC is one clock for every process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from dtlaunch.agent.agent import peer_keys_of
from dtlaunch.runtime.steps import REPORT_EVERY_S, REPORT_MAX_STEPS
from dtlaunch.version import __version__
from dtlaunch.wire.codec import decode, from_dict
from dtlaunch.wire.messages import (
    AckDone,
    AckShards,
    AdjustBatchSize,
    AgentBootstrap,
    AgentHeartbeat,
    Bye,
    DatasetInfo,
    DatasetReady,
    Exited,
    FetchShards,
    Hello,
    Kill,
    Message,
    Ping,
    ProcReport,
    RegisterDataset,
    Rehello,
    ShardGrant,
    Shutdown,
    Spawn,
    Spawned,
    StepReport,
    StepReports,
    Welcome,
)
from dtlaunch.wire.messages.base import PROTOCOL_VERSION
from dtlaunch.wire.sockets import Dealer

FAKE_PORTS = list(range(41000, 41008))
_FIELDS: dict[type, tuple[str, ...]] = {}
_DECODED: dict[bytes, Message] = {}  # big frames many workers get alike (a batch plan)


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELDS.get(type(value))
        if names is None:
            names = _FIELDS[type(value)] = tuple(f.name for f in dataclasses.fields(value))
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


async def send(dealer: Dealer, msg: Message) -> bool:
    """Like ``Dealer.send`` without the codec's check of our own messages: the
    simulator's CPU is not what is measured, the supervisor still checks every
    frame it receives."""
    body = _plain(msg)
    assert isinstance(body, dict)
    body.update(t=msg.TYPE, v=PROTOCOL_VERSION)
    return await dealer.send_frame(msgpack.packb(body, use_bin_type=True))


async def recv(dealer: Dealer) -> Message | None:
    """``Dealer.recv``, decoding a big frame once for every worker that gets it: in a
    real job each worker decodes its copy on its own core."""
    payload = await dealer.recv_frame()
    if payload is None:
        return None
    if len(payload) < 1024:
        return decode(payload)
    msg = _DECODED.get(payload)
    if msg is None:
        _DECODED.clear()
        msg = _DECODED[payload] = decode(payload)
    return msg


PREFETCH_SHARDS = 2
REQUEST_TIMEOUT_S = 10.0  # re-ask a fetch the supervisor has not answered


@dataclass(slots=True)
class Stats:
    """Counters of one simulator process, summed by ``scale.py``."""

    steps: int = 0
    reports_sent: int = 0
    leases_granted: int = 0
    leases_acked: int = 0  # confirmed DONE by AckDone
    fetches: int = 0
    empty_grants: int = 0
    starved_ticks: int = 0  # a worker had no record to train at its tick
    plans_applied: int = 0
    send_failures: int = 0
    rehellos: int = 0
    cpu_s: float = 0.0  # this simulator's CPU time: is it the bottleneck?
    wall_s: float = 0.0
    tick_late_max_s: float = 0.0  # how late the ticker ran at worst (an overloaded simulator)
    tick_late_over_1s: int = 0


@dataclass(slots=True)
class Config:
    rate: float
    batch: int
    compute_s: float
    dataset: DatasetInfo
    slow_ranks: frozenset[int]
    slow_factor: float
    fetch_count: int


@dataclass(slots=True)
class SimWorker:
    """One worker as the supervisor sees it: its identity, leases and steps."""

    rank: int
    attempt: int
    host: str
    run_id: str
    dealer: Dealer
    cfg: Config
    stats: Stats
    batch: int
    step: int = 0
    welcomed: bool = False
    dataset_ok: bool = False
    leases: list[list[int]] = field(default_factory=list)  # [lease_id, records left]
    queued: int = 0
    fetch_sent_at: float | None = None
    retry_at: float = 0.0
    pending_reports: list[StepReport] = field(default_factory=list)
    reported_at: float = field(default_factory=time.monotonic)  # last StepReports sent
    unconfirmed: set[int] = field(default_factory=set)
    plan: tuple[int, int] | None = None  # (apply_at_step, batch)
    next_ping: float = 0.0
    ping_every_s: float = 1.0  # the run's heartbeat interval, from the Welcome
    ping_seq: int = 0
    stopped: bool = False
    finished: bool = False
    started_at: float = field(default_factory=time.monotonic)
    receiver: asyncio.Task[None] | None = None

    @property
    def proc_id(self) -> str:
        return f"worker-{self.rank}"

    async def send(self, msg: Message) -> None:
        if not await send(self.dealer, msg):
            self.stats.send_failures += 1
            return
        # As the SDK's link: any message says "alive"; a ping only after an
        # interval without one.
        self.next_ping = time.monotonic() + self.ping_every_s

    async def hello(self) -> None:
        await self.send(
            Hello(
                role="worker",
                run_id=self.run_id,
                host=self.host,
                pid=os.getpid(),
                version=__version__,
                rank=self.rank,
                attempt=self.attempt,
                leases=sorted(self.unconfirmed | {lease for lease, _ in self.leases}),
            )
        )
        await self.send(RegisterDataset(dataset=self.cfg.dataset))

    async def fetch(self, now: float) -> None:
        """Keep PREFETCH_SHARDS shards' worth of records queued, one request at a time."""
        if not self.dataset_ok or self.finished or self.stopped:
            return
        if self.fetch_sent_at is not None and now - self.fetch_sent_at < REQUEST_TIMEOUT_S:
            return
        if now < self.retry_at:
            return
        shard = self.cfg.dataset.shard_size
        wanted = PREFETCH_SHARDS * shard - self.queued
        if wanted <= 0:
            return
        count = max(1, -(-wanted // shard))
        if self.cfg.fetch_count:
            count = self.cfg.fetch_count
        self.fetch_sent_at = now
        self.stats.fetches += 1
        await self.send(FetchShards(request_id=self.stats.fetches, count=count))

    def on_grant(self, grant: ShardGrant, now: float) -> None:
        self.fetch_sent_at = None
        known = {lease for lease, _ in self.leases} | self.unconfirmed
        for lease in grant.leases:
            if lease.lease_id in known:
                continue
            self.leases.append([lease.lease_id, lease.end - lease.start])
            self.queued += lease.end - lease.start
            self.stats.leases_granted += 1
        if not grant.leases:
            self.stats.empty_grants += 1
            self.finished = grant.finished
            self.retry_at = now + max(grant.retry_after, 0.05)

    def train_step(self, now: float) -> tuple[list[int], StepReports | None]:
        """One step: take up to ``batch`` records; return the leases it finished and,
        as the SDK does (every REPORT_EVERY_S, at most REPORT_MAX_STEPS steps a
        message), the reports to send."""
        if self.plan is not None and self.step + 1 >= self.plan[0]:
            self.batch = self.plan[1]
            self.plan = None
            self.stats.plans_applied += 1
        if self.queued <= 0:
            self.stats.starved_ticks += 1
            return [], None
        take = min(self.batch, self.queued)
        done: list[int] = []
        left = take
        while left > 0:
            lease = self.leases[0]
            used = min(left, lease[1])
            lease[1] -= used
            left -= used
            if lease[1] == 0:
                done.append(lease[0])
                self.leases.pop(0)
        self.queued -= take
        self.step += 1
        self.stats.steps += 1
        slow = self.cfg.slow_factor if self.rank in self.cfg.slow_ranks else 1.0
        compute = self.cfg.compute_s * slow * take / max(1, self.cfg.batch)
        compute *= random.uniform(0.95, 1.05)
        self.pending_reports.append(
            StepReport(step=self.step, batch_size=self.batch, compute_s=compute, samples=take)
        )
        due = now - self.reported_at >= REPORT_EVERY_S
        if len(self.pending_reports) < REPORT_MAX_STEPS and not due:
            return done, None
        reports, self.pending_reports = self.pending_reports, []
        self.reported_at = now
        return done, StepReports.of(reports)


class Simulator:
    """Every simulated host of this process, and the ticker that moves their workers."""

    def __init__(self, cfg: Config, send_log: Path | None) -> None:
        self.cfg = cfg
        self.ctx = zmq.asyncio.Context()
        # Two sockets a host (agent and worker): past libzmq's default of 1,023
        # sockets a context at 512 hosts per simulator.
        self.ctx.set(zmq.MAX_SOCKETS, 16_384)
        self.stats = Stats()
        self.workers: dict[tuple[str, int], SimWorker] = {}
        self.hosts: dict[str, SimHost] = {}
        self.send_log = send_log
        self.sent: list[tuple[int, int, float]] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.heartbeat_s = 1.0  # until a Welcome says the run's interval
        self.started = time.monotonic()

    def spawn_task(self, coro: object, name: str) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        task.set_name(name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def read_bootstraps(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            boot = from_dict(AgentBootstrap, json.loads(line))
            host = SimHost(self, boot)
            self.hosts[boot.host] = host
            self.spawn_task(host.run(), f"host-{boot.host}")

    async def tick(self) -> None:
        """Move every worker: a step each 1/rate s, or fetch+ack as fast as answered."""
        period = 1.0 / self.cfg.rate if self.cfg.rate > 0 else 0.05
        next_at = time.monotonic()
        while True:
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            now = time.monotonic()
            late = now - next_at
            self.stats.tick_late_max_s = max(self.stats.tick_late_max_s, late)
            if late > 1.0:
                self.stats.tick_late_over_1s += 1
                next_at = now  # do not try to catch up a backlog of ticks
            for worker in list(self.workers.values()):
                if worker.stopped or not worker.welcomed:
                    continue
                if now >= worker.next_ping:
                    worker.next_ping = now + self.heartbeat_s
                    worker.ping_seq += 1
                    await worker.send(Ping(seq=worker.ping_seq))
                if self.cfg.rate > 0:
                    await self.step_worker(worker, now)
                await worker.fetch(now)

    async def step_worker(self, worker: SimWorker, now: float) -> None:
        done, reports = worker.train_step(now)
        if done:
            worker.unconfirmed.update(done)
            await worker.send(AckShards(lease_ids=done, step=worker.step))
        if reports is not None:
            self.stats.reports_sent += 1
            self.sent.append((worker.rank, worker.step, time.monotonic()))
            await worker.send(reports)

    async def worker_receive(self, worker: SimWorker) -> None:
        while not worker.stopped:
            msg = await recv(worker.dealer)
            if msg is None:
                continue
            now = time.monotonic()
            if isinstance(msg, Welcome):
                worker.welcomed = True
                self.heartbeat_s = worker.ping_every_s = msg.heartbeat_interval
            elif isinstance(msg, DatasetReady):
                worker.dataset_ok = msg.dataset is not None and not msg.error
                if msg.error:
                    print(f"rank {worker.rank}: dataset refused: {msg.error}", file=sys.stderr)
                await worker.fetch(now)
            elif isinstance(msg, ShardGrant):
                worker.on_grant(msg, now)
                if self.cfg.rate == 0 and msg.leases:
                    # The DDS stress: these records are "trained" at once.
                    ids = [lease.lease_id for lease in msg.leases]
                    worker.leases = [held for held in worker.leases if held[0] not in ids]
                    worker.queued = sum(left for _, left in worker.leases)
                    worker.step += 1
                    worker.unconfirmed.update(ids)
                    await worker.send(AckShards(lease_ids=ids, step=worker.step))
                await worker.fetch(now)
            elif isinstance(msg, AckDone):
                confirmed = worker.unconfirmed.intersection(msg.lease_ids)
                worker.unconfirmed -= confirmed
                self.stats.leases_acked += len(confirmed)
                await worker.fetch(now)
            elif isinstance(msg, AdjustBatchSize):
                size = msg.size_of(worker.rank)
                if size is not None:
                    worker.plan = (msg.apply_at_step, size)
            elif isinstance(msg, Rehello):
                self.stats.rehellos += 1
                await worker.hello()

    def add_worker(self, host: str, spawn: Spawn, run_id: str) -> SimWorker:
        identity = b"worker:%d@%d" % (spawn.rank, spawn.attempt)
        boot = self.hosts[host].boot
        dealer = Dealer(self.ctx, boot.endpoint, peer_keys_of(boot), identity)
        worker = SimWorker(
            rank=spawn.rank,
            attempt=spawn.attempt,
            host=host,
            run_id=run_id,
            dealer=dealer,
            cfg=self.cfg,
            stats=self.stats,
            batch=self.cfg.batch,
        )
        worker.next_ping = time.monotonic() + random.uniform(0, self.heartbeat_s)
        self.workers[(host, spawn.rank)] = worker
        worker.receiver = asyncio.create_task(self.worker_receive(worker))
        return worker

    def stop_worker(self, worker: SimWorker) -> None:
        worker.stopped = True
        if worker.receiver is not None:
            worker.receiver.cancel()
        worker.dealer.close(linger_ms=0)
        self.workers.pop((worker.host, worker.rank), None)

    def write_outputs(self) -> None:
        self.stats.cpu_s = time.process_time()
        self.stats.wall_s = time.monotonic() - self.started
        if self.send_log is not None:
            np.save(self.send_log, np.array(self.sent, dtype=np.float64).reshape(-1, 3))
        print("stats " + json.dumps(dataclasses.asdict(self.stats)), flush=True)


class SimHost:
    """One host's agent, as the supervisor sees it."""

    def __init__(self, sim: Simulator, boot: AgentBootstrap) -> None:
        self.sim = sim
        self.boot = boot
        self.dealer = Dealer(
            sim.ctx, boot.endpoint, peer_keys_of(boot), b"agent:" + boot.host.encode()
        )
        self.procs: dict[str, SimWorker] = {}
        self.pid = os.getpid()

    def reports(self) -> list[ProcReport]:
        return [
            ProcReport(
                proc_id=w.proc_id,
                role="worker",
                rank=w.rank,
                attempt=w.attempt,
                pid=self.pid,
                state="running",
                rss_bytes=50_000_000,
                cpu_percent=95.0,
            )
            for w in self.procs.values()
        ]

    async def hello(self) -> None:
        await send(
            self.dealer,
            Hello(
                role="agent",
                run_id=self.boot.run_id,
                host=self.boot.host,
                pid=self.pid,
                version=__version__,
                procs=self.reports(),
                free_ports=FAKE_PORTS,
                host_addr="127.0.0.1",
            ),
        )

    async def run(self) -> None:
        await self.hello()
        beat = asyncio.create_task(self.heartbeat())
        try:
            reason = await self.receive()
        finally:
            beat.cancel()
        for worker in list(self.procs.values()):
            await self.exited(worker, requested=True)
        await send(self.dealer, Bye(reason=reason))
        await asyncio.sleep(0.2)  # let the Bye leave before the socket closes
        self.dealer.close()
        print(f"exit {self.boot.host}", flush=True)

    async def heartbeat(self) -> None:
        await asyncio.sleep(random.uniform(0, self.boot.heartbeat_interval))
        seq = 0
        while True:
            seq += 1
            await send(self.dealer, AgentHeartbeat(seq=seq, procs=self.reports()))
            await asyncio.sleep(self.boot.heartbeat_interval)

    async def exited(self, worker: SimWorker, *, requested: bool) -> None:
        self.procs.pop(worker.proc_id, None)
        self.sim.stop_worker(worker)
        await send(
            self.dealer,
            Exited(
                proc_id=worker.proc_id,
                attempt=worker.attempt,
                pid=self.pid,
                exit_code=None,
                signal=15,
                runtime_s=time.monotonic() - worker.started_at,
                requested=requested,
            ),
        )

    async def receive(self) -> str:
        while True:
            msg = await recv(self.dealer)
            if isinstance(msg, Rehello):
                await self.hello()
            elif isinstance(msg, Spawn):
                old = self.procs.get(msg.proc_id)
                if old is not None:
                    await self.exited(old, requested=True)
                worker = self.sim.add_worker(self.boot.host, msg, self.boot.run_id)
                self.procs[msg.proc_id] = worker
                await send(
                    self.dealer, Spawned(proc_id=msg.proc_id, attempt=msg.attempt, pid=self.pid)
                )
                await worker.hello()
            elif isinstance(msg, Kill):
                worker = self.procs.get(msg.proc_id)
                if worker is not None and worker.attempt == msg.attempt:
                    await self.exited(worker, requested=True)
            elif isinstance(msg, Shutdown):
                return f"shutdown: {msg.reason}" if msg.reason else "shutdown"


async def main_async(args: argparse.Namespace) -> None:
    cfg = Config(
        rate=args.rate,
        batch=args.batch,
        compute_s=args.compute_s,
        dataset=DatasetInfo(
            dataset_size=args.dataset_size,
            shard_size=args.shard_size,
            epochs=1,
            global_batch=args.global_batch,
            seed=0,
        ),
        slow_ranks=frozenset(int(r) for r in args.slow_ranks.split(",") if r),
        slow_factor=args.slow_factor,
        fetch_count=args.fetch_count,
    )
    sim = Simulator(cfg, args.send_log)
    ticker = asyncio.create_task(sim.tick())
    try:
        await sim.read_bootstraps()
        # stdin closed: the driver is done. Hosts still running end on their Shutdown.
        if sim.tasks:
            await asyncio.wait(set(sim.tasks), timeout=args.drain_s)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        sim.write_outputs()
        for worker in list(sim.workers.values()):
            sim.stop_worker(worker)
        sim.ctx.destroy(linger=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compute-s", type=float, default=0.08)
    parser.add_argument("--dataset-size", type=int, required=True)
    parser.add_argument("--shard-size", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--slow-ranks", default="")
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument("--fetch-count", type=int, default=0)
    parser.add_argument("--send-log", type=Path, default=None)
    parser.add_argument("--drain-s", type=float, default=30.0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
