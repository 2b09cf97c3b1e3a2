"""The ``dtlaunch`` command line: options in, a ``JobSpec`` (or a run directory)
out, handed to the layers below. No job logic lives here.

- ``app``       the Typer app, global options, logging, ``fail`` (the one error path)
- ``run``       ``dtlaunch run`` (and ``--resume``)
- ``hosts``     ``dtlaunch check``: the pre-flight of every host (``dtlaunch.preflight``)
- ``control``   ``dtlaunch stop`` and ``dtlaunch wal repair``
- ``replay``    ``dtlaunch replay``: timeline, ``--follow``, ``--plot``, ``--policy`` what-if
- ``status``    ``dtlaunch status``: the live view
- ``manpages``  ``python -m dtlaunch.cli.manpages man``: the man pages from this app

Commands are registered in that order, which is the order ``--help`` and the
man pages list them.
"""

from __future__ import annotations

from dtlaunch.cli import control, hosts, replay, run, status
from dtlaunch.cli.app import app

__all__ = ["app", "main"]

# The modules above register their commands on ``app`` when imported.
_COMMAND_MODULES = (run, hosts, control, replay, status)


def main() -> None:
    app()
