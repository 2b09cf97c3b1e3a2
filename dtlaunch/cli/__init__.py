"""The ``dtlaunch`` command line: options in, a ``JobSpec`` (or a run directory)
out, handed to the layers below. No job logic lives here.

- ``app``       the Typer app, global options, logging, ``fail`` (the one error path)
- ``run``       ``dtlaunch run`` (and ``--resume``); ``dtlaunch.config.RunOptions``
                resolves its options into the ``JobSpec``
- ``jobfile``   ``dtlaunch run --config job.toml`` and ``--print-config``: the job
                file as the command's defaults, and where each value came from
- ``hosts``     ``dtlaunch check``: the pre-flight of every host (``dtlaunch.preflight``)
- ``control``   ``dtlaunch stop`` and ``scale`` (``dtlaunch.jobclient``), ``dtlaunch wal repair``
- ``replay``    ``dtlaunch replay``: timeline, ``--follow``, ``--plot``, ``--policy`` what-if
- ``status``    ``dtlaunch status``: the live view
- ``logs``      ``dtlaunch logs``: the processes' logs with the console's prefixes,
                ``--follow``, ``--attempt``, ``--grep`` (``dtlaunch.ui.logs`` reads them)
- ``manpages``  ``python -m dtlaunch.cli.manpages man``: the man pages from this app

The command modules only define their commands; this face registers them, in
the order ``dtlaunch --help`` lists them (the man pages sort them by name).
"""

from __future__ import annotations

from dtlaunch.cli import control, hosts, logs, replay, run, status
from dtlaunch.cli.app import app

__all__ = ["app", "main"]

app.command(context_settings=run.CONTEXT_SETTINGS)(run.run)
app.command()(hosts.check)
app.command()(control.stop)
app.command()(control.scale)
app.command()(replay.replay)
app.command()(status.status)
app.command()(logs.logs)
app.add_typer(control.wal_app, name="wal")


def main() -> None:
    app()
