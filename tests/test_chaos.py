"""The chaos harness (issue 12): real jobs hit by random faults at random
instants end with every record trained, none hung and nothing left behind.
The short run is part of ``make test``; the long one (>= 2,000 faults) of
``make test-slow``; ``benchmarks/results/chaos.json`` holds the published run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.jobs import REPO

pytestmark = pytest.mark.integration


def chaos(tmp_path, *args: str, timeout: float) -> dict:
    out = tmp_path / "chaos.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "chaos.py"), *args, "--out", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_fault_of_each_hard_kind_in_each_job_kind(tmp_path):
    """A supervisor SIGKILL (then --resume) in a DDS job, a server SIGKILL in a PS
    job, a worker SIGKILL in an allreduce job: each at a random instant in the
    first seconds. (The harness's quick check, in make test-slow; make test has a
    dedicated test of each fault: test_dds_resume, test_ps_failover, test_run_ssh.)"""
    plan = "dds:kill-supervisor,ps:kill-server,allreduce:kill-worker"
    result = chaos(tmp_path, "--plan", plan, "--trials", "3", "--baseline", "0", timeout=170)
    totals = result["totals"]
    assert totals == {
        "trials": 3, "faults": 3, "succeeded": 3, "hung": 0, "records_lost": 0, "left_behind": 0,
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_two_thousand_faults_without_a_hang_or_a_lost_record(tmp_path):
    result = chaos(
        tmp_path, "--faults-total", "2000", "--faults", "5", "--seed", "7", "--parallel", "2",
        timeout=4 * 3600,
    )  # fmt: skip
    totals = result["totals"]
    assert totals["faults"] >= 2000
    assert (totals["hung"], totals["records_lost"], totals["left_behind"]) == (0, 0, 0)
    assert totals["succeeded"] == totals["trials"]


NET_PLAN = ",".join(
    f"{job}:{cut}"
    for job in ("dds", "ps", "allreduce")
    for cut in ("cut-agent-2s", "cut-agent-30s")
)


@pytest.mark.slow
@pytest.mark.timeout(2 * 3600)
def test_network_cuts_of_2_and_30_s_in_every_job_kind(tmp_path):
    """Each job kind with a host's link cut for 2 s and for 30 s, three times
    each, over SSH on namespace hosts (``tests/netns.py``) with a spare: the 30 s
    cuts lose the host, move its workers and fence the stale attempts."""
    result = chaos(
        tmp_path, "--plan", NET_PLAN, "--trials", "18", "--seed", "5", "--parallel", "2",
        timeout=2 * 3600,
    )  # fmt: skip
    totals = result["totals"]
    assert (totals["hung"], totals["records_lost"], totals["left_behind"]) == (0, 0, 0)
    assert totals["succeeded"] == totals["trials"] == 18
    assert sum(row["fenced"] for row in result["by_fault"].values()) > 0
