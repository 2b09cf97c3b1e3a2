"""A fake supervisor for SDK tests: a real wire Router (CURVE keys made in
tmp_path) serving the DDS messages from an in-test queue of whole-shard leases.
Its state outlives its Router, so closing the Router and binding a new one on
the same port is a supervisor killed with SIGKILL and resumed from its WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq.asyncio

from dtlaunch.runtime.data import lease_records
from dtlaunch.sharding import DatasetSpec, epoch_order
from dtlaunch.supervisor.jobstate.workers import parse_worker_identity
from dtlaunch.wire.keys import create_run_keys, write_peer_keys
from dtlaunch.wire.messages import (
    AckDone,
    AckShards,
    DatasetInfo,
    DatasetReady,
    FetchShards,
    Hello,
    Lease,
    LeaveJob,
    Ping,
    RegisterDataset,
    Rehello,
    ReleaseShards,
    ShardGrant,
    Welcome,
)
from dtlaunch.wire.sockets import Router

REPO = Path(__file__).resolve().parent.parent
RUN_ID = "run-runtime-test"
HEARTBEAT = 0.2
WORKER_TIMEOUT_S = 60.0

WORKER_SCRIPT = """
import atexit, dataclasses, json, sys, threading, time
import dtlaunch
from dtlaunch.errors import ConfigError
from dtlaunch.wire.sockets import Dealer

cfg = json.loads(sys.argv[1])
printing = threading.Lock()  # the link's thread emits too: one whole line at a time

def emit(**kv):
    with printing:
        sys.stdout.write(json.dumps(kv) + "\\n")
        sys.stdout.flush()

if cfg.get("trace_sends"):
    # When the link queued each message (what its heartbeat rule decides on),
    # not when the fake read it: a loaded machine delays the reads unevenly.
    queue_message = Dealer.send

    async def traced(self, msg):
        queued = await queue_message(self, msg)
        if queued:
            emit(sent=[msg.TYPE, time.monotonic()])
        return queued

    Dealer.send = traced

# Registered before init(), so it runs after the Job's own atexit close().
atexit.register(lambda: emit(exiting=time.monotonic()))

try:
    job = dtlaunch.init(**cfg["init"])
except ConfigError as err:
    emit(config_error=str(err))
    sys.exit(3)
emit(rank=job.rank, world_size=job.world_size, restart_count=job.restart_count,
     local_batch_size=job.local_batch_size, dataset=dataclasses.asdict(job.dataset))
for n, idx in enumerate(job.batches(), 1):
    emit(batch=idx)
    time.sleep(cfg.get("step_sleep", 0.0))
    if n == cfg.get("pause_after"):
        emit(pause_start=time.monotonic())
        cpu = time.process_time()
        time.sleep(cfg["pause"])
        emit(pause_end=time.monotonic(), pause_cpu=time.process_time() - cpu)
    emit(step_at=time.monotonic())
    job.step()
if cfg.get("close", True):
    job.close()
emit(end=job.step_count)
"""


# ------------------------------------------------------------ fake supervisor


def info_of(spec: DatasetSpec) -> DatasetInfo:
    return DatasetInfo(**asdict(spec))


@dataclass
class FakeDds:
    """Whole-shard leases from a queue; DOING leases come back on a Hello without them."""

    spec: DatasetSpec | None
    todo: deque = field(default_factory=deque)
    doing: dict = field(default_factory=dict)  # lease_id -> (Lease, rank)
    done: dict = field(default_factory=dict)  # lease_id -> Lease
    next_id: int = 100

    def __post_init__(self):
        if self.spec is not None:
            self.set_spec(self.spec)

    def set_spec(self, spec):
        self.spec = spec
        self.todo = deque((e, s) for e in range(spec.epochs) for s in epoch_order(spec, e))

    def fetch(self, rank, count):
        leases = []
        while self.todo and len(leases) < count:
            epoch, shard = self.todo.popleft()
            lease = Lease(
                lease_id=self.next_id,
                epoch=epoch,
                shard=shard,
                start=0,
                end=self.spec.shard_length(shard),
            )
            self.next_id += 1
            self.doing[lease.lease_id] = (lease, rank)
            leases.append(lease)
        others = any(r != rank for _, r in self.doing.values())
        return leases, not self.todo and not others

    def ack(self, lease_ids):
        for lease_id in lease_ids:
            if lease_id in self.doing:
                self.done[lease_id] = self.doing.pop(lease_id)[0]

    def reclaim(self, rank, keep):
        for lease_id, (lease, r) in list(self.doing.items()):
            if r == rank and lease_id not in keep:
                del self.doing[lease_id]
                self.todo.appendleft((lease.epoch, lease.shard))

    def doing_of(self, rank):
        return {lid for lid, (_, r) in self.doing.items() if r == rank}


class FakeSupervisor:
    """Serves Hello/Ping/dataset/shard/ack messages and logs them with arrival times."""

    def __init__(
        self,
        keys,
        spec,
        *,
        rehello_after_acks=None,
        ack_done_delay=0.0,
        ignore_first_fetch=False,
        grant_twice=False,
        leave_after_acks=None,
        grants_max=None,
    ):
        """``leave_after_acks``: send LeaveJob after that many acks (dtlaunch scale
        removed the worker); ``grants_max``: grant no more leases than that (the
        worker then waits for data)."""
        self.keys = keys
        self.ignore_first_fetch = ignore_first_fetch
        self.grant_twice = grant_twice
        self.ack_done_delay = ack_done_delay
        self.ack_done_sent = []  # monotonic times
        self.dds = FakeDds(spec)
        self.rehello_after_acks = rehello_after_acks
        self.leave_after_acks = leave_after_acks
        self.grants_max = grants_max
        self.releases = []  # (monotonic time, ReleaseShards)
        self.endpoint = "tcp://127.0.0.1:0"
        self.known = set()
        self.log = []  # (monotonic time, message)
        self.grants = []  # (monotonic time, Lease), in grant order
        self.acks = []  # (monotonic time, AckShards)
        self.hellos = []  # (Hello, DOING of its rank then, DONE ids then)
        self.ack_count = asyncio.Event()
        self.acks_seen = 0
        self._ctx = None
        self._router = None
        self._task = None

    async def start(self):
        self._ctx = zmq.asyncio.Context()
        self._router = Router(self._ctx, self.keys, bind=self.endpoint)
        await self._router.start()
        self.endpoint = self._router.endpoint
        self.known.clear()  # a new supervisor process knows no peer
        self._task = asyncio.create_task(self._serve())

    async def stop(self):
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._router is not None:
            await self._router.__aexit__(None, None, None)
            self._router = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    async def until_acks(self, n):
        while self.acks_seen < n:
            await asyncio.wait_for(self.ack_count.wait(), WORKER_TIMEOUT_S)
            self.ack_count.clear()

    async def _serve(self):
        router = self._router
        while True:
            peer, msg = await router.recv()
            now = time.monotonic()
            self.log.append((now, msg))
            rank, _attempt = parse_worker_identity(peer) or (-1, -1)
            if isinstance(msg, Hello):
                self.known.add(peer)
                self.hellos.append((msg, self.dds.doing_of(rank), set(self.dds.done)))
                self.dds.reclaim(rank, set(msg.leases))
                await router.send(peer, Welcome(run_id=RUN_ID, heartbeat_interval=HEARTBEAT))
            elif peer not in self.known:
                await router.send(peer, Rehello())
            elif isinstance(msg, Ping):
                pass
            elif isinstance(msg, DatasetReady):
                info = info_of(self.dds.spec) if self.dds.spec else None
                await router.send(peer, DatasetReady(dataset=info))
            elif isinstance(msg, RegisterDataset):
                await router.send(peer, self._register(msg.dataset))
            elif isinstance(msg, FetchShards):
                if self.ignore_first_fetch:
                    self.ignore_first_fetch = False
                    continue  # lost on the way: the worker must ask again
                if self.grants_max is not None and len(self.grants) >= self.grants_max:
                    leases, finished = [], False
                else:
                    leases, finished = self.dds.fetch(rank, msg.count)
                self.grants.extend((now, lease) for lease in leases)
                retry = 0.0 if leases or finished else 0.1
                grant = ShardGrant(
                    request_id=msg.request_id, leases=leases, finished=finished, retry_after=retry
                )
                await router.send(peer, grant)
                if self.grant_twice:  # the same leases again: the worker keeps them once
                    await router.send(peer, grant)
            elif isinstance(msg, AckShards):
                self.acks.append((now, msg))
                self.dds.ack(msg.lease_ids)
                await asyncio.sleep(self.ack_done_delay)  # a slow WAL fsync
                self.ack_done_sent.append(time.monotonic())  # before: no worker sees it earlier
                await router.send(peer, AckDone(lease_ids=msg.lease_ids))
                self.acks_seen += 1
                self.ack_count.set()
                if self.acks_seen == self.rehello_after_acks:
                    await router.send(peer, Rehello())
                if self.acks_seen == self.leave_after_acks:
                    await router.send(peer, LeaveJob(reason="dtlaunch scale removed worker 0"))
            elif isinstance(msg, ReleaseShards):
                self.releases.append((now, msg))

    def _register(self, info):
        wanted = DatasetSpec(**{k: getattr(info, k) for k in asdict(info)})
        if self.dds.spec is None:
            self.dds.set_spec(wanted)
        elif self.dds.spec != wanted:
            return DatasetReady(
                dataset=info_of(self.dds.spec),
                error=f"the job's data set is {self.dds.spec}, but this worker registered {wanted}",
            )
        return DatasetReady(dataset=info_of(self.dds.spec))


# ------------------------------------------------------------------ harness


@dataclass
class WorkerRun:
    returncode: int
    lines: list
    stderr: str

    def values(self, key):
        return [line[key] for line in self.lines if key in line]

    def one(self, key):
        (value,) = self.values(key)
        return value


def make_keys(tmp_path):
    """Run keys for the fake supervisor, and the worker's copy (the ``keys`` fixture)."""
    run_keys = create_run_keys(tmp_path / "run-keys")
    write_peer_keys(tmp_path / "peer-keys", run_keys.peer())
    return run_keys


def worker_env(tmp_path, endpoint, *, rank=0, world_size=1, attempt=0):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTLAUNCH_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "DTLAUNCH_RUN_ID": RUN_ID,
            "DTLAUNCH_ROLE": "worker",
            "DTLAUNCH_RANK": str(rank),
            "DTLAUNCH_SUPERVISOR": endpoint,
            "DTLAUNCH_KEYS": str(tmp_path / "peer-keys"),
            "DTLAUNCH_HEARTBEAT_INTERVAL": str(HEARTBEAT),
        }
    )
    return env


async def start_worker(tmp_path, env, cfg, script=WORKER_SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(script)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(path),
        json.dumps(cfg),
        env=env,
        cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish_worker(proc):
    try:
        out, err = await asyncio.wait_for(proc.communicate(), WORKER_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return WorkerRun(returncode=proc.returncode, lines=lines, stderr=err.decode())


def run_job(
    tmp_path,
    keys,
    spec,
    cfg,
    *,
    rank=0,
    world_size=1,
    during=None,
    setup=None,
    script=WORKER_SCRIPT,
    **fake_options,
):
    """Fake supervisor + one worker process running ``script``.

    ``setup(fake)`` runs before the worker starts, ``during(fake)`` alongside it.
    """

    async def main():
        fake = FakeSupervisor(keys, spec, **fake_options)
        if setup is not None:
            setup(fake)
        await fake.start()
        try:
            env = worker_env(tmp_path, fake.endpoint, rank=rank, world_size=world_size)
            proc = await start_worker(tmp_path, env, cfg, script)
            if during is not None:
                await during(fake)
            run = await finish_worker(proc)
        finally:
            await fake.stop()
        return fake, run

    return asyncio.run(main())


def assert_succeeded(run):
    assert run.returncode == 0, run.stderr
    assert run.values("end"), run.stderr


def assert_each_record_once_per_epoch(fake, run):
    """The batches are exactly the granted leases' records, every shard of every epoch once."""
    spec = fake.dds.spec
    delivered = [r for batch in run.values("batch") for r in batch]
    leases = [lease for _, lease in fake.grants]
    expected = [r for lease in leases for r in lease_records(spec, lease)]
    assert delivered == expected
    covered = sorted((lease.epoch, lease.shard) for lease in leases)
    assert covered == sorted((e, s) for e in range(spec.epochs) for s in range(spec.num_shards))
    for epoch in range(spec.epochs):
        of_epoch = [lease for lease in leases if lease.epoch == epoch]
        records = [r for lease in of_epoch for r in lease_records(spec, lease)]
        assert sorted(records) == list(range(spec.dataset_size))
    assert not fake.dds.doing and not fake.dds.todo


def last_record_batch(run, spec, leases):
    """lease_id -> 1-based number of the batch holding that lease's last record."""
    where = {}
    position = 0
    for number, batch in enumerate(run.values("batch"), 1):
        for _ in batch:
            where[position] = number
            position += 1
    result, position = {}, 0
    for lease in leases:
        position += lease.end - lease.start
        result[lease.lease_id] = where[position - 1]
    return result


# -------------------------------------------------------------------- tests
