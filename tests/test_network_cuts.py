"""A host's network link cut mid-job, on hosts in network namespaces (issue 12).

Three hosts run sshd in their own namespaces (``tests/netns.py``); the third is a
``spare``. A DDS job with one worker on each of the first two trains a ledger of
record ids (``benchmarks/chaos_worker.py``). The cut takes a host's link down:
every packet to and from it is dropped, TCP connections stay open.

* 2 s (shorter than anything that declares a host lost): nothing restarts, no
  record is lost.
* 30 s (past the SSH keepalives): the host is lost, its worker restarts on the
  spare, and relaunching an agent on the cut host fails and is retried instead
  of failing the job. When the link comes back the old agent is heard again and
  its stale worker is stopped (fenced) at once, so rank 1 does not run twice.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.jobs import REPO, events, started, summary, wait_for_event, wait_until
from tests.netns import NetnsCluster, NetnsUnavailable, running_cluster
from tests.test_dds_jobs import ledger_counts

pytestmark = pytest.mark.integration

WORKER = REPO / "benchmarks" / "chaos_worker.py"
RECORDS_30S = 7000


@pytest.fixture
def cluster() -> Iterator[NetnsCluster]:
    try:
        with running_cluster(3) as hosts:
            yield hosts
    except NetnsUnavailable as err:
        pytest.fail(f"network namespace hosts: {err}")


def _job(cluster: NetnsCluster, tmp_path: Path, records: int, step_s: float) -> list[str]:
    hosts = tmp_path / "hosts"
    a, b, spare = cluster.addresses
    hosts.write_text(f"{a} slots=1\n{b} slots=1\n{spare} slots=1 spare\n")
    (tmp_path / "ledger").mkdir()
    return [
        "run", "-H", str(hosts), "--workers", "2", "--restart-scope", "process",
        "--run-dir", str(tmp_path / "run"),
        "--dataset-size", str(records), "--shard-size", "50", "--global-batch", "20",
        "--epochs", "1", "--heartbeat-interval", "0.5", "--dead-after", "4",
        "--kill-grace", "2", "--orphan-timeout", "45", "--output", "none",
        str(WORKER), "dds", str(tmp_path / "ledger"), str(step_s),
    ]  # fmt: skip


def _workers_in(cluster: NetnsCluster, address: str) -> list[int]:
    found = []
    for pid in cluster.pids(address):
        try:
            if "chaos_worker.py" in " ".join(psutil.Process(pid).cmdline()):
                found.append(pid)
        except psutil.Error:
            continue
    return found


def _training(run_dir: Path, rank: int) -> None:
    wait_for_event(
        run_dir,
        lambda e: e["kind"] == "shards_done" and e.get("rank") == rank,
        timeout=60,
        what=f"worker {rank} finishing a shard",
    )


def test_a_two_second_cut_costs_nothing(cluster: NetnsCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with started(
        _job(cluster, tmp_path, 1200, 0.05), env=cluster.env(), log=tmp_path / "out.log"
    ) as job:
        _training(run_dir, 1)
        victim = cluster.addresses[1]
        cluster.cut(victim)
        time.sleep(2.0)
        cluster.heal(victim)
        assert job.wait(120) == 0, job.output()
    kinds = collections.Counter(e["kind"] for e in events(run_dir))
    assert kinds["agent_lost"] == 0 and kinds["restart"] == 0 and kinds["fenced"] == 0, kinds
    trained = ledger_counts(tmp_path / "ledger")
    assert [r for r in range(1200) if trained[r] == 0] == []
    assert summary(run_dir)["status"] == "succeeded"
    wait_until(
        lambda: not any(cluster.pids(a) for a in cluster.addresses),
        timeout=10,
        what="every agent and worker to leave the hosts",
    )


@pytest.mark.slow  # about 70 s; the state machine's part runs in make test (test_jobstate)
def test_a_host_cut_off_for_30_s_is_replaced_by_the_spare_then_fenced(
    cluster: NetnsCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    victim, spare = cluster.addresses[1], cluster.addresses[2]
    # About 50 s of training for two workers: it outlasts the cut and the fencing.
    with started(
        _job(cluster, tmp_path, RECORDS_30S, 0.15), env=cluster.env(), log=tmp_path / "out.log"
    ) as job:
        _training(run_dir, 1)
        [stale] = _workers_in(cluster, victim)
        cluster.cut(victim)
        cut_at = time.monotonic()
        moved = wait_for_event(
            run_dir, lambda e: e["kind"] == "moved", timeout=40, what="rank 1 moving to the spare"
        )
        assert (moved["rank"], moved["old_host"], moved["new_host"]) == (1, victim, spare)
        wait_until(lambda: _workers_in(cluster, spare) != [], timeout=20, what="rank 1 on spare")
        time.sleep(max(0.0, 30.0 - (time.monotonic() - cut_at)))
        assert psutil.pid_exists(stale)  # the cut host cannot have been told to stop it
        cluster.heal(victim)
        healed = time.monotonic()
        wait_until(lambda: not psutil.pid_exists(stale), timeout=15, what="the stale worker gone")
        fenced_within = time.monotonic() - healed
        assert job.wait(180) == 0, job.output()
    log = events(run_dir)
    # Fenced either way: its old agent heard again (its attempts are killed) or
    # a new agent launched there (it stops its predecessor's first).
    [fence] = [e for e in log if e["kind"] == "fenced"]
    assert (fence["host"], fence["rank"], fence["attempt"]) == (victim, 1, 0)
    assert any(e["kind"] == "agent_relaunch_failed" and e["host"] == victim for e in log)
    assert fenced_within < 10.0
    # The stale attempt wrote nothing once it was fenced: its ledger is older.
    stale_ledger = tmp_path / "ledger" / "1-0.txt"
    assert stale_ledger.stat().st_mtime <= fence["wall"] + 0.5
    trained = ledger_counts(tmp_path / "ledger")
    assert [r for r in range(RECORDS_30S) if trained[r] == 0] == []
    assert summary(run_dir)["status"] == "succeeded"
    wait_until(
        lambda: not any(cluster.pids(a) for a in cluster.addresses),
        timeout=15,
        what="every agent and worker to leave the hosts",
    )
