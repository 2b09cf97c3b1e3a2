"""``python -m dtlaunch.runtime.prewarm [-m] SCRIPT [ARGS]...``: a replacement
worker that gets ready while the worker it replaces still trains.

A KILL_RESTART onto another host would otherwise leave the survivors idle while
the newcomer starts Python and imports torch (seconds on a busy host). Started
early through this wrapper, the newcomer does that first, then connects to the
supervisor as ``join:<rank>`` and waits. Once the survivors' store is up and the
old worker is gone, the supervisor says where to meet (``RegroupGo``); the
wrapper puts it into the environment (``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_USE_AGENT_STORE``, ``DTLAUNCH_JOIN``) and runs the script as
``python SCRIPT`` would, so an unmodified ``dist.init_process_group()`` joins
the re-formed group and ``job.attach()`` receives the state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import sys

from dtlaunch.errors import DtlaunchError
from dtlaunch.runtime.client import SupervisorClient
from dtlaunch.runtime.environ import (
    DEFAULT_INIT_TIMEOUT_S,
    ENV_INIT_TIMEOUT,
    ENV_SUPERVISOR,
    connection_from_env,
    env_float,
    env_int,
)

__all__ = ["main"]

logger = logging.getLogger("dtlaunch.prewarm")

USAGE = "usage: python -m dtlaunch.runtime.prewarm [-m] SCRIPT [ARGS]..."


def _warm_up() -> None:
    """Do the slow part of a start ahead: import torch and build a first optimizer
    (torch loads its compiler stack lazily then, seconds on a busy host)."""
    with contextlib.suppress(ImportError):  # a job without torch: nothing to warm
        import torch
        import torch.distributed

        layer = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        layer(torch.zeros(1, 2)).sum().backward()
        optimizer.step()


def _wait_for_the_group() -> None:
    endpoint = os.environ.get(ENV_SUPERVISOR, "")
    if not endpoint:
        raise DtlaunchError(f"{ENV_SUPERVISOR} is not set: this wrapper is started by dtlaunch")
    attempt = env_int(os.environ, "TORCHELASTIC_RESTART_COUNT", default=0)
    conn = connection_from_env(os.environ, endpoint, attempt)
    timeout = env_float(os.environ, ENV_INIT_TIMEOUT, DEFAULT_INIT_TIMEOUT_S)
    client = SupervisorClient(conn, prefetch=0, joining=True)
    try:
        go = client.wait_regroup_go(0, timeout)
    finally:
        client.close(0.0)
    os.environ.update(
        {
            "MASTER_ADDR": go.master_addr,
            "MASTER_PORT": str(go.master_port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "DTLAUNCH_JOIN": f"{go.gen}:{go.source_rank}:{go.batch_size}",
        }
    )
    logger.info(
        "rank %d joins generation %d at %s:%d",
        conn.rank,
        go.gen,
        go.master_addr,
        go.master_port,
    )


def main(argv: list[str]) -> int:
    module = bool(argv) and argv[0] == "-m"
    target_args = argv[1:] if module else argv
    if not target_args:
        print(USAGE, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s prewarm %(message)s")
    _warm_up()
    try:
        _wait_for_the_group()
    except (DtlaunchError, TimeoutError) as exc:
        print(f"dtlaunch: the replacement worker could not join: {exc}", file=sys.stderr)
        return 1
    target, args = target_args[0], target_args[1:]
    if module:
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python SCRIPT` does
        runpy.run_path(target, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
