"""A job's ``StatusSnapshot`` from its run directory alone (no supervisor needed).

For a job that has ended, or whose supervisor does not answer: the events of
``events.jsonl`` go through the same fold the live supervisor uses
(``supervisor.status_events``), and ``summary.json``, when written, has the last
word on the status, the job's duration and the shard counts.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dtlaunch.errors import RunDirError
from dtlaunch.events import Event, read_events
from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.supervisor.status.fold import StatusFold, lambda_of
from dtlaunch.wire.messages import StatusSnapshot

log = logging.getLogger(__name__)


def find_newest_run(runs: Path) -> Path:
    """The run directory under ``runs`` whose job started last.

    Raises:
        RunDirError: ``runs`` is missing or holds no run directory.
    """
    if not runs.is_dir():
        raise RunDirError(
            f"no {runs} folder here to pick the newest run from; pass RUN_DIR "
            "(the --run-dir of dtlaunch run), or run this where ./runs is"
        )
    candidates = [p for p in runs.iterdir() if (p / "job.json").is_file()]
    if not candidates:
        raise RunDirError(f"{runs} holds no run directory (none has a job.json); pass RUN_DIR")
    return max(candidates, key=lambda p: ((p / "job.json").stat().st_mtime, p.name))


def open_run(run_dir: Path) -> RunDir:
    """``run_dir`` as a run directory, or an error that names the fix.

    Raises:
        RunDirError: missing, not a directory, or not a dtlaunch run directory.
    """
    if not run_dir.exists():
        raise RunDirError(
            f"{run_dir} does not exist; pass the run directory of a job "
            "(./runs/<run-id> by default, or the --run-dir you gave dtlaunch run)"
        )
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory; pass a run directory like runs/<run-id>")
    return RunDir.open(run_dir)


def read_summary(run: RunDir) -> dict[str, Any] | None:
    """``summary.json`` of an ended job; None while it runs (or if unreadable)."""
    try:
        data = json.loads(run.summary_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("%s is unreadable (%s); status comes from the events", run.summary_path, err)
        return None
    return data if isinstance(data, dict) else None


# A fold in a background thread hands the GIL over this often (events): without
# it the thread running the asyncio loop got the GIL a few times a second and a
# live answer that came meanwhile waited for the whole fold (10 ms sleeps took
# up to 850 ms; every 100 events: 8 ms, for 6 % more fold time).
GIL_HANDOVER_EVERY = 100


def snapshot_from_run_dir(run: RunDir, *, in_background: bool = False) -> StatusSnapshot:
    """The job as its event log (and summary, once written) tells it
    (``in_background``: folded in a thread beside an event loop, which must stay
    responsive: the fold hands the GIL over now and then).

    Raises:
        RunDirError: the job has not started (no events.jsonl) or job.json is unreadable.
    """
    try:
        spec = run.spec()
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunDirError(f"{run.job_path} is unreadable: {err}") from err
    if not run.events_path.is_file():
        raise RunDirError(
            f"{run.path} has no events.jsonl yet: its job has not started "
            "(or dtlaunch run failed before it could); try again in a moment"
        )
    fold = StatusFold(run_id=spec.run_id, policy=spec.policy, mode=spec.mode)
    events = read_events(run.events_path)
    fold.emit_all(_handing_over_the_gil(events) if in_background else events)
    summary = read_summary(run)
    now = fold.now
    shards = None
    if summary is not None:
        fold.status = str(summary.get("status", fold.status))
        fold.phase = "done"
        jct = summary.get("jct_s")
        now = float(jct) if isinstance(jct, int | float) else now
        done, total = summary.get("shards_done"), summary.get("shards_total")
        if isinstance(done, int) and isinstance(total, int) and total > 0:
            shards = (done, total)
    stragglers = fold.ratio_stragglers(lambda_of(spec.policy), running_only=False)
    return fold.snapshot(now=now, source="events", stragglers=stragglers, shards=shards)


def _handing_over_the_gil(events: Iterable[Event]) -> Iterator[Event]:
    for count, event in enumerate(events):
        if count % GIL_HANDOVER_EVERY == 0:
            time.sleep(0)  # releases the GIL: a waiting thread takes it at once
        yield event
