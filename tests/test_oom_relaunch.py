"""Out of memory is not the end of a job (issue 16, after DLRover §5): a worker or
server that outgrows its memory limit is relaunched with twice the memory, over
real SSH, real agents and the kernel's own enforcement (a cgroup where the agent
can make one, RLIMIT_AS where it cannot), and every record is still trained."""

from __future__ import annotations

import pytest

from dtlaunch.agent.limits import LimitEnforcer
from tests.jobs import SCRIPTS, events, hostfile, run, summary
from tests.test_dds_jobs import dataset_args, ledger_counts

pytestmark = pytest.mark.integration

HOG = str(SCRIPTS / "memory_hog.py")
M = 1 << 20
RECORDS = 240

SUPPORT = LimitEnforcer.detect(dry_run=True).support
needs_memory_cgroup = pytest.mark.skipif(
    not SUPPORT.memory.startswith("cgroup"),
    reason=f"no writable memory cgroup on this machine: {SUPPORT.detail}",
)


def oom_job(sshd, tmp_path, *options: str, hog: str, hog_mb: int, hosts=None):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    argv = [
        "run", "-H", str(hostfile(sshd, tmp_path / "hosts", hosts)), "--workers", "2",
        "--run-dir", str(tmp_path / "run"), *options, *dataset_args(RECORDS, 10, 1, 4),
        HOG, str(ledger), "0.02", hog, str(hog_mb),
    ]  # fmt: skip
    return run(argv, env=sshd.env(), timeout=180), ledger


def limit_changes(tmp_path):
    return [
        (e["role"], e["rank"], e["old"], e["new"], e["reason"])
        for e in events(tmp_path / "run")
        if e["kind"] == "memory_limit"
    ]


def spawned_limits(tmp_path, proc):
    role, rank = proc.split(":")
    return [
        (e["attempt"], e.get("memory_limit", 0))
        for e in events(tmp_path / "run")
        if e["kind"] == "spawn" and e["role"] == role and e["rank"] == int(rank)
    ]


@needs_memory_cgroup
def test_a_worker_killed_at_its_cgroup_limit_runs_again_with_twice_the_memory(sshd, tmp_path):
    result, ledger = oom_job(sshd, tmp_path, "--memory-limit", "160M", hog="worker:1", hog_mb=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert limit_changes(tmp_path) == [("worker", 1, 160 * M, 320 * M, "killed by the OOM killer")]
    # Allreduce: the group restarts; only the worker that ran out gets more memory.
    assert spawned_limits(tmp_path, "worker:1") == [(0, 160 * M), (1, 320 * M)]
    assert spawned_limits(tmp_path, "worker:0") == [(0, 160 * M), (1, 160 * M)]
    assert set(ledger_counts(ledger)) == set(range(RECORDS))
    assert "killed by the OOM killer at its limit of 160.0 MiB" in result.stderr + result.stdout


@needs_memory_cgroup
def test_a_script_server_killed_at_its_limit_runs_again_with_twice_the_memory(sshd, tmp_path):
    result, ledger = oom_job(
        sshd, tmp_path, "--servers", "1", "--ps-server", "script", "--memory-limit", "160M",
        hog="server:0", hog_mb=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert limit_changes(tmp_path) == [("server", 0, 160 * M, 320 * M, "killed by the OOM killer")]
    assert spawned_limits(tmp_path, "server:0") == [(0, 160 * M), (1, 320 * M)]
    assert set(ledger_counts(ledger)) == set(range(RECORDS))


def test_without_cgroups_the_address_space_limit_and_memory_error_do_the_same(sshd, tmp_path):
    # RLIMIT_AS counts address space, which Python's threads and arenas reserve
    # generously: a limit of a few hundred MiB would not even start it.
    result, ledger = oom_job(
        sshd, tmp_path, "--limits-via", "rlimit", "--memory-limit", "1G",
        hog="worker:1", hog_mb=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert limit_changes(tmp_path) == [("worker", 1, 1024 * M, 2048 * M, "MemoryError")]
    assert set(ledger_counts(ledger)) == set(range(RECORDS))
    agents = [e for e in events(tmp_path / "run") if e["kind"] == "agent_up"]
    assert {e["limits"] for e in agents} == {"memory rlimit, cpu affinity"}


@needs_memory_cgroup
def test_running_out_at_the_memory_the_host_declares_fails_the_job_with_the_numbers(sshd, tmp_path):
    a, b, _ = sshd.addresses
    result, _ = oom_job(
        sshd, tmp_path, hog="worker:1", hog_mb=300,
        hosts=[f"{a} slots=1 mem=4G", f"{b} slots=1 mem=192M"],
    )  # fmt: skip
    assert result.returncode != 0
    assert limit_changes(tmp_path) == []
    [failure] = [e for e in events(tmp_path / "run") if e["kind"] == "failure"]
    assert not failure["retryable"]
    assert failure["error"].startswith(
        f"worker-1 ran out of memory at 192.0 MiB, already the memory of {b} (192.0 MiB)"
    )
    assert "mem= in the hostfile" in summary(tmp_path / "run")["reason"]
    assert "ran out of memory" in result.stderr
