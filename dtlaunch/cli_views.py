"""Commands that show a job: ``dtlaunch replay RUN_DIR [--follow] [--json]``."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.text import Text

from dtlaunch.events import Event, read_events
from dtlaunch.ui.timeline import (
    TimelineBuilder,
    render_line,
    render_summary,
    render_timeline,
    to_plain,
)

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often --follow looks at the log
SUMMARY_GRACE_S = 15.0  # after job_end, how long --follow waits for summary.json

_err = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(2)


def _check_run_dir(run_dir: Path, *, follow: bool) -> Path:
    """The events.jsonl of ``run_dir``; exit 2 naming the fix when it is no run dir."""
    events = run_dir / "events.jsonl"
    if not run_dir.exists():
        raise _fail(
            f"{run_dir} does not exist; pass the run directory of a job "
            "(./runs/<run-id> by default, or the --run-dir you gave dtlaunch run)"
        )
    if not run_dir.is_dir():
        raise _fail(f"{run_dir} is not a directory; pass a run directory like runs/<run-id>")
    if not (run_dir / "job.json").is_file() and not events.is_file():
        raise _fail(
            f"{run_dir} is not a dtlaunch run directory (no job.json, no events.jsonl); "
            "pass one like runs/<run-id> (or the --run-dir you gave dtlaunch run)"
        )
    if not events.is_file() and not follow:
        raise _fail(
            f"{run_dir} has no events.jsonl yet: its job has not started; "
            f"use dtlaunch replay --follow {run_dir} to wait for it"
        )
    return events


def _show(console: Console, renderable: RenderableType) -> None:
    """Colour on a terminal; into a pipe, plain lines without the padding of rich
    tables, flushed at once so that a reader of --follow sees every line as it comes."""
    if console.is_terminal:
        console.print(renderable)
        return
    sys.stdout.write(to_plain(renderable, width=console.width))
    sys.stdout.flush()


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("%s is unreadable (%s); the summary comes from the events", path, err)
        return None
    return data if isinstance(data, dict) else None


class EventTail:
    """Reads the events appended to a log since the last call, like ``tail -f``.

    A line without its newline yet is kept back until the writer finishes it; a
    line that is complete but not an event (a torn write before a crash) is skipped.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[Event]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        events: list[Event] = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                events.append(Event.from_json(raw.decode("utf-8")))
            except (ValueError, KeyError, TypeError):
                log.warning("%s: skipping a malformed event line", self.path)
        return events


def follow_run(run_dir: Path, console: Console, *, poll_s: float = POLL_S) -> None:
    """Print a run's timeline as its events arrive; return once it has ended.

    The end is a ``job_end`` followed by ``summary.json`` (written just after), or
    a ``job_end`` and :data:`SUMMARY_GRACE_S` seconds without a summary.
    """
    tail = EventTail(run_dir / "events.jsonl")
    builder = TimelineBuilder()
    ended_at: float | None = None
    while True:
        new = tail.read_new()
        for event in new:
            for line in builder.add(event):
                _show(console, render_line(line))
        if not new:
            # Quiet log: show the folded routine lines now rather than later.
            for line in builder.flush():
                _show(console, render_line(line))
        if builder.ended is None:
            ended_at = None
        else:
            ended_at = ended_at or time.monotonic()
            if (run_dir / "summary.json").is_file() or (
                time.monotonic() - ended_at > SUMMARY_GRACE_S
            ):
                break
        time.sleep(poll_s)
    for event in tail.read_new():  # a last look: nothing may follow job_end, but be sure
        for line in builder.add(event):
            _show(console, render_line(line))
    for line in builder.flush():
        _show(console, render_line(line))
    _show(console, Text(""))
    _show(console, render_summary(builder, _read_summary(run_dir)))


def register(app: typer.Typer) -> None:
    """Add the ``replay`` command to ``app``."""

    @app.command()
    def replay(
        run_dir: Annotated[Path, typer.Argument(help="Run directory of the job (runs/<run-id>).")],
        follow: Annotated[
            bool,
            typer.Option(
                "--follow", "-f", help="Keep printing events as a running job writes them."
            ),
        ] = False,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the events as one JSON array.")
        ] = False,
    ) -> None:
        """Show a job's timeline: phases, failures, restarts, decisions, and a summary."""
        if follow and as_json:
            raise _fail("--follow and --json do not go together; use one of them")
        events_path = _check_run_dir(run_dir, follow=follow)
        console = Console(highlight=False)
        if follow:
            _err.print(f"following {events_path} (Ctrl-C to stop)", style="dim")
            try:
                follow_run(run_dir, console)
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            return
        events = list(read_events(events_path))
        if as_json:
            print("[" + ",\n".join(e.to_json() for e in events) + "]")
            return
        _show(console, render_timeline(events, _read_summary(run_dir)))
