"""The ``dtlaunch`` command line: options in, a JobSpec out, handed on. No job logic."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from dtlaunch import __version__
from dtlaunch.config import (
    DEFAULT_PS_BLOCK_BYTES,
    JobSpec,
    OutputSpec,
    new_run_id,
    parse_env_pairs,
)
from dtlaunch.errors import DtlaunchError
from dtlaunch.hostfile import load_hosts

app = typer.Typer(
    name="dtlaunch",
    help="Launch and supervise distributed training on plain SSH clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False, rich_tracebacks=False)],
    )
    # asyncssh is chatty at INFO (one line per channel); its errors still show.
    logging.getLogger("asyncssh").setLevel(logging.WARNING)


def _fail(err: DtlaunchError | str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {err}", highlight=False, markup=True)
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


@app.command(
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def run(
    script: Annotated[
        str | None, typer.Argument(help="Training script (or module with -m).")
    ] = None,
    script_args: Annotated[
        list[str] | None, typer.Argument(help="Arguments passed to the script.")
    ] = None,
    hosts: Annotated[
        str | None,
        typer.Option(
            "--hosts",
            "-H",
            envvar="DTLAUNCH_HOSTS",
            help="Hostfile path or inline list h1:4,h2:4. Absent: embedded mode on this machine.",
        ),
    ] = None,
    workers: Annotated[int, typer.Option(envvar="DTLAUNCH_WORKERS", help="Worker processes.")] = 1,
    servers: Annotated[
        int, typer.Option(envvar="DTLAUNCH_SERVERS", help="Parameter servers (0: allreduce).")
    ] = 0,
    mode: Annotated[
        str | None,
        typer.Option(envvar="DTLAUNCH_MODE", help="ps | allreduce (default: ps when servers > 0)."),
    ] = None,
    ps_server: Annotated[
        str,
        typer.Option(
            envvar="DTLAUNCH_PS_SERVER",
            help="builtin: servers run python -m dtlaunch.ps | script: they run SCRIPT "
            "(ps-lite / TensorFlow style, DMLC_ROLE=server).",
        ),
    ] = "builtin",
    ps_consistency: Annotated[
        str,
        typer.Option(
            envvar="DTLAUNCH_PS_CONSISTENCY",
            help="Built-in servers: bsp (a step applies all workers' gradients) | asp.",
        ),
    ] = "bsp",
    ps_block_bytes: Annotated[
        int,
        typer.Option(
            envvar="DTLAUNCH_PS_BLOCK_BYTES",
            help="Built-in servers: tensors larger than this are split into blocks.",
        ),
    ] = DEFAULT_PS_BLOCK_BYTES,
    ps_snapshot_interval: Annotated[
        float,
        typer.Option(
            envvar="DTLAUNCH_PS_SNAPSHOT_INTERVAL",
            help="Built-in servers: seconds between snapshots of blocks and optimizer "
            "state (0: only when stopped).",
        ),
    ] = 30.0,
    policy: Annotated[
        str,
        typer.Option(
            envvar="DTLAUNCH_POLICY",
            help="Straggler policy: none | lb-bsp | nd[:lambda=1.5,l_trans=60,l_per=300] "
            "| backup[:b=1] (PS mode) | module:Class[:k=v].",
        ),
    ] = "none",
    control_interval: Annotated[
        float,
        typer.Option(envvar="DTLAUNCH_CONTROL_INTERVAL", help="Seconds between policy decisions."),
    ] = 10.0,
    inject: Annotated[
        list[str] | None,
        typer.Option(
            help="Straggler injection for experiments (repeatable), e.g. "
            "persistent:role=worker,ranks=3,delay=4.0",
        ),
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option(envvar="DTLAUNCH_RUN_DIR", help="Default ./runs/<run-id>.")
    ] = None,
    max_restarts: Annotated[
        int, typer.Option(envvar="DTLAUNCH_MAX_RESTARTS", help="Restarts allowed per rank.")
    ] = 3,
    restart_scope: Annotated[
        str | None,
        typer.Option(
            envvar="DTLAUNCH_RESTART_SCOPE",
            help="group: restart all workers together (allreduce default, as torchrun); "
            "process: only the failed one (ps default).",
        ),
    ] = None,
    heartbeat_interval: Annotated[
        float,
        typer.Option(envvar="DTLAUNCH_HEARTBEAT_INTERVAL", help="Seconds between heartbeats."),
    ] = 1.0,
    dead_after: Annotated[
        int,
        typer.Option(envvar="DTLAUNCH_DEAD_AFTER", help="Missed heartbeats before a peer is lost."),
    ] = 3,
    orphan_timeout: Annotated[
        float,
        typer.Option(
            envvar="DTLAUNCH_ORPHAN_TIMEOUT",
            help="Seconds agents keep a job running without a supervisor.",
        ),
    ] = 60.0,
    agent_timeout: Annotated[
        float,
        typer.Option(
            envvar="DTLAUNCH_AGENT_TIMEOUT", help="Seconds an agent may take to connect back."
        ),
    ] = 60.0,
    kill_grace: Annotated[
        float, typer.Option(envvar="DTLAUNCH_KILL_GRACE", help="SIGTERM to SIGKILL delay, seconds.")
    ] = 5.0,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="K=V for every process (repeatable).")
    ] = None,
    env_file: Annotated[
        Path | None, typer.Option(envvar="DTLAUNCH_ENV_FILE", help="File of K=V lines.")
    ] = None,
    workdir: Annotated[
        str | None, typer.Option(envvar="DTLAUNCH_WORKDIR", help="Working directory on hosts.")
    ] = None,
    python: Annotated[
        str | None, typer.Option(envvar="DTLAUNCH_PYTHON", help="Python interpreter on hosts.")
    ] = None,
    module: Annotated[bool, typer.Option("-m", "--module", help="SCRIPT is a module.")] = False,
    output: Annotated[
        str,
        typer.Option(
            envvar="DTLAUNCH_OUTPUT",
            help="Console output: all | none | ranks like 0,3,server-1 (logs get everything).",
        ),
    ] = "all",
    bind: Annotated[
        str | None,
        typer.Option(
            envvar="DTLAUNCH_BIND", help="Supervisor address ADDR[:PORT] agents connect to."
        ),
    ] = None,
    ssh_config: Annotated[
        list[Path] | None,
        typer.Option(envvar="DTLAUNCH_SSH_CONFIG", help="ssh_config file (default ~/.ssh/config)."),
    ] = None,
    insecure_no_host_key_check: Annotated[
        bool,
        typer.Option(help="DANGEROUS: accept any SSH host key (man-in-the-middle possible)."),
    ] = False,
    dataset_size: Annotated[
        int, typer.Option(envvar="DTLAUNCH_DATASET_SIZE", help="Records in the data set (DDS).")
    ] = 0,
    shard_size: Annotated[
        int, typer.Option(envvar="DTLAUNCH_SHARD_SIZE", help="Records per data shard.")
    ] = 0,
    epochs: Annotated[
        int, typer.Option(envvar="DTLAUNCH_EPOCHS", help="Passes over the data.")
    ] = 1,
    global_batch: Annotated[
        int, typer.Option(envvar="DTLAUNCH_GLOBAL_BATCH", help="Global batch size B.")
    ] = 0,
    seed: Annotated[int, typer.Option(envvar="DTLAUNCH_SEED", help="Shuffling seed.")] = 0,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Take over RUN_DIR whose supervisor died: replay its WAL; running agents rejoin."
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run SCRIPT as a supervised distributed job (or --resume a killed supervisor's job)."""
    _setup_logging(verbose)
    if resume is not None:
        _resume(resume)
    if script is None:
        raise _fail("no SCRIPT given; usage: dtlaunch run [OPTIONS] SCRIPT [ARGS]...")
    try:
        servers_mode = mode or ("ps" if servers > 0 else "allreduce")
        from dtlaunch.inject import parse_injections
        from dtlaunch.supervisor.control.policies import parse_policy

        parse_policy(policy)  # refuse a bad --policy before anything starts
        parse_injections(inject or [])
        if insecure_no_host_key_check:
            logging.getLogger("dtlaunch").warning(
                "SSH host keys will NOT be verified (--insecure-no-host-key-check): anyone on "
                "the network path can impersonate your hosts and read the job's keys"
            )
        run_id = new_run_id()
        spec = JobSpec(
            run_id=run_id,
            run_dir=(run_dir or Path("runs") / run_id).absolute(),
            script=script,
            script_args=tuple(script_args or ()),
            module=module,
            hosts=tuple(load_hosts(hosts)) if hosts else (),
            workers=workers,
            servers=servers,
            mode=servers_mode,
            policy=policy,
            max_restarts=max_restarts,
            restart_scope=restart_scope or ("group" if servers_mode == "allreduce" else "process"),
            heartbeat_interval=heartbeat_interval,
            dead_after=dead_after,
            orphan_timeout=orphan_timeout,
            kill_grace=kill_grace,
            agent_timeout=agent_timeout,
            env=parse_env_pairs(list(env or []), env_file),
            workdir=workdir or os.getcwd(),
            python=python or sys.executable,
            output=OutputSpec.parse(output),
            bind=bind or "",
            ssh_config=tuple(str(p.expanduser()) for p in ssh_config or []),
            verify_host_keys=not insecure_no_host_key_check,
            dataset_size=dataset_size,
            shard_size=shard_size,
            epochs=epochs,
            global_batch=global_batch,
            seed=seed,
            control_interval=control_interval,
            inject=tuple(inject or ()),
            ps_server=ps_server,
            ps_consistency=ps_consistency,
            ps_block_bytes=ps_block_bytes,
            ps_snapshot_interval=ps_snapshot_interval,
            created=time.time(),
        ).validate()
    except DtlaunchError as err:
        raise _fail(err) from None
    _run_to_end(spec, resume=False)


def _resume(run_dir: Path) -> None:
    from dtlaunch.supervisor.rundir import RunDir

    try:
        spec = RunDir.open(run_dir.absolute()).spec()
    except DtlaunchError as err:
        raise _fail(err) from None
    _run_to_end(spec, resume=True)


def _run_to_end(spec: JobSpec, *, resume: bool) -> None:
    from dtlaunch.supervisor.job import run_job  # heavy imports only when running

    try:
        result = asyncio.run(run_job(spec, resume=resume))
    except DtlaunchError as err:
        raise _fail(err) from None
    from dtlaunch.ui.report import failures_table, outcome_line

    if result.summary["failures"]:
        err_console.print(failures_table(result.summary))
    print(outcome_line(result.summary, str(result.run_dir)), flush=True)
    raise typer.Exit(result.exit_code)


@app.command()
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
    timeout: Annotated[float, typer.Option(help="Seconds per host.")] = 20.0,
) -> None:
    """Check every host in parallel: ssh, host key, python, dtlaunch, workdir, ports."""
    _setup_logging(False)
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
            )
        )
    except DtlaunchError as err:
        raise _fail(err) from None
    Console().print(render_checks(results))
    failed = [r for r in results if not r.ok]
    if failed:
        err_console.print(f"[red]{len(failed)} of {len(results)} host(s) failed the check[/]")
        raise typer.Exit(1)


@app.command()
def stop(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of the job to stop.")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the supervisor.")] = 10.0,
) -> None:
    """Stop a running job gracefully (SIGTERM, then SIGKILL after the grace period)."""
    _setup_logging(False)
    from dtlaunch.jobclient import request_stop

    try:
        detail = asyncio.run(request_stop(run_dir, timeout=timeout))
    except DtlaunchError as err:
        raise _fail(err, code=1) from None
    print(f"dtlaunch: {detail}")


wal_app = typer.Typer(help="Inspect and repair a run's data-sharding write-ahead log.")
app.add_typer(wal_app, name="wal")


@wal_app.command("repair")
def wal_repair(
    run_dir: Annotated[Path, typer.Argument(help="Run directory whose WAL is corrupt.")],
) -> None:
    """Cut the WAL at its first corruption (a backup of the cut keeps every byte)."""
    _setup_logging(False)
    from dtlaunch.supervisor.rundir import RunDir
    from dtlaunch.supervisor.wal.log import repair

    try:
        run = RunDir.open(run_dir.absolute())
        report = repair(run.path / "wal")
    except DtlaunchError as err:
        raise _fail(err, code=1) from None
    print(f"dtlaunch: {report}")
    if report.damage is not None or report.backup is not None:
        # Workers may hold shards the cut log no longer knows: the next resume
        # restarts them instead of adopting them.
        run.mark_wal_repaired(str(report))
        print(f"dtlaunch: resume with: dtlaunch run --resume {run.path} (workers will restart)")


from dtlaunch.cli_status import register as _register_status  # noqa: E402
from dtlaunch.cli_views import register as _register_views  # noqa: E402

_register_views(app)
_register_status(app)


def main() -> None:
    app()
