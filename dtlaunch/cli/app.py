"""The ``dtlaunch`` Typer app, its global options, logging, and the one way a
command reports an error."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from dtlaunch.deadstream import silence
from dtlaunch.version import __version__

__all__ = ["app", "err_console", "fail", "setup_logging"]

app = typer.Typer(
    name="dtlaunch",
    help="Launch and supervise distributed training on plain SSH clusters.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


class _TerminalConsole(Console):
    """A Console that outlives its terminal. Rich's answer to a broken pipe is
    ``SystemExit(1)`` from whatever printed, and a log line is printed from
    anywhere: a supervisor whose terminal closed (a dropped ssh session, a
    killed ``| tee``) died at its next log line, its job left to the agents'
    orphan timeout. Here the console falls silent instead: its file is pointed
    at /dev/null and the job goes on (its events and the processes' logs are in
    the run directory)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence(self.file)


err_console = _TerminalConsole(stderr=True)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False, rich_tracebacks=False)],
    )
    # asyncssh is chatty at INFO (one line per channel); its errors still show.
    logging.getLogger("asyncssh").setLevel(logging.WARNING)


def fail(err: object, code: int = 2) -> typer.Exit:
    """Print ``error: <err>`` on stderr and return the Exit to raise.

    The message is the user's own text as often as ours (a path, a hostfile line,
    an --env value), so it is never read as Rich markup: ``[/]`` prints as is.
    """
    err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False)
    return typer.Exit(code)


def _version_callback(value: bool) -> None:
    if value:
        print(f"dtlaunch {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """dtlaunch: torchrun-compatible launcher with straggler mitigation, over SSH."""
