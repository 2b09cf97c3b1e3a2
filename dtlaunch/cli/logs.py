"""``dtlaunch logs RUN_DIR [ROLE [RANK]] [-f] [--attempt K] [--grep RE]``: a job's
process logs with the live console's prefixes (``dtlaunch.ui.logs`` reads them)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from dtlaunch.cli.app import err_console, fail
from dtlaunch.cli.replay import POLL_S, SUMMARY_GRACE_S, EventTail
from dtlaunch.deadstream import silence
from dtlaunch.errors import DtlaunchError
from dtlaunch.ui.logs import RunLogs, follow_logs, parse_selection, print_logs

EXIT_NO_MATCH = 1  # as grep: --grep matched no line
EXIT_BROKEN_PIPE = 141  # as a shell reports a writer killed by SIGPIPE (| head)


class JobEndWatch:
    """Whether a job has ended, by the rule of ``dtlaunch replay --follow``: its
    ``job_end`` event, then ``summary.json`` (written after the logs are closed),
    or :data:`SUMMARY_GRACE_S` seconds after ``job_end`` without one."""

    def __init__(self, run_dir: Path) -> None:
        self._summary = run_dir / "summary.json"
        self._events = EventTail(run_dir / "events.jsonl")
        self._job_end_at: float | None = None

    def __call__(self) -> bool:
        if self._summary.is_file():
            return True
        if self._job_end_at is None and any(e.kind == "job_end" for e in self._events.read_new()):
            self._job_end_at = time.monotonic()
        return self._job_end_at is not None and (
            time.monotonic() - self._job_end_at > SUMMARY_GRACE_S
        )


def logs(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of the job (runs/<run-id>).")],
    role: Annotated[
        str | None,
        typer.Argument(help="worker, server or agent; absent: every worker and server."),
    ] = None,
    rank: Annotated[
        str | None,
        typer.Argument(help="The worker's or server's rank, or the agent's host; absent: all."),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print new lines as they are written, until the job has ended or Ctrl-C.",
        ),
    ] = False,
    attempt: Annotated[
        int | None,
        typer.Option(
            "--attempt",
            metavar="K",
            min=0,
            help="Only attempt K of each process (0 is the first start, 1 the first restart).",
        ),
    ] = None,
    grep: Annotated[
        str | None,
        typer.Option(
            "--grep",
            metavar="RE",
            help="Only lines that match this Python regular expression (searched, "
            "case-sensitive, without the prefix).",
        ),
    ] = None,
) -> None:
    """Print a job's process logs with the prefixes of the live console.

    Each line begins with its process and host in square brackets, as on the live
    console (worker0@node1); the host is that of the attempt that wrote the line.
    The logs are read from RUN_DIR/logs, the local copies the supervisor writes: the
    agents send every process's output to it and the hosts keep no other copy, so no
    host is contacted.

    Without ROLE, the logs of every worker and server are printed one process after
    another (workers by rank, then servers), each under a ==> worker 0: FILE <== header:
    the lines carry no times, so they cannot be merged in time order. ROLE alone shows
    all of its processes; agent shows the agents' own logs (RANK: the host).

    A restarted process writes on in its log: each attempt begins with a line
    "=== dtlaunch: worker-1 attempt 1 on HOST pid PID at TIME ===", and --attempt K
    shows attempt K alone.

    With --follow, what is there is printed first, then the new lines of every selected
    process (those that start later too) as they arrive, interleaved as on the live
    console, like tail -f. It ends by itself once the job has ended (as replay --follow
    decides), or at Ctrl-C.

    Exit status: 0; 1 when --grep matched no line; 2 for a bad argument, a missing run
    directory, or a rank the run does not have; 130 after Ctrl-C.
    """
    try:
        selection = parse_selection(role, rank, attempt=attempt, grep=grep)
        run = RunLogs.open(run_dir)
        if follow:
            err_console.print(f"following {run.logs_dir} (Ctrl-C to stop)", style="dim")
            follow_logs(run, selection, sys.stdout, job_ended=JobEndWatch(run_dir), poll_s=POLL_S)
            return
        printed = print_logs(run, selection, sys.stdout)
        sys.stdout.flush()
    except DtlaunchError as err:
        raise fail(err) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:
        # The reader went away (| head): stop quietly.
        silence(sys.stdout)
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    if grep is not None and printed == 0:
        raise typer.Exit(EXIT_NO_MATCH)
