"""The local agent launcher (found by benchmarks/chaos.py): an agent killed in
its first instant, before it read its bootstrap, is an agent that died, which
the node table retries, not a launch failure that ends the job."""

from __future__ import annotations

import stat

from dtlaunch.supervisor.launcher import _start_local_agent


def test_an_agent_that_dies_before_reading_its_bootstrap_is_returned_not_raised(tmp_path):
    dies = tmp_path / "python"
    dies.write_text("#!/bin/sh\nexit 9\n")  # stands in for a python killed at once
    dies.chmod(dies.stat().st_mode | stat.S_IXUSR)
    with (tmp_path / "agent.log").open("ab") as log:
        # More than a pipe holds: the write can only end when the reader is gone.
        popen = _start_local_agent(str(dies), log, b"x" * (1 << 20))
    assert popen.wait(10) == 9  # its exit is what the supervisor's watcher reports
