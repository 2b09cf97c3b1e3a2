"""``dtlaunch status [RUN_DIR]``: watch a job, live or after it ended.

The client connects to the supervisor's ROUTER with the run's CURVE client key
(like ``dtlaunch stop``) under the identity ``status:<pid>`` and sends only
``StatusRequest``; the supervisor answers nothing else from such a peer. When
the job has ended, or its supervisor does not answer within ``--timeout``, the
snapshot comes from the run directory's event log, and the screen says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import termios
import tty
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from dtlaunch.cli.app import fail
from dtlaunch.errors import DtlaunchError, RunDirError

if TYPE_CHECKING:  # the rest loads when the command runs: the CLI starts quicker
    from dtlaunch.supervisor.rundir import RunDir
    from dtlaunch.wire.messages import StatusSnapshot

REFRESH_S = 0.5  # about twice a second
QUIT_KEYS = b"qQ"


def _resolve(run_dir: Path | None) -> RunDir:
    from dtlaunch.ui.status_model import find_newest_run, open_run

    try:
        return open_run(run_dir if run_dir is not None else find_newest_run(Path("runs")))
    except RunDirError as err:
        raise fail(err) from None


async def _once(run: RunDir, wait_s: float) -> tuple[StatusSnapshot, str]:
    from dtlaunch.jobclient import StatusSource

    source = StatusSource(run, timeout=wait_s)
    try:
        return await source.current()
    finally:
        source.close()


async def _live(run: RunDir, console: Console, wait_s: float, keys_fd: int | None) -> None:
    from rich.live import Live

    from dtlaunch.jobclient import StatusSource
    from dtlaunch.ui.status_view import render_status

    source = StatusSource(run, timeout=wait_s)
    quit_requested = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_key() -> None:
        assert keys_fd is not None
        try:
            pressed = os.read(keys_fd, 64)
        except OSError:
            return
        if not pressed or any(k in QUIT_KEYS for k in pressed):  # EOF counts as quit too
            quit_requested.set()

    if keys_fd is not None:
        loop.add_reader(keys_fd, on_key)
    quitting = asyncio.ensure_future(quit_requested.wait())
    try:
        with Live(console=console, screen=True, auto_refresh=False, transient=True) as live:
            while not quit_requested.is_set():
                fetch = asyncio.ensure_future(source.current())
                await asyncio.wait({fetch, quitting}, return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():
                    fetch.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await fetch
                    break
                snap, note = fetch.result()
                width, height = console.size
                footer = "q quits" if keys_fd is not None else "Ctrl-C quits"
                note = f"{note}  ({footer})" if note else footer
                screen = render_status(snap, note=note, width=width, height=height)
                live.update(screen, refresh=True)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(REFRESH_S):
                        await quit_requested.wait()
    finally:
        quitting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await quitting
        if keys_fd is not None:
            loop.remove_reader(keys_fd)
        source.close()


def _run_live(run: RunDir, timeout: float) -> None:
    console = Console(highlight=False)
    fd: int | None = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    try:
        if fd is not None:
            tty.setcbreak(fd)  # keys one at a time, no echo; Ctrl-C still interrupts
        asyncio.run(_live(run, console, timeout, fd))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except DtlaunchError as err:
        raise fail(err) from None
    finally:
        if fd is not None and saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def status(
    run_dir: Annotated[
        Path | None,
        typer.Argument(help="Run directory of the job (default: the newest under ./runs)."),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Print one plain-text frame and exit.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the snapshot as JSON and exit.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(help="Seconds to wait for the supervisor before reading the event log."),
    ] = 2.0,
) -> None:
    """Watch a job: progress, every worker and server, stragglers, actions (q quits)."""
    if once and as_json:
        raise fail("--once and --json do not go together; use one of them")
    if timeout <= 0:
        raise fail(f"--timeout must be > 0 seconds, got {timeout:g}")
    run = _resolve(run_dir)
    if not (once or as_json):
        _run_live(run, timeout)
        return
    try:
        snap, note = asyncio.run(_once(run, timeout))
    except DtlaunchError as err:
        raise fail(err) from None
    if as_json:
        data = dataclasses.asdict(snap)
        data["note"] = note
        print(json.dumps(data, indent=2))
        return
    from dtlaunch.ui.status_view import render_status
    from dtlaunch.ui.timeline import to_plain

    console = Console(highlight=False)
    frame = render_status(snap, note=note, width=console.width)
    if console.is_terminal:
        console.print(frame)
    else:  # plain text: no colour, no padding after the last character of a line
        sys.stdout.write(to_plain(frame, width=console.width))
