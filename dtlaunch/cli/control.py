"""Commands that act on a run directory: ``dtlaunch stop`` and ``dtlaunch scale``
(through the running supervisor, ``dtlaunch.jobclient``) and ``dtlaunch wal repair``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from dtlaunch.cli.app import fail, setup_logging
from dtlaunch.errors import DtlaunchError

__all__ = ["scale", "stop", "wal_app", "wal_repair"]


def stop(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of the job to stop.")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the supervisor.")] = 10.0,
) -> None:
    """Stop a running job gracefully (SIGTERM, then SIGKILL after the grace period)."""
    setup_logging(False)
    from dtlaunch.jobclient import request_stop

    try:
        detail = asyncio.run(request_stop(run_dir, timeout=timeout))
    except DtlaunchError as err:
        raise fail(err, code=1) from None
    print(f"dtlaunch: {detail}")


def scale(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of the job to scale.")],
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Workers to run from now on: new ranks start on free slots (spare hosts "
            "first); the highest ranks leave after the data shard they read.",
        ),
    ] = 0,
    servers: Annotated[
        int,
        typer.Option(
            "--servers",
            help="dtlaunch's parameter servers to run from now on: new ones start on free "
            "slots (spare hosts first) and take blocks from the others; the highest ranks "
            "hand their blocks over and stop.",
        ),
    ] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the supervisor.")] = 10.0,
) -> None:
    """Change a running job's number of workers or parameter servers; the job goes on.

    Parameter-server jobs (dtlaunch's servers): new workers fetch data shards as
    they start and the servers' steps wait for them from their hello on; removed
    workers finish the shard they read and end. New servers take their share of
    the parameter blocks, with the optimizer state, at a step every server agrees
    on; removed servers give theirs to the others first. Allreduce jobs (scripts
    that call job.attach() and loop with job.bsp_batches()): new ranks start and
    warm up, then at a step all workers agree on the removed ranks leave, the
    group re-forms with the new size and the global batch is split over it again.
    Every record is still trained once. A resumed supervisor keeps the new counts.
    """
    setup_logging(False)
    if workers == 0 and servers == 0:
        raise fail("say what to scale: --workers N, --servers M, or both", code=2)
    if workers < 0 or servers < 0:
        raise fail("--workers and --servers must be whole numbers >= 1", code=2)
    from dtlaunch.jobclient import request_scale

    try:
        detail = asyncio.run(
            request_scale(run_dir, workers=workers, servers=servers, timeout=timeout)
        )
    except DtlaunchError as err:
        raise fail(err, code=1) from None
    print(f"dtlaunch: {detail}")


wal_app = typer.Typer(help="Inspect and repair a run's data-sharding write-ahead log.")


@wal_app.command("repair")
def wal_repair(
    run_dir: Annotated[Path, typer.Argument(help="Run directory whose WAL is corrupt.")],
) -> None:
    """Cut the WAL at its first corruption (a backup of the cut keeps every byte)."""
    setup_logging(False)
    from dtlaunch.supervisor.rundir import RunDir
    from dtlaunch.supervisor.wal import repair

    try:
        run = RunDir.open(run_dir.absolute())
        report = repair(run.path / "wal")
    except DtlaunchError as err:
        raise fail(err, code=1) from None
    print(f"dtlaunch: {report}")
    if report.changed:
        # Workers may hold shards the cut log no longer knows: the next resume
        # restarts them instead of adopting them.
        run.mark_wal_repaired(str(report))
        print(f"dtlaunch: resume with: dtlaunch run --resume {run.path} (workers will restart)")
