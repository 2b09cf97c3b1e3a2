"""Process titles: ``ps`` tells a job's supervisor, agent, servers and workers apart."""

from __future__ import annotations

import contextlib
import textwrap

import psutil
import pytest

from tests.jobs import started, summary, wait_until

pytestmark = pytest.mark.integration

# Waits for the test to look at the process titles, then trains its shards.
WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import dtlaunch

    out = Path(sys.argv[1])
    job = dtlaunch.init()
    (out / "ready").touch()
    deadline = time.monotonic() + 60
    while not (out / "done").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in job.batches():
        job.step()
    job.close()
    """
)


def test_every_process_of_a_job_names_its_run_role_and_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    args = [
        "run", "--workers", "1", "--servers", "1", "--run-dir", str(run_dir),
        "--dataset-size", "8", "--shard-size", "4", "--global-batch", "2",
        str(script), str(out), "--flag",
    ]  # fmt: skip
    with started(args, env={}, log=tmp_path / "log") as job:
        supervisor = psutil.Process(job.proc.pid)

        def titles() -> list[str]:
            found = []
            for proc in [supervisor, *supervisor.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    found.append(" ".join(proc.cmdline()))
            return found

        # The worker is named in dtlaunch.init(); the server once it has imported torch.
        wait_until(lambda: (out / "ready").exists(), timeout=60, what="dtlaunch.init()")
        wait_until(
            lambda: any(t.startswith("dtlaunch server") for t in titles()),
            timeout=60,
            what="the server to name itself",
        )
        seen = titles()
        (out / "done").touch()
        assert job.wait(60) == 0, job.output()
    run_id = summary(run_dir)["run_id"]
    expected = [
        f"dtlaunch supervisor {run_dir} run={run_id}",
        f"dtlaunch agent host=localhost run={run_id}",
        f"dtlaunch server 0 run={run_id}",
        f"dtlaunch worker 0@0 run={run_id}: python {script} {out} --flag",
    ]
    for title in expected:
        assert sum(t.startswith(title) for t in seen) == 1, (title, seen)
