"""``dtlaunch run --metrics-port``: the job as a Prometheus endpoint, scraped over
real HTTP while a real job runs, and its parts (the families of a reading, the
reading on the job's loop, the server's life, the WAL's fsync observer) alone."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from dtlaunch import __version__
from dtlaunch.cli import app
from dtlaunch.config import JobSpec
from dtlaunch.errors import ConfigError
from dtlaunch.sharding import DatasetSpec
from dtlaunch.supervisor.dds.queue import ShardQueue
from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.supervisor.status.metrics import (
    POLICY_ACTIONS,
    JobCollector,
    JobReading,
    MetricsEndpoint,
    QueueDepths,
    job_families,
    metrics_address,
    records_done,
)
from dtlaunch.supervisor.wal import Wal
from dtlaunch.wire.messages import NodeStatus, StatusSnapshot
from tests.jobs import SCRIPTS, events, started, summary, wait_until

runner = CliRunner()

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def info_labels(samples: Samples) -> dict[str, str]:
    return next(dict(labels) for name, labels in samples if name == "dtlaunch_job_info")


def samples_of(text: str) -> Samples:
    """Every sample of an exposition as (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return samples_of(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


def port_is_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


class Families:
    """A collector over fixed families: the exposition of one reading."""

    def __init__(self, reading: JobReading) -> None:
        self.reading = reading

    def collect(self):
        return job_families(self.reading)


def exposition(reading: JobReading) -> Samples:
    registry = CollectorRegistry()
    registry.register(Families(reading))
    return samples_of(generate_latest(registry).decode())


def node(role: str, rank: int, **fields) -> NodeStatus:
    return NodeStatus(role=role, rank=rank, host="h", proc_state="running", **fields)


def fake_reading(**overrides) -> JobReading:
    status = StatusSnapshot(
        run_id="r1",
        policy="nd",
        mode="allreduce",
        phase="running",
        source="live",
        shards_done=30,
        shards_total=80,
        throughput=250.0,
        eta_s=12.5,
        nodes=[
            node("worker", 0, batch_size=16, bpt_s=0.1, throughput=160.0, shards_done=20),
            node(
                "worker",
                1,
                batch_size=8,
                bpt_s=0.4,
                throughput=20.0,
                shards_done=10,
                straggler="persistent straggler: 4.0x the mean BPT",
                restarts=2,
            ),
            node("worker", 2),  # started, no step reported yet
            node("server", 0, bpt_s=0.02),
        ],
    )
    fields = {
        "status": status,
        "samples_trained": 4800,
        "records_done": 295,
        "records_planned": 795,
        "queue": QueueDepths(todo=44, leased=6, done=30),
        "failures": {("worker", 1): 2},
        "actions": {"ADJUST_BS": 3},
    }
    return JobReading(**(fields | overrides))


def test_a_reading_becomes_the_documented_metrics():
    m = exposition(fake_reading())
    assert value(m, "dtlaunch_job_shards_done") == 30
    assert value(m, "dtlaunch_job_shards_planned") == 80
    assert value(m, "dtlaunch_job_records_done") == 295
    assert value(m, "dtlaunch_job_records_planned") == 795
    assert value(m, "dtlaunch_job_samples_trained_total") == 4800
    assert value(m, "dtlaunch_job_samples_per_second") == 250.0
    assert value(m, "dtlaunch_job_eta_seconds") == 12.5
    for state, depth in (("todo", 44), ("leased", 6), ("done", 30)):
        assert value(m, "dtlaunch_dds_queue_shards", state=state) == depth
    assert value(m, "dtlaunch_worker_bpt_seconds", rank="0") == 0.1
    assert value(m, "dtlaunch_worker_bpt_seconds", rank="1") == 0.4
    # A worker that has not reported has no BPT (a 0 would drag an average down).
    assert ("dtlaunch_worker_bpt_seconds", (("rank", "2"),)) not in m
    assert value(m, "dtlaunch_worker_batch_size", rank="1") == 8
    assert value(m, "dtlaunch_worker_samples_per_second", rank="0") == 160.0
    assert value(m, "dtlaunch_worker_shards_done", rank="0") == 20
    assert value(m, "dtlaunch_server_update_seconds", rank="0") == 0.02
    assert value(m, "dtlaunch_straggler", role="worker", rank="1") == 1
    assert value(m, "dtlaunch_straggler", role="worker", rank="0") == 0
    assert value(m, "dtlaunch_restarts_total", role="worker", rank="1") == 2
    assert value(m, "dtlaunch_failures_total", role="worker", rank="1") == 2
    assert value(m, "dtlaunch_failures_total", role="server", rank="0") == 0  # zero from start
    assert value(m, "dtlaunch_job_processes", role="worker", state="running") == 3
    assert value(m, "dtlaunch_job_phase", dtlaunch_job_phase="running") == 1
    assert value(m, "dtlaunch_job_phase", dtlaunch_job_phase="done") == 0
    assert value(m, "dtlaunch_policy_actions_total", action="ADJUST_BS") == 3
    assert {a for (n, labels), _ in m.items() if n == "dtlaunch_policy_actions_total"
            for _, a in labels} == set(POLICY_ACTIONS)  # fmt: skip


def test_without_a_policy_or_a_data_set_those_metrics_are_absent():
    m = exposition(fake_reading(actions=None, queue=None))
    names = {name for name, _ in m}
    assert "dtlaunch_policy_actions_total" not in names
    assert "dtlaunch_dds_queue_shards" not in names


def test_records_done_is_exact_when_the_last_shard_is_short():
    # 95 records in shards of 10: the last of each epoch holds 5.
    queue = ShardQueue(DatasetSpec(dataset_size=95, shard_size=10, epochs=3, seed=7))
    spec = queue.spec

    def from_ledger() -> int:
        return sum(spec.shard_length(shard) for _, shard, _, _ in queue.done_ledger)

    seen_short = 0
    while not queue.finished:
        grants = queue.fetch(0, 3)
        queue.fetch(1, 1)  # leased, not DONE: must not count
        done, _ = queue.ack(0, [g.lease_id for g in grants])
        seen_short += sum(t.shard == spec.num_shards - 1 for t in done)
        assert records_done(queue) == from_ledger()
        queue.release_worker(1)
    assert seen_short == 3
    assert records_done(queue) == 95 * 3


def test_a_scrape_reads_the_job_on_its_loop_and_a_stuck_loop_costs_only_that_scrape():
    loop = asyncio.new_event_loop()
    runner_thread = threading.Thread(target=loop.run_forever, daemon=True)
    runner_thread.start()
    read_in: list[int] = []

    class Job:
        def read(self) -> JobReading:
            read_in.append(threading.get_ident())
            return fake_reading()

    collector = JobCollector(loop, run_id="r1", policy="nd", mode="allreduce", read_timeout_s=0.3)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        m = samples_of(generate_latest(registry).decode())
        info = {"run_id": "r1", "policy": "nd", "mode": "allreduce", "version": __version__}
        assert value(m, "dtlaunch_job_info", **info) == 1
        assert "dtlaunch_job_shards_done" not in {n for n, _ in m}  # nothing watched yet

        collector.watch(Job())
        m = samples_of(generate_latest(registry).decode())
        assert value(m, "dtlaunch_job_shards_done") == 30
        assert read_in == [runner_thread.ident]  # read on the loop, not in this thread

        loop.call_soon_threadsafe(time.sleep, 1.5)  # the loop is busy for 1.5 s
        time.sleep(0.05)
        began = time.monotonic()
        m = samples_of(generate_latest(registry).decode())
        assert time.monotonic() - began < 1.0  # the timeout, not the busy loop
        assert "dtlaunch_job_shards_done" not in {n for n, _ in m}
        assert value(m, "dtlaunch_supervisor_loop_lag_seconds") >= 0.3
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner_thread.join(5)
        loop.close()
    assert len(read_in) == 1  # the abandoned read was cancelled, not run late


def test_the_endpoint_serves_http_and_close_frees_its_port_and_thread():
    registry = CollectorRegistry()
    registry.register(Families(fake_reading()))
    endpoint = MetricsEndpoint(registry, address="127.0.0.1", port=0)
    assert endpoint.port > 0
    assert endpoint.url == f"http://127.0.0.1:{endpoint.port}/metrics"
    m = scrape(endpoint.url)
    assert value(m, "dtlaunch_worker_bpt_seconds", rank="1") == 0.4
    began = time.monotonic()
    endpoint.close()
    assert time.monotonic() - began < 2.0
    assert port_is_closed(endpoint.port)
    assert not [t for t in threading.enumerate() if t.name == f"metrics-{endpoint.port}"]


def test_a_port_in_use_is_refused_naming_the_fix():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            MetricsEndpoint(CollectorRegistry(), address="127.0.0.1", port=port)
    text = str(err.value)
    assert f"127.0.0.1:{port} is already in use" in text
    assert "--metrics-port 0" in text


def test_the_cli_refuses_a_bad_or_busy_port_before_anything_exists(tmp_path):
    run_dir = tmp_path / "run"
    result = runner.invoke(
        app, ["run", "--run-dir", str(run_dir), "--metrics-port", "70000", "train.py"]
    )
    assert result.exit_code == 2
    assert "--metrics-port must be a TCP port from 1 to 65535" in " ".join(result.stderr.split())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(
            app,
            ["run", "--run-dir", str(run_dir), "--output", "none", "train.py"],
            env={"DTLAUNCH_METRICS_PORT": str(port)},
        )
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{port} is already in use" in " ".join(result.stderr.split())
    assert not run_dir.exists()  # bound before the run directory is made


def test_the_port_is_kept_in_job_json_for_resume(tmp_path):
    spec = JobSpec(run_id="r1", run_dir=tmp_path / "run", script="t.py", metrics_port=9464)
    assert RunDir.create(spec.validate()).spec().metrics_port == 9464
    assert JobSpec.from_json(JobSpec(run_id="r2", run_dir=tmp_path, script="t").to_json()) == (
        JobSpec(run_id="r2", run_dir=tmp_path, script="t", metrics_port=None)
    )


@pytest.mark.parametrize(
    ("bind", "address"),
    [
        ("", "127.0.0.1"),
        ("10.0.0.5:0", "10.0.0.5"),
        ("tcp://[::1]:5555", "::1"),
        ("*:0", "0.0.0.0"),
    ],
)
def test_the_endpoint_listens_where_the_supervisor_is_bound(bind, address):
    assert metrics_address(bind) == address


def test_the_wal_tells_its_observer_each_fsync_and_survives_a_broken_one(tmp_path):
    seen: list[float] = []
    wal, _ = Wal.open(tmp_path / "wal", on_fsync=seen.append)
    with wal:
        wal.append(b"a")
        wal.append(b"b")
        assert wal.sync() == 2
        assert len(seen) == 1 and 0 < seen[0] < 5
        assert wal.sync() == 2  # nothing buffered: no fsync, nothing observed
        assert len(seen) == 1

    def broken(_seconds: float) -> None:
        raise RuntimeError("metrics bug")

    wal, recovered = Wal.open(tmp_path / "wal", on_fsync=broken)
    with wal:
        assert len(recovered.records) == 2
        wal.append(b"c")
        assert wal.sync() == 3  # durable all the same
        assert not wal.failed


STEP_S = 0.05  # each worker's step: 40 steps of 2 x 10 records train the 800


@pytest.mark.integration
def test_a_running_job_is_scraped_over_http_and_its_port_closes_at_its_end(tmp_path):
    run_dir = tmp_path / "run"
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    args = [
        "run", "--workers", "2", "--metrics-port", "0", "--run-dir", str(run_dir),
        "--output", "none", "--policy", "lb-bsp", "--control-interval", "1",
        "--dataset-size", "800", "--shard-size", "10", "--global-batch", "20",
        str(SCRIPTS / "dds_worker.py"), str(ledger), str(STEP_S),
    ]  # fmt: skip
    with started(args, env={}, log=tmp_path / "out.txt") as job:
        where = run_dir / "metrics.json"
        wait_until(where.exists, timeout=30, what="metrics.json")
        info = json.loads(where.read_text())
        url, port = info["url"], info["port"]
        assert url == f"http://127.0.0.1:{port}/metrics"

        def both_workers_stepping() -> bool:
            m = scrape(url)
            ranks = {dict(k)["rank"] for n, k in m if n == "dtlaunch_worker_bpt_seconds"}
            return ranks == {"0", "1"} and value(m, "dtlaunch_job_shards_done") > 0

        wait_until(both_workers_stepping, timeout=30, what="both workers' steps in the metrics")
        first = scrape(url)
        done_first = value(first, "dtlaunch_job_shards_done")
        later: list[Samples] = []

        def progressed() -> bool:
            later.append(scrape(url))
            return value(later[-1], "dtlaunch_job_shards_done") > done_first

        wait_until(progressed, timeout=20, what="more shards DONE in a later scrape")
        second = later[-1]
        assert job.wait(timeout=60) == 0, job.output()

    run_id = json.loads((run_dir / "job.json").read_text())["run_id"]
    planned = 80  # 800 records in shards of 10, one epoch
    for m in (first, second):
        labels = {"run_id": run_id, "policy": "lb-bsp", "mode": "allreduce"}
        assert labels.items() <= info_labels(m).items()
        assert value(m, "dtlaunch_job_shards_planned") == planned
        assert value(m, "dtlaunch_job_records_planned") == 800
        assert 0 < value(m, "dtlaunch_job_shards_done") <= planned
        assert value(m, "dtlaunch_job_records_done") == 10 * value(m, "dtlaunch_job_shards_done")
        depths = [
            value(m, "dtlaunch_dds_queue_shards", state=s) for s in ("todo", "leased", "done")
        ]
        assert sum(depths) == planned
        for rank in ("0", "1"):
            assert STEP_S <= value(m, "dtlaunch_worker_bpt_seconds", rank=rank) < 1.0
            assert value(m, "dtlaunch_worker_batch_size", rank=rank) > 0
            assert value(m, "dtlaunch_straggler", role="worker", rank=rank) in (0, 1)
            assert value(m, "dtlaunch_restarts_total", role="worker", rank=rank) == 0
        assert value(m, "dtlaunch_wal_fsync_seconds_count") > 0
        assert value(m, "dtlaunch_wal_fsync_seconds_sum") > 0
        assert value(m, "dtlaunch_process_cpu_seconds_total") > 0
        assert value(m, "dtlaunch_process_resident_memory_bytes") > 10e6
        assert value(m, "dtlaunch_policy_actions_total", action="ADJUST_BS") >= 0
    # Counters only grow (a DONE shard is counted before its fsync ends: >=, not >).
    for counter in ("dtlaunch_job_samples_trained_total", "dtlaunch_wal_fsync_seconds_count"):
        assert 0 < value(first, counter) <= value(second, counter)
    assert summary(run_dir)["shards_done"] == planned
    announced = [e for e in events(run_dir) if e["kind"] == "metrics_serving"]
    assert [e["port"] for e in announced] == [port]
    assert port_is_closed(port)
