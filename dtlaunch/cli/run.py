"""``dtlaunch run``: a supervised distributed job from its options (or ``--resume``).

The options are declared once, as types, so that the command itself reads as the
list of what it takes; ``dtlaunch.config.RunOptions`` turns them into a validated
``JobSpec``.
"""

from __future__ import annotations

import difflib
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dtlaunch.cli.app import err_console, fail, setup_logging
from dtlaunch.cli.jobfile import (
    args_of_the_given_script,
    load_job_file,
    show_resolved_options,
)
from dtlaunch.config import DEFAULT_PS_BLOCK_BYTES, DEFAULT_SSH_CONCURRENCY, JobSpec, RunOptions
from dtlaunch.deadstream import silence
from dtlaunch.errors import DtlaunchError
from dtlaunch.proctitle import name_this_process

__all__ = ["CONTEXT_SETTINGS", "run"]

# SCRIPT's own options (after SCRIPT) are the script's, not dtlaunch's.
CONTEXT_SETTINGS: dict[str, Any] = {
    "allow_interspersed_args": False,
    "ignore_unknown_options": True,
}

ScriptOption = Annotated[str | None, typer.Argument(help="Training script (or module with -m).")]
ScriptArgsOption = Annotated[
    list[str] | None, typer.Argument(help="Arguments passed to the script.")
]
HostsOption = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        "-H",
        "--hostfile",
        envvar="DTLAUNCH_HOSTS",
        help="Hostfile path or inline list h1:4,h2:4 (--hostfile as in DeepSpeed). "
        "Absent: embedded mode on this machine.",
    ),
]
IncludeOption = Annotated[
    str | None,
    typer.Option(
        envvar="DTLAUNCH_INCLUDE",
        help="Run only on these hosts of the hostfile: NAME@NAME or NAME,NAME (DeepSpeed).",
    ),
]
ExcludeOption = Annotated[
    str | None,
    typer.Option(
        envvar="DTLAUNCH_EXCLUDE",
        help="Leave these hosts of the hostfile out: NAME@NAME or NAME,NAME (DeepSpeed).",
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        "-np",
        envvar="DTLAUNCH_WORKERS",
        help="Worker processes in all (-np as in mpirun/horovodrun). "
        "Default: 1, or --nproc-per-node x hosts.",
        show_default=False,
    ),
]
NprocPerNodeOption = Annotated[
    int | None,
    typer.Option(
        "--nproc-per-node",
        "--nproc_per_node",
        envvar="DTLAUNCH_NPROC_PER_NODE",
        help="Workers on every host, as in torchrun (overrides the hostfile's slots=).",
        show_default=False,
    ),
]
ServersOption = Annotated[
    int, typer.Option(envvar="DTLAUNCH_SERVERS", help="Parameter servers (0: allreduce).")
]
ModeOption = Annotated[
    str | None,
    typer.Option(envvar="DTLAUNCH_MODE", help="ps | allreduce (default: ps when servers > 0)."),
]
FrameworkOption = Annotated[
    str,
    typer.Option(
        envvar="DTLAUNCH_FRAMEWORK",
        help="torch: torchrun's variables | tf: TensorFlow's TF_CONFIG too; in PS mode "
        "worker 0 runs SCRIPT as the chief and dtlaunch runs the worker and ps tasks.",
    ),
]
PsServerOption = Annotated[
    str,
    typer.Option(
        envvar="DTLAUNCH_PS_SERVER",
        help="builtin: servers run python -m dtlaunch.ps | script: they run SCRIPT "
        "(ps-lite / TensorFlow style, DMLC_ROLE=server).",
    ),
]
PsConsistencyOption = Annotated[
    str,
    typer.Option(
        envvar="DTLAUNCH_PS_CONSISTENCY",
        help="Built-in servers: bsp (a step applies all workers' gradients) | asp.",
    ),
]
PsBlockBytesOption = Annotated[
    int,
    typer.Option(
        envvar="DTLAUNCH_PS_BLOCK_BYTES",
        help="Built-in servers: tensors larger than this are split into blocks.",
    ),
]
PsSnapshotIntervalOption = Annotated[
    float,
    typer.Option(
        envvar="DTLAUNCH_PS_SNAPSHOT_INTERVAL",
        help="Built-in servers: seconds between snapshots of blocks and optimizer "
        "state (0: only when stopped).",
    ),
]
PolicyOption = Annotated[
    str,
    typer.Option(
        envvar="DTLAUNCH_POLICY",
        help="Straggler policy: none | lb-bsp | nd[:lambda=1.5,l_trans=60,l_per=300] "
        "| backup[:b=1] (PS mode) | dd[:cmin=1,cmax=5] (mixed devices: micro-batch and "
        "gradient accumulation per hostfile class=) | psld[:eps=0.1,threshold=1] (built-in "
        "PS: spread blocks by server speed) | "
        "rna[:probes=2,staleness=8,average=0.9,split=1] "
        "(allreduce without a barrier, dtlaunch.rna.Trainer; with --servers 1, hierarchical "
        "groups) | "
        "auto[:max_workers=N,sample_s=30,interval_s=60] (built-in PS: size the workers "
        "by measured CPU, DLRover) | module:Class[:k=v].",
    ),
]
ControlIntervalOption = Annotated[
    float,
    typer.Option(envvar="DTLAUNCH_CONTROL_INTERVAL", help="Seconds between policy decisions."),
]
InjectOption = Annotated[
    list[str] | None,
    typer.Option(
        help="Straggler injection for experiments (repeatable), e.g. "
        "persistent:role=worker,ranks=3,delay=4.0",
    ),
]
RunDirOption = Annotated[
    Path | None, typer.Option(envvar="DTLAUNCH_RUN_DIR", help="Default ./runs/<run-id>.")
]
MaxRestartsOption = Annotated[
    int, typer.Option(envvar="DTLAUNCH_MAX_RESTARTS", help="Restarts allowed per rank.")
]
RestartScopeOption = Annotated[
    str | None,
    typer.Option(
        envvar="DTLAUNCH_RESTART_SCOPE",
        help="group: restart all workers together (allreduce default, as torchrun); "
        "process: only the failed one (ps default).",
    ),
]
MemoryLimitOption = Annotated[
    str | None,
    typer.Option(
        envvar="DTLAUNCH_MEMORY_LIMIT",
        help="Memory per worker and server process, e.g. 4G (cgroup, else RLIMIT_AS). "
        "Default: the host's mem= over its slots, else no limit.",
    ),
]
CpuLimitOption = Annotated[
    float | None,
    typer.Option(
        envvar="DTLAUNCH_CPU_LIMIT",
        help="CPUs per worker and server process, e.g. 2 or 0.5 (cgroup quota, else "
        "CPU affinity). Default: the host's cpus= over its slots, else no limit.",
    ),
]
OomRelaunchesOption = Annotated[
    int,
    typer.Option(
        envvar="DTLAUNCH_OOM_RELAUNCHES",
        help="How often a process killed at its memory limit is relaunched with twice "
        "the memory (each relaunch is also a restart).",
    ),
]
MemoryMaxOption = Annotated[
    str | None,
    typer.Option(
        envvar="DTLAUNCH_MEMORY_MAX",
        help="The most memory an OOM relaunch may give a process. Default: its host's.",
    ),
]
LimitsViaOption = Annotated[
    str,
    typer.Option(
        envvar="DTLAUNCH_LIMITS_VIA",
        help="auto: a cgroup per process where the agent may create one, else "
        "RLIMIT_AS and CPU affinity | rlimit: never cgroups (e.g. a batch system owns them).",
    ),
]
HeartbeatIntervalOption = Annotated[
    float,
    typer.Option(envvar="DTLAUNCH_HEARTBEAT_INTERVAL", help="Seconds between heartbeats."),
]
DeadAfterOption = Annotated[
    int,
    typer.Option(envvar="DTLAUNCH_DEAD_AFTER", help="Missed heartbeats before a peer is lost."),
]
OrphanTimeoutOption = Annotated[
    float,
    typer.Option(
        envvar="DTLAUNCH_ORPHAN_TIMEOUT",
        help="Seconds agents keep a job running without a supervisor.",
    ),
]
AgentTimeoutOption = Annotated[
    float,
    typer.Option(
        envvar="DTLAUNCH_AGENT_TIMEOUT", help="Seconds an agent may take to connect back."
    ),
]
KillGraceOption = Annotated[
    float, typer.Option(envvar="DTLAUNCH_KILL_GRACE", help="SIGTERM to SIGKILL delay, seconds.")
]
StallTimeoutOption = Annotated[
    float | None,
    typer.Option(
        envvar="DTLAUNCH_STALL_TIMEOUT",
        help="Seconds without a step or a shard change before the job counts as stalled "
        "(a stall event, then its workers restart as a retryable failure). "
        "Default: max(120, 20x the slowest recent step); 0: never.",
    ),
]
EnvOption = Annotated[
    list[str] | None, typer.Option("--env", help="K=V for every process (repeatable).")
]
EnvFileOption = Annotated[
    Path | None, typer.Option(envvar="DTLAUNCH_ENV_FILE", help="File of K=V lines.")
]
WorkdirOption = Annotated[
    str | None, typer.Option(envvar="DTLAUNCH_WORKDIR", help="Working directory on hosts.")
]
PythonOption = Annotated[
    str | None, typer.Option(envvar="DTLAUNCH_PYTHON", help="Python interpreter on hosts.")
]
ModuleOption = Annotated[bool, typer.Option("-m", "--module", help="SCRIPT is a module.")]
OutputOption = Annotated[
    str,
    typer.Option(
        envvar="DTLAUNCH_OUTPUT",
        help="Console output: all | none | ranks like 0,3,server-1 (logs get everything).",
    ),
]
BindOption = Annotated[
    str | None,
    typer.Option(envvar="DTLAUNCH_BIND", help="Supervisor address ADDR[:PORT] agents connect to."),
]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        envvar="DTLAUNCH_METRICS_PORT",
        help="Serve Prometheus metrics of the job on this port (0: any free port, written "
        "to RUN_DIR/metrics.json), on the --bind address, else 127.0.0.1.",
    ),
]
SshConfigOption = Annotated[
    list[Path] | None,
    typer.Option(envvar="DTLAUNCH_SSH_CONFIG", help="ssh_config file (default ~/.ssh/config)."),
]
InsecureNoHostKeyCheckOption = Annotated[
    bool,
    typer.Option(help="DANGEROUS: accept any SSH host key (man-in-the-middle possible)."),
]
SshConcurrencyOption = Annotated[
    int,
    typer.Option(
        envvar="DTLAUNCH_SSH_CONCURRENCY",
        help="Hosts whose agents are being started at once; the others wait their turn "
        "(their connect and probe timeouts start with it).",
    ),
]
DatasetSizeOption = Annotated[
    int, typer.Option(envvar="DTLAUNCH_DATASET_SIZE", help="Records in the data set (DDS).")
]
ShardSizeOption = Annotated[
    int, typer.Option(envvar="DTLAUNCH_SHARD_SIZE", help="Records per data shard.")
]
EpochsOption = Annotated[int, typer.Option(envvar="DTLAUNCH_EPOCHS", help="Passes over the data.")]
GlobalBatchOption = Annotated[
    int, typer.Option(envvar="DTLAUNCH_GLOBAL_BATCH", help="Global batch size B.")
]
SeedOption = Annotated[int, typer.Option(envvar="DTLAUNCH_SEED", help="Shuffling seed.")]
ResumeOption = Annotated[
    Path | None,
    typer.Option(
        help="Take over RUN_DIR whose supervisor died: replay its WAL; running agents rejoin."
    ),
]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="DTLAUNCH_CONFIG",
        is_eager=True,
        callback=load_job_file,
        help="Job file (TOML) of run options: command line > DTLAUNCH_* > file > defaults.",
    ),
]
PrintConfigOption = Annotated[
    bool,
    typer.Option(
        "--print-config",
        help="Print every option's resolved value and where it came from; run nothing.",
    ),
]


def run(
    ctx: typer.Context,
    script: ScriptOption = None,
    script_args: ScriptArgsOption = None,
    hosts: HostsOption = None,
    include: IncludeOption = None,
    exclude: ExcludeOption = None,
    workers: WorkersOption = None,
    nproc_per_node: NprocPerNodeOption = None,
    servers: ServersOption = 0,
    mode: ModeOption = None,
    framework: FrameworkOption = "torch",
    ps_server: PsServerOption = "builtin",
    ps_consistency: PsConsistencyOption = "bsp",
    ps_block_bytes: PsBlockBytesOption = DEFAULT_PS_BLOCK_BYTES,
    ps_snapshot_interval: PsSnapshotIntervalOption = 30.0,
    policy: PolicyOption = "none",
    control_interval: ControlIntervalOption = 10.0,
    inject: InjectOption = None,
    run_dir: RunDirOption = None,
    max_restarts: MaxRestartsOption = 3,
    restart_scope: RestartScopeOption = None,
    memory_limit: MemoryLimitOption = None,
    cpu_limit: CpuLimitOption = None,
    oom_relaunches: OomRelaunchesOption = 3,
    memory_max: MemoryMaxOption = None,
    limits_via: LimitsViaOption = "auto",
    heartbeat_interval: HeartbeatIntervalOption = 1.0,
    dead_after: DeadAfterOption = 3,
    orphan_timeout: OrphanTimeoutOption = 60.0,
    agent_timeout: AgentTimeoutOption = 60.0,
    kill_grace: KillGraceOption = 5.0,
    stall_timeout: StallTimeoutOption = None,
    env: EnvOption = None,
    env_file: EnvFileOption = None,
    workdir: WorkdirOption = None,
    python: PythonOption = None,
    module: ModuleOption = False,
    output: OutputOption = "all",
    bind: BindOption = None,
    metrics_port: MetricsPortOption = None,
    ssh_config: SshConfigOption = None,
    insecure_no_host_key_check: InsecureNoHostKeyCheckOption = False,
    ssh_concurrency: SshConcurrencyOption = DEFAULT_SSH_CONCURRENCY,
    dataset_size: DatasetSizeOption = 0,
    shard_size: ShardSizeOption = 0,
    epochs: EpochsOption = 1,
    global_batch: GlobalBatchOption = 0,
    seed: SeedOption = 0,
    resume: ResumeOption = None,
    verbose: VerboseOption = False,
    config: ConfigOption = None,
    print_config: PrintConfigOption = False,
) -> None:
    """Run SCRIPT as a supervised distributed job (or --resume a killed supervisor's job)."""
    script_args = args_of_the_given_script(ctx, script_args)
    options = dict(locals())
    if print_config:
        show_resolved_options(ctx, options)
        raise typer.Exit(0)
    for name in ("ctx", "resume", "verbose", "config", "print_config"):
        del options[name]
    setup_logging(verbose)
    if resume is not None:
        _resume(resume)
    if script is None:
        raise fail("no SCRIPT given; usage: dtlaunch run [OPTIONS] SCRIPT [ARGS]...")
    if script.startswith("-"):
        # Options after SCRIPT are the script's, so click passes an unknown one
        # through as the "script": refuse it here, before anything exists on disk.
        raise fail(_unknown_option_message(ctx, script))
    try:
        _refuse_early(policy, inject, insecure_no_host_key_check=insecure_no_host_key_check)
        spec = RunOptions(**options).job_spec()
    except DtlaunchError as err:
        raise fail(err) from None
    except KeyboardInterrupt:
        raise fail("interrupted before the job started; nothing is running", 130) from None
    _run_to_end(spec, resume=False)


def _unknown_option_message(ctx: typer.Context, word: str) -> str:
    """``word`` (an option ``dtlaunch run`` does not have) named with the nearest
    option it does have, if any is close."""
    name = word.split("=", 1)[0]
    known = sorted(
        opt
        for param in ctx.command.params
        if param.param_type_name == "option"
        for opt in (*param.opts, *param.secondary_opts)
    )
    message = f"no such option for dtlaunch run: {name}"
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if nearest:
        message += f" (did you mean {nearest[0]}?)"
    return (
        f"{message}; options of dtlaunch run go before SCRIPT (see dtlaunch run --help), "
        "options after SCRIPT go to the script; nothing was started"
    )


def _refuse_early(
    policy: str, inject: list[str] | None, *, insecure_no_host_key_check: bool
) -> None:
    """Refuse a bad --policy or --inject before anything starts; warn of an
    unverified SSH.

    Raises:
        ConfigError: the policy or an injection is invalid.
    """
    from dtlaunch.inject import parse_injections
    from dtlaunch.supervisor.control.policies import parse_policy

    parse_policy(policy)
    parse_injections(inject or [])
    if insecure_no_host_key_check:
        logging.getLogger("dtlaunch").warning(
            "SSH host keys will NOT be verified (--insecure-no-host-key-check): anyone on "
            "the network path can impersonate your hosts and read the job's keys"
        )


def _resume(run_dir: Path) -> None:
    from dtlaunch.supervisor.rundir import RunDir

    try:
        spec = RunDir.open(run_dir.absolute()).spec()
    except DtlaunchError as err:
        raise fail(err) from None
    _run_to_end(spec, resume=True)


def _run_to_end(spec: JobSpec, *, resume: bool) -> None:
    name_this_process("supervisor", spec.run_id, str(spec.run_dir))
    try:
        from dtlaunch.supervisor.job import run_job_to_end  # heavy imports only when running

        result = run_job_to_end(spec, resume=resume)
    except DtlaunchError as err:
        raise fail(err) from None
    except KeyboardInterrupt:
        # run_job takes SIGINT over on its first line and stops the job in order;
        # an interrupt that still lands here came before it (or after its end).
        raise fail("interrupted before the job started; nothing is running", 130) from None
    from dtlaunch.ui.report import failures_table, outcome_line

    if result.summary["failures"]:
        err_console.print(failures_table(result.summary))
    try:
        print(outcome_line(result.summary, str(result.run_dir)), flush=True)
    except BrokenPipeError:  # the terminal went away; summary.json says it
        silence(sys.stdout)
    raise typer.Exit(result.exit_code)
