"""Talk to a running supervisor from outside: ``dtlaunch stop``.

Uses the run directory's CURVE client key, so only someone who can read the run
directory (mode 0700 keys) can control the job.
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq.asyncio

from dtlaunch.errors import RunDirError
from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.version import __version__
from dtlaunch.wire.keys import load_run_keys
from dtlaunch.wire.messages import Ack, Hello, StopJob, Welcome
from dtlaunch.wire.sockets import Dealer


async def request_stop(run_dir: Path, *, timeout: float) -> str:  # noqa: ASYNC109
    """Ask the supervisor of ``run_dir`` to stop its job; returns its answer.

    Raises:
        RunDirError: not a run directory, the job already ended, or no answer.
    """
    run = RunDir.open(run_dir)
    if run.summary_path.exists():
        raise RunDirError(f"the job in {run_dir} has already ended (see summary.json)")
    info = run.supervisor()
    keys = load_run_keys(run.keys)
    ctx = zmq.asyncio.Context()
    identity = f"control:{os.getpid()}".encode()
    try:
        async with Dealer(ctx, str(info["endpoint"]), keys.peer(), identity) as dealer:
            await dealer.send(
                Hello(
                    role="control",
                    run_id=run.spec().run_id,
                    host="",
                    pid=os.getpid(),
                    version=__version__,
                )
            )
            welcome = await dealer.recv(timeout=timeout)
            if not isinstance(welcome, Welcome):
                raise RunDirError(
                    f"no supervisor answers at {info['endpoint']} (pid {info['pid']}): the job "
                    "has ended or its supervisor died"
                )
            await dealer.send(StopJob(reason="dtlaunch stop"))
            while True:
                answer = await dealer.recv(timeout=timeout)
                if answer is None:
                    raise RunDirError("the supervisor did not acknowledge the stop request")
                if isinstance(answer, Ack):
                    return f"stop requested: {answer.detail}"
    finally:
        ctx.destroy(linger=0)
