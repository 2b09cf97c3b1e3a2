"""Process titles: what ``ps``, ``top`` and ``htop`` show for dtlaunch's processes.

Every process dtlaunch runs itself names its run, its role and its rank or host, so
that a cluster operator can tell them apart without reading command lines::

    dtlaunch supervisor /home/me/runs/20261125-103000-ab12 run=20261125-103000-ab12
    dtlaunch agent host=node2 run=20261125-103000-ab12
    dtlaunch server 1 run=20261125-103000-ab12
    dtlaunch worker 3@0 run=20261125-103000-ab12: python train.py --lr 0.1

A worker gets its title when its script calls ``dtlaunch.init()``; a script that
never imports dtlaunch keeps the command line it was started with (the launcher
does not wrap user scripts, so their ``__main__``, argv and tracebacks stay theirs).
"""

from __future__ import annotations

import sys

from setproctitle import setproctitle

__all__ = ["TITLE_PREFIX", "name_this_process"]

TITLE_PREFIX = "dtlaunch"


def name_this_process(
    role: str, run_id: str, detail: str = "", *, keep_command: bool = False
) -> None:
    """Set this process's title to ``dtlaunch ROLE [DETAIL] run=RUN_ID``; with
    ``keep_command`` the original command line follows, so a user's script stays
    recognisable."""
    title = " ".join(part for part in (TITLE_PREFIX, role, detail, f"run={run_id}") if part)
    if keep_command:
        title += ": " + " ".join(["python", *sys.argv])
    setproctitle(title)
