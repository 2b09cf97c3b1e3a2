"""Commands that show a job: ``dtlaunch replay RUN_DIR [--follow] [--json] [--plot FILE]
[--policy NAME]``."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.text import Text

from dtlaunch.cli.app import err_console, fail
from dtlaunch.errors import ConfigError
from dtlaunch.events import Event, read_events
from dtlaunch.ui.timeline import (
    TimelineBuilder,
    render_line,
    render_summary,
    render_timeline,
    to_plain,
)

if TYPE_CHECKING:
    from dtlaunch.policy import WorkerDevice

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often --follow looks at the log
SUMMARY_GRACE_S = 15.0  # after job_end, how long --follow waits for summary.json


def _check_run_dir(run_dir: Path, *, follow: bool) -> Path:
    """The events.jsonl of ``run_dir``; exit 2 naming the fix when it is no run dir."""
    events = run_dir / "events.jsonl"
    if not run_dir.exists():
        raise fail(
            f"{run_dir} does not exist; pass the run directory of a job "
            "(./runs/<run-id> by default, or the --run-dir you gave dtlaunch run)"
        )
    if not run_dir.is_dir():
        raise fail(f"{run_dir} is not a directory; pass a run directory like runs/<run-id>")
    if not (run_dir / "job.json").is_file() and not events.is_file():
        raise fail(
            f"{run_dir} is not a dtlaunch run directory (no job.json, no events.jsonl); "
            "pass one like runs/<run-id> (or the --run-dir you gave dtlaunch run)"
        )
    if not events.is_file() and not follow:
        raise fail(
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


PLOT_FORMATS = (".png", ".svg", ".pdf")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _check_plot_path(path: Path) -> None:
    if path.suffix.lower() not in PLOT_FORMATS:
        raise fail(
            f"--plot {path}: name the picture with one of {', '.join(PLOT_FORMATS)}, "
            "e.g. --plot run.png"
        )
    if not path.parent.is_dir():
        raise fail(f"--plot {path}: folder {path.parent} does not exist; create it first")


def _warn_without_reports(events: list[Event], what: str) -> None:
    if not any(e.kind == "reports" for e in events):
        err_console.print(
            f"warning: this run's events hold no step reports, so {what} has no step "
            "data (the run ended before any step, or an older dtlaunch wrote it)",
            style="yellow",
            highlight=False,
        )


def _plot(run_dir: Path, events: list[Event], path: Path) -> None:
    from dtlaunch.ui.plots import plot_run

    job = _read_json(run_dir / "job.json")
    title = f"run {job.get('run_id', run_dir.name)}: policy {job.get('policy', '?')}, "
    title += f"{job.get('workers', '?')} workers"
    _warn_without_reports(events, "the plot")
    try:
        data = plot_run(events, path, title=title)
    except ConfigError as err:
        raise fail(str(err)) from None
    except OSError as err:
        raise fail(f"--plot {path}: cannot write it ({err})") from None
    err_console.print(
        f"plot written to {path} ({len(data.bpt)} workers, {len(data.markers)} actions)",
        highlight=False,
    )


def _host_devices(job: dict[str, Any]) -> dict[str, WorkerDevice]:
    """host -> its device as the run's hostfile declared it (for ``dd``, ``bmax=``);
    a host entry job.json does not hold as a ``HostSpec`` is left out."""
    from dtlaunch.errors import HostfileError
    from dtlaunch.hostfile import HostSpec
    from dtlaunch.supervisor.control import host_device

    devices: dict[str, WorkerDevice] = {}
    for entry in job.get("hosts") or []:
        try:
            host = HostSpec(**entry)
        except (TypeError, HostfileError):
            continue
        devices[host.label] = host_device(host)
    return devices


def _what_if(run_dir: Path, events: list[Event], policy: str, *, as_json: bool) -> None:
    from dtlaunch.ui.whatif import initial_remaining_steps, render_what_if, what_if

    job = _read_json(run_dir / "job.json")
    dataset = _read_json(run_dir / "dataset.json") or job
    spare = [
        str(h.get("label", ""))
        for h in job.get("hosts") or []
        if isinstance(h, dict) and h.get("spare")
    ]
    _warn_without_reports(events, "--policy")
    try:
        result = what_if(
            events,
            policy,
            control_interval=float(job.get("control_interval") or 10.0),
            tick_s=float(job.get("heartbeat_interval") or 1.0) / 2,
            recorded_policy=str(job.get("policy", "")),
            spare_hosts=spare,
            initial_remaining=initial_remaining_steps(dataset),
            host_devices=_host_devices(job),
        )
    except (ConfigError, ValueError) as err:
        raise fail(str(err)) from None
    if as_json:
        print(json.dumps(result.to_json(), indent=2, default=str))
        return
    _show(Console(highlight=False), render_what_if(result))


def replay(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of the job (runs/<run-id>).")],
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing events as a running job writes them."),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the events (with --policy: the what-if result) as JSON."
        ),
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE.png",
            help="Draw BPT and batch size per worker, global throughput with the "
            "actions, and shards against throughput per worker into FILE "
            "(.png, .svg or .pdf; needs pip install 'dtlaunch[plot]').",
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            metavar="NAME[:k=v,...]",
            help="What-if: re-run this policy over the recorded step reports and "
            "print the actions it would have taken beside those taken, "
            "e.g. nd:lambda=2.0.",
        ),
    ] = None,
) -> None:
    """Show a job's timeline: phases, failures, restarts, decisions, and a summary;
    draw it (--plot) or re-decide it with another policy (--policy)."""
    if follow and as_json:
        raise fail("--follow and --json do not go together; use one of them")
    if follow and (plot is not None or policy is not None):
        raise fail("--follow shows a live run; use --plot and --policy once it has ended")
    if plot is not None:
        _check_plot_path(plot)
    events_path = _check_run_dir(run_dir, follow=follow)
    console = Console(highlight=False)
    if follow:
        err_console.print(f"following {events_path} (Ctrl-C to stop)", style="dim")
        try:
            follow_run(run_dir, console)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return
    events = list(read_events(events_path))
    if plot is not None:
        _plot(run_dir, events, plot)
    if policy is not None:
        _what_if(run_dir, events, policy, as_json=as_json)
        return
    if plot is not None and not as_json:
        return
    if as_json:
        print("[" + ",\n".join(e.to_json() for e in events) + "]")
        return
    _show(console, render_timeline(events, _read_summary(run_dir)))
