"""dtlaunch.runtime: the SDK in a real worker process against a fake supervisor.

The fake supervisor is a real wire ``Router`` (CURVE keys made in tmp_path)
serving the DDS messages from a simple in-test queue of whole-shard leases; its
state outlives its Router, so closing the Router and binding a new one on the
same port is a supervisor killed with SIGKILL and resumed from its WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
import zmq.asyncio

import dtlaunch
from dtlaunch.errors import ConfigError
from dtlaunch.runtime.data import BatchStream, lease_records, local_batch_size
from dtlaunch.runtime.standalone import StandaloneSource
from dtlaunch.sharding import DatasetSpec, epoch_order, shard_records
from dtlaunch.wire.keys import create_run_keys, write_peer_keys
from dtlaunch.wire.messages import (
    AckDone,
    AckShards,
    DatasetInfo,
    DatasetReady,
    FetchShards,
    Hello,
    Lease,
    Ping,
    RegisterDataset,
    Rehello,
    ShardGrant,
    Welcome,
)
from dtlaunch.wire.sockets import Router

REPO = Path(__file__).resolve().parent.parent
RUN_ID = "run-runtime-test"
HEARTBEAT = 0.2
WORKER_TIMEOUT_S = 60.0

WORKER_SCRIPT = """
import atexit, dataclasses, json, sys, time
import dtlaunch
from dtlaunch.errors import ConfigError

cfg = json.loads(sys.argv[1])

def emit(**kv):
    print(json.dumps(kv), flush=True)

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
    ):
        self.keys = keys
        self.ignore_first_fetch = ignore_first_fetch
        self.grant_twice = grant_twice
        self.ack_done_delay = ack_done_delay
        self.ack_done_sent = []  # monotonic times
        self.dds = FakeDds(spec)
        self.rehello_after_acks = rehello_after_acks
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
            rank = int(peer.split(b":")[1])
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

    def _register(self, info):
        wanted = DatasetSpec(**{k: getattr(info, k) for k in asdict(info)})
        if self.dds.spec is None:
            self.dds.set_spec(wanted)
        elif self.dds.spec != wanted:
            return DatasetReady(
                dataset=info_of(self.dds.spec),
                error=f"the job's data set is {self.dds.spec}, but this worker registered "
                f"{wanted}",
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


@pytest.fixture
def keys(tmp_path):
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


@pytest.mark.integration
def test_records_batches_acks_and_prefetch(tmp_path, keys):
    spec = DatasetSpec(dataset_size=95, shard_size=10, epochs=2, global_batch=15, seed=7)
    prefetch = 2
    cfg = {
        "init": {"prefetch": prefetch},  # no data set: the job's (run options) is used
        "step_sleep": 0.02,
        "pause_after": 1,
        "pause": 1.0,
    }
    fake, run = run_job(tmp_path, keys, spec, cfg, rank=1, world_size=2)
    assert_succeeded(run)
    start = run.lines[0]
    assert start["rank"] == 1 and start["world_size"] == 2 and start["restart_count"] == 0
    assert start["dataset"] == asdict(spec)
    assert start["local_batch_size"] == 7  # 15 // 2, rank 1 is not below 15 % 2

    # Every record of every epoch exactly once; full batches except the last.
    assert_each_record_once_per_epoch(fake, run)
    batches = run.values("batch")
    assert all(len(b) == 7 for b in batches[:-1]) and 1 <= len(batches[-1]) <= 7
    assert run.one("end") == len(batches)

    # Batches cross shard boundaries: some batch holds records of two leases.
    leases = [lease for _, lease in fake.grants]
    owner = [lease.lease_id for lease in leases for _ in range(lease.end - lease.start)]
    offsets = [0]
    for b in batches:
        offsets.append(offsets[-1] + len(b))
    spans = [len(set(owner[a:z])) for a, z in itertools.pairwise(offsets)]
    assert max(spans) == 2

    # Each lease is acked by the step() right after the batch holding its last
    # record, never before that step() was called, and with that step's number.
    step_at = run.values("step_at")
    first_ack = {}
    for t, ack in fake.acks:
        for lease_id in ack.lease_ids:
            first_ack.setdefault(lease_id, (t, ack.step))
    assert set(first_ack) == {lease.lease_id for lease in leases}
    for lease_id, batch_number in last_record_batch(run, spec, leases).items():
        t, step = first_ack[lease_id]
        assert step == batch_number
        assert t >= step_at[step - 1]

    # Prefetch: while the worker paused in its first batch, the current lease
    # and `prefetch` more had been granted, and no more than that.
    pause_end = run.one("pause_end")
    assert sum(1 for t, _ in fake.grants if t <= pause_end) == prefetch + 1
    # Later, every ack found the next `prefetch` leases already granted.
    for t, _ in fake.acks:
        acked = len({lid for ta, a in fake.acks if ta <= t for lid in a.lease_ids})
        granted = sum(1 for tg, _ in fake.grants if tg <= t)
        assert granted >= min(len(leases), acked + prefetch)
        assert granted <= acked + prefetch + 3  # current + not-yet-stepped + rounding

    # An idle worker's runtime thread sleeps between its timers instead of spinning.
    assert run.one("pause_cpu") < 0.3 * cfg["pause"]
    # Liveness: the worker pinged while it was paused.
    pings = [t for t, msg in fake.log if isinstance(msg, Ping)]
    assert any(run.one("pause_start") < t < pause_end for t in pings)
    (hello, _, _), *_ = fake.hellos
    assert (hello.role, hello.rank, hello.attempt, hello.leases) == ("worker", 1, 0, [])
    assert hello.run_id == RUN_ID and hello.version == dtlaunch.__version__


@pytest.mark.integration
def test_prefetch_zero_fetches_on_demand(tmp_path, keys):
    spec = DatasetSpec(dataset_size=50, shard_size=10, epochs=1, global_batch=5)
    cfg = {"init": {"prefetch": 0}, "pause_after": 1, "pause": 0.5}
    fake, run = run_job(tmp_path, keys, spec, cfg)
    assert_succeeded(run)
    assert sum(1 for t, _ in fake.grants if t <= run.one("pause_end")) == 1
    assert_each_record_once_per_epoch(fake, run)


@pytest.mark.integration
def test_rehello_sends_hello_with_held_leases(tmp_path, keys):
    spec = DatasetSpec(dataset_size=120, shard_size=10, epochs=1, global_batch=4)
    cfg = {"init": {"prefetch": 3}, "step_sleep": 0.03}
    fake, run = run_job(tmp_path, keys, spec, cfg, rehello_after_acks=3)
    assert_succeeded(run)
    assert len(fake.hellos) == 2
    hello, doing, done = fake.hellos[1]
    # The held leases: granted and not confirmed DONE (an ack may be in flight).
    assert doing and doing <= set(hello.leases) <= doing | done
    assert hello.rank == 0 and hello.attempt == 0
    assert_each_record_once_per_epoch(fake, run)


@pytest.mark.integration
def test_supervisor_restart_mid_run_loses_no_records(tmp_path, keys):
    spec = DatasetSpec(dataset_size=200, shard_size=10, epochs=2, global_batch=5, seed=3)
    registered = {k: v for k, v in asdict(spec).items()}
    cfg = {"init": {**registered, "prefetch": 2}, "step_sleep": 0.01}
    restarted_at = []

    async def kill_and_resume(fake):
        await fake.until_acks(5)
        await fake.stop()  # SIGKILL: nothing more is sent or received
        await asyncio.sleep(0.7)
        await fake.start()  # --resume: same state, same port, knows no peer
        restarted_at.append(time.monotonic())

    # The supervisor has no data set of its own: the worker registers it.
    fake, run = run_job(tmp_path, keys, None, cfg, during=kill_and_resume)
    assert_succeeded(run)
    assert fake.dds.spec == spec
    assert restarted_at and fake.acks[-1][0] > restarted_at[0]  # it went on after the restart
    assert len(fake.hellos) >= 2
    hello, doing, done = fake.hellos[-1]
    assert doing <= set(hello.leases) <= doing | done
    assert_each_record_once_per_epoch(fake, run)


@pytest.mark.integration
def test_unanswered_request_is_resent_and_grants_are_deduplicated(tmp_path, keys):
    spec = DatasetSpec(dataset_size=60, shard_size=10, epochs=2, global_batch=6)
    fake, run = run_job(
        tmp_path, keys, spec, {"init": {}}, ignore_first_fetch=True, grant_twice=True
    )
    assert_succeeded(run)
    fetches = [(t, msg) for t, msg in fake.log if isinstance(msg, FetchShards)]
    (t0, first), (t1, second) = fetches[:2]
    assert second.request_id != first.request_id
    assert t1 - t0 >= 0.9  # re-sent after the request timeout (1 s at this heartbeat)
    assert_each_record_once_per_epoch(fake, run)


@pytest.mark.integration
def test_empty_grants_are_retried_until_another_worker_releases_its_shard(tmp_path, keys):
    spec = DatasetSpec(dataset_size=40, shard_size=10, epochs=1, global_batch=5)
    stolen = []

    def another_worker_takes_a_shard(fake):
        stolen.extend(fake.dds.fetch(9, 1)[0])

    async def it_dies_later(fake):
        # Wait until the worker has asked at least twice and got nothing.
        while sum(1 for t, m in fake.log if isinstance(m, FetchShards)) < 6:
            await asyncio.sleep(0.05)
        fake.dds.reclaim(9, set())  # rank 9 died: its shard goes back to TODO

    fake, run = run_job(
        tmp_path, keys, spec, {"init": {}}, setup=another_worker_takes_a_shard, during=it_dies_later
    )
    assert_succeeded(run)
    assert_each_record_once_per_epoch(fake, run)
    # The stolen shard came last, after the worker waited retry_after between asks.
    assert fake.grants[-1][1].shard == stolen[0].shard
    fetch_times = [t for t, m in fake.log if isinstance(m, FetchShards)]
    waits = [b - a for a, b in itertools.pairwise(fetch_times[3:6])]
    assert waits and min(waits) >= 0.09  # the fake's retry_after is 0.1 s


@pytest.mark.integration
def test_exit_without_close_still_flushes_the_last_acks(tmp_path, keys):
    spec = DatasetSpec(dataset_size=30, shard_size=10, epochs=1, global_batch=10)
    fake, run = run_job(tmp_path, keys, spec, {"init": {}, "close": False}, ack_done_delay=0.3)
    assert_succeeded(run)
    # The script never called close(): atexit did, sent the last step's ack and
    # waited for its (late) AckDone before the process went on exiting.
    assert fake.acks[-1][1].step == run.one("end") == 3
    assert len(fake.ack_done_sent) == len(fake.acks)
    assert run.one("exiting") > fake.ack_done_sent[-1]
    assert_each_record_once_per_epoch(fake, run)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("job_spec", "init_args", "expected"),
    [
        pytest.param(
            DatasetSpec(dataset_size=100, shard_size=10),
            {"dataset_size": 50, "shard_size": 10},
            "but this worker registered",
            id="registered-mismatch",
        ),
        pytest.param(
            DatasetSpec(dataset_size=100, shard_size=10, epochs=2),
            {"epochs": 3},
            "epochs=3 (the job has 2)",
            id="partial-mismatch",
        ),
        pytest.param(None, {}, "--dataset-size and --shard-size", id="no-dataset"),
    ],
)
def test_dataset_errors_are_config_errors(tmp_path, keys, job_spec, init_args, expected):
    fake, run = run_job(tmp_path, keys, job_spec, {"init": init_args})
    assert run.returncode == 3, run.stderr
    assert expected in run.one("config_error")
    assert not fake.grants


def test_no_supervisor_answer_is_a_config_error(tmp_path, keys, monkeypatch):
    for name, value in worker_env(tmp_path, "tcp://127.0.0.1:9").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DTLAUNCH_INIT_TIMEOUT", "0.5")
    with pytest.raises(ConfigError, match="did not answer within"):
        dtlaunch.init()


def test_bad_environment_is_a_config_error(tmp_path, keys, monkeypatch):
    for name, value in worker_env(tmp_path, "tcp://127.0.0.1:9").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DTLAUNCH_KEYS")
    with pytest.raises(ConfigError, match="DTLAUNCH_KEYS is not"):
        dtlaunch.init()
    monkeypatch.setenv("DTLAUNCH_KEYS", str(tmp_path / "peer-keys"))
    monkeypatch.setenv("DTLAUNCH_RANK", "two")
    with pytest.raises(ConfigError, match="DTLAUNCH_RANK='two' is not an integer"):
        dtlaunch.init()


# --------------------------------------------------------------- standalone


def standalone_expected(spec):
    order = [(e, s) for e in range(spec.epochs) for s in epoch_order(spec, e)]
    return [r for e, s in order for r in shard_records(spec, e, s)]


def test_standalone_yields_every_record_in_order(monkeypatch):
    monkeypatch.delenv("DTLAUNCH_SUPERVISOR", raising=False)
    spec = DatasetSpec(dataset_size=23, shard_size=5, epochs=2, global_batch=4, seed=11)
    with dtlaunch.init(**asdict(spec)) as job:
        assert (job.rank, job.world_size, job.dataset) == (0, 1, spec)
        assert job.local_batch_size == 4
        batches = []
        for batch in job.batches():
            batches.append(batch)
            job.step()
        assert job.step_count == len(batches)
    assert [r for b in batches for r in b] == standalone_expected(spec)
    assert all(len(b) == 4 for b in batches[:-1]) and len(batches[-1]) == 46 % 4
    for epoch in range(2):
        assert sorted(standalone_expected(spec)[23 * epoch : 23 * (epoch + 1)]) == list(range(23))


@pytest.mark.integration
def test_standalone_runs_with_plain_python(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTLAUNCH_")}
    env["PYTHONPATH"] = str(REPO)
    spec = DatasetSpec(dataset_size=17, shard_size=4, epochs=2)

    async def main():
        proc = await start_worker(tmp_path, env, {"init": asdict(spec)})
        return await finish_worker(proc)

    run = asyncio.run(main())
    assert_succeeded(run)
    assert [r for b in run.values("batch") for r in b] == standalone_expected(spec)
    assert run.lines[0]["local_batch_size"] == 4  # global_batch 0: the shard size


def test_standalone_needs_the_dataset(monkeypatch):
    monkeypatch.delenv("DTLAUNCH_SUPERVISOR", raising=False)
    with pytest.raises(ConfigError, match="standalone and needs the data set"):
        dtlaunch.init()
    with pytest.raises(ConfigError, match="pass dataset_size= and shard_size= together"):
        dtlaunch.init(dataset_size=10)
    with pytest.raises(ConfigError, match="shard_size must be at least 1"):
        dtlaunch.init(dataset_size=10, shard_size=0)
    with pytest.raises(ConfigError, match=r"global_batch must be an int, got 0\.5"):
        dtlaunch.init(dataset_size=10, shard_size=2, global_batch=0.5)


# ------------------------------------------------------ batches and acks (pure)


class ListSource:
    def __init__(self, leases):
        self.leases = deque(leases)
        self.acks = []

    def next_lease(self):
        return self.leases.popleft() if self.leases else None

    def ack(self, lease_ids, step):
        self.acks.append((list(lease_ids), step))

    def close(self, timeout):
        pass


SPEC = DatasetSpec(dataset_size=25, shard_size=10)


def lease(lease_id, shard, start=0, end=None):
    return Lease(
        lease_id=lease_id, epoch=0, shard=shard, start=start, end=end or SPEC.shard_length(shard)
    )


def test_local_batch_size_splits_the_global_batch():
    spec = DatasetSpec(dataset_size=100, shard_size=10, global_batch=10)
    assert [local_batch_size(spec, r, 4) for r in range(4)] == [3, 3, 2, 2]
    assert local_batch_size(DatasetSpec(dataset_size=100, shard_size=10), 2, 4) == 10
    with pytest.raises(ConfigError, match="smaller than the 11 workers"):
        local_batch_size(spec, 0, 11)


def test_batches_cross_leases_and_step_acks_what_was_returned():
    source = ListSource([lease(1, 0), lease(2, 2), lease(3, 1, start=4)])  # 10 + 5 + 6
    stream = BatchStream(source, SPEC, 4)
    got = [stream.next_batch() for _ in range(6)]
    records = [r for b in got if b for r in b]
    parts = [shard_records(SPEC, 0, 0), shard_records(SPEC, 0, 2), shard_records(SPEC, 0, 1)[4:]]
    assert records == [r for part in parts for r in part]
    assert [len(b) for b in got if b] == [4, 4, 4, 4, 4, 1]
    assert stream.next_batch() is None and stream.ended
    # Five batches returned before this step: leases 1 (batch 3) and 2 (batch 4) are done,
    # lease 3 ends in the sixth batch, also returned: all three.
    stream.step()
    assert source.acks == [([1, 2, 3], 1)]
    stream.step()
    assert source.acks == [([1, 2, 3], 1)]


def test_one_batch_per_step_acks_only_trained_batches():
    source = ListSource([lease(1, 0), lease(2, 2)])
    stream = BatchStream(source, SPEC, 5)
    stream.set_mode("one_per_step")
    batches = [stream.next_batch() for _ in range(3)]  # read ahead, like a DataLoader
    assert [len(b) for b in batches] == [5, 5, 5]
    stream.step()
    assert source.acks == []
    stream.step()  # batch 2 held lease 1's last record
    assert source.acks == [([1], 2)]
    stream.step()
    assert source.acks == [([1], 2), ([2], 3)]
    stream.step()  # nothing left to cover
    assert len(source.acks) == 2 and stream.steps == 4


def test_empty_lease_is_acked_at_once():
    source = ListSource([lease(1, 0, 3, 3), lease(2, 2)])
    stream = BatchStream(source, SPEC, 10)
    assert len(stream.next_batch()) == 5
    assert source.acks == [([1], 0)]


def test_standalone_source_hands_out_every_shard_of_every_epoch():
    spec = DatasetSpec(dataset_size=23, shard_size=5, epochs=3)
    source = StandaloneSource(spec)
    leases = list(iter(source.next_lease, None))
    assert [(x.epoch, x.shard) for x in leases] == [
        (e, s) for e in range(3) for s in epoch_order(spec, e)
    ]
    assert len({x.lease_id for x in leases}) == len(leases) == 15
    assert all(x.end == spec.shard_length(x.shard) for x in leases)
