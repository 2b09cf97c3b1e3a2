"""``dtlaunch check -H FILE``: the pre-flight of every host (``dtlaunch.preflight``)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from dtlaunch.cli.app import err_console, fail, setup_logging
from dtlaunch.config import DEFAULT_SSH_CONCURRENCY
from dtlaunch.errors import DtlaunchError
from dtlaunch.hostfile import load_hosts
from dtlaunch.version import __version__

__all__ = ["check"]


def check(
    hosts: Annotated[
        str, typer.Option("--hosts", "-H", envvar="DTLAUNCH_HOSTS", help="Hostfile or inline list.")
    ],
    python: Annotated[
        str | None, typer.Option(envvar="DTLAUNCH_PYTHON", help="Python interpreter on hosts.")
    ] = None,
    workdir: Annotated[
        str | None, typer.Option(envvar="DTLAUNCH_WORKDIR", help="Working directory on hosts.")
    ] = None,
    ssh_config: Annotated[
        list[Path] | None,
        typer.Option(envvar="DTLAUNCH_SSH_CONFIG", help="ssh_config file (default ~/.ssh/config)."),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(help="Seconds per host, counted from its turn (see --ssh-concurrency)."),
    ] = 20.0,
    ssh_concurrency: Annotated[
        int,
        typer.Option(
            envvar="DTLAUNCH_SSH_CONCURRENCY",
            help="Hosts checked at once; the others wait their turn.",
        ),
    ] = DEFAULT_SSH_CONCURRENCY,
) -> None:
    """Check every host in parallel: ssh, host key, python, dtlaunch, workdir, ports,
    capacity (CPUs, memory) and how limits would be enforced."""
    setup_logging(False)
    from dtlaunch.preflight import check_hosts, render_checks
    from dtlaunch.sshconn import SshOptions

    try:
        host_specs = load_hosts(hosts)
        options = SshOptions(config_paths=tuple(p.expanduser() for p in ssh_config or []))
        results = asyncio.run(
            check_hosts(
                host_specs,
                options,
                python=python or sys.executable,
                workdir=workdir or os.getcwd(),
                expected_version=__version__,
                timeout=timeout,
                concurrency=ssh_concurrency,
            )
        )
    except DtlaunchError as err:
        raise fail(err) from None
    Console().print(render_checks(results))
    failed = [r for r in results if not r.ok]
    if failed:
        err_console.print(f"[red]{len(failed)} of {len(results)} host(s) failed the check[/]")
        raise typer.Exit(1)
