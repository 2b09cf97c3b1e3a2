"""A new agent on a state dir kills a predecessor that still runs (found by pid
and start time, never by name), and never a process that merely reuses the pid."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from dtlaunch.agent.proctable import claim_agent_pid

OLD_AGENT = """
import sys, time
from pathlib import Path
from dtlaunch.agent.proctable import claim_agent_pid
claim_agent_pid(Path(sys.argv[1]))
print("claimed", flush=True)
time.sleep(60)
"""


def test_live_predecessor_is_killed_and_the_claim_moves(tmp_path):
    path = tmp_path / "agent.pid.json"
    old = subprocess.Popen(
        [sys.executable, "-c", OLD_AGENT, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert old.stdout is not None
        assert old.stdout.readline().strip() == "claimed"
        assert claim_agent_pid(path) == old.pid
        old.wait(timeout=5)  # psutil reaped it already (the test is its parent)
        assert not psutil.pid_exists(old.pid)
        assert json.loads(path.read_text())["pid"] == psutil.Process().pid
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
        old.stdout.close()


def test_a_reused_pid_is_never_touched(tmp_path):
    path = tmp_path / "agent.pid.json"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # The file names the bystander's pid but another start time: not our agent.
        path.write_text(json.dumps({"pid": bystander.pid, "create_time": time.time() - 3600}))
        assert claim_agent_pid(path) is None
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_no_file_means_nothing_to_kill(tmp_path):
    assert claim_agent_pid(tmp_path / "agent.pid.json") is None
    assert (tmp_path / "agent.pid.json").exists()
