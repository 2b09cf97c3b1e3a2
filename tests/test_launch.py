"""``dtlaunch.launch``: the same job as ``dtlaunch run``, from Python."""

from __future__ import annotations

import asyncio
import json

import pytest

import dtlaunch
from dtlaunch.errors import ConfigError, JobFailed
from tests.jobs import SCRIPTS
from tests.launch_target import write_rank

pytestmark = pytest.mark.integration


def test_a_function_runs_in_every_worker_even_from_a_running_event_loop(tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    async def in_a_notebook() -> dtlaunch.LaunchResult:
        # Jupyter runs cells inside an event loop; asyncio.run() would refuse there.
        return dtlaunch.launch(
            write_rank, [str(out), {"lr": 1}], workers=2, run_dir=tmp_path / "run", output="none"
        )

    result = asyncio.run(in_a_notebook())
    assert callable(dtlaunch.launch)  # still the function after the launcher was imported
    assert result.summary["status"] == "succeeded"
    assert result.run_dir == tmp_path / "run"
    written = [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]
    assert written == [{"rank": r, "world": 2, "tag": {"lr": 1}} for r in range(2)]


def test_a_failed_job_raises_with_its_root_cause(tmp_path):
    with pytest.raises(JobFailed) as caught:  # paths as str, as most callers write them
        dtlaunch.launch(
            str(SCRIPTS / "needs_env.py"),
            max_restarts=0,
            run_dir=str(tmp_path / "run"),
            output="none",
        )
    failed = caught.value
    assert failed.summary["status"] == "failed" and failed.run_dir == tmp_path / "run"
    assert "root cause worker0 on localhost" in str(failed)
    assert "DTLAUNCH_TEST_NEVER_SET" in str(failed)


@pytest.mark.parametrize(
    ("target", "kwargs", "message"),
    [
        ("t.py", {"worker": 2}, "no option 'worker'; did you mean workers=?"),
        (lambda: None, {}, "define it at the top level of a module"),
        (write_rank, {"args": [object()]}, "pass numbers, strings, lists and dicts"),
        ("t.py", {"workers": 0}, "--workers must be at least 1"),
    ],
)
def test_bad_requests_raise_before_anything_starts(tmp_path, target, kwargs, message):
    with pytest.raises(ConfigError) as caught:
        dtlaunch.launch(target, run_dir=tmp_path / "run", **kwargs)
    assert message in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_the_supervisors_collector_settings_are_undone_after_the_job():
    # dtlaunch.launch runs the supervisor inside the caller's process: its
    # collector settings (rarer young collections, startup objects frozen) must
    # not outlive the job.
    import gc

    from dtlaunch.supervisor.job import GC_YOUNG_THRESHOLD, collector_for_a_supervisor

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with collector_for_a_supervisor():
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
        assert gc.get_freeze_count() > frozen
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
