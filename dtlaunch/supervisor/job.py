"""Composition root: build every part of a job from its ``JobSpec`` and run it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

import uvloop
import zmq.asyncio

from dtlaunch.config import JobSpec
from dtlaunch.errors import ConfigError, KeyFileError, RunDirError
from dtlaunch.events import EventRecorder, JsonlEventLog
from dtlaunch.hostfile import HostSpec
from dtlaunch.sshconn import SshOptions
from dtlaunch.supervisor.agents import AgentStarter
from dtlaunch.supervisor.control import Controller, host_device
from dtlaunch.supervisor.control.policies import RnaPolicy, parse_policy
from dtlaunch.supervisor.dds import DdsService
from dtlaunch.supervisor.environment import LaunchContext, build_spawn, builtin_ps
from dtlaunch.supervisor.history import History, ResumePlan, load_history
from dtlaunch.supervisor.jobstate import (
    LISTENERS_PER_HOST_MAX,
    JobState,
    LimitRules,
    ProcSlot,
    Timing,
)
from dtlaunch.supervisor.jobstate.scaling import rescaled, rescaled_servers
from dtlaunch.supervisor.launcher import Launcher, LocalLauncher, SshLauncher
from dtlaunch.supervisor.output import OutputRouter
from dtlaunch.supervisor.placement import place
from dtlaunch.supervisor.psfleet import PlacementKeeper
from dtlaunch.supervisor.regroup import RegroupCoordinator
from dtlaunch.supervisor.rna import GroupedCoordinator
from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.supervisor.services import JobServices
from dtlaunch.supervisor.status import StatusTracker
from dtlaunch.supervisor.status.metrics import JobMetrics, LiveJob, serve_metrics
from dtlaunch.supervisor.status.summary import build_summary
from dtlaunch.supervisor.supervisor import Supervisor
from dtlaunch.supervisor.wal import WalFsyncError
from dtlaunch.wire.keys import (
    RunKeys,
    create_run_keys,
    discard_run_keys,
    load_run_keys,
    run_keys_exist,
)
from dtlaunch.wire.messages import Message, Spawn
from dtlaunch.wire.sockets import Router

log = logging.getLogger(__name__)

LOCAL_HOST = "localhost"
# Allocations between two young collections in a supervisor (CPython: 700); see
# collector_for_a_supervisor.
GC_YOUNG_THRESHOLD = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    status: str
    exit_code: int
    summary: dict[str, Any]
    run_dir: Path


def embedded_hosts(spec: JobSpec) -> list[HostSpec]:
    """Embedded mode: this machine is the only host, with room for every process."""
    return [
        HostSpec(
            label=LOCAL_HOST,
            hostname="127.0.0.1",
            slots=spec.workers + spec.servers,
            servers=spec.servers,
            origin="embedded",
        )
    ]


def _bind_address(spec: JobSpec) -> str:
    if spec.bind:
        return spec.bind if spec.bind.startswith("tcp://") else f"tcp://{spec.bind}"
    # CURVE protects the socket; remote agents must be able to reach it.
    return "tcp://127.0.0.1:0" if spec.embedded else "tcp://0.0.0.0:0"


def _status_bind_address(job_bind: str) -> str:
    """The status socket listens where the job's does, on a port of its own."""
    host = job_bind.removeprefix("tcp://").rsplit(":", 1)[0]
    return f"tcp://{host}:0"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The event loop a supervisor runs on: uvloop's (libuv, in C). Every message
    of a job passes through this one loop; at 1,000 workers (4,000 messages a
    second) a py-spy profile put asyncio's own scheduling (select, handles,
    tasks) at about a tenth of the supervisor's samples."""
    return uvloop.new_event_loop()


def run_job_to_end(
    spec: JobSpec, *, console: TextIO | None = None, resume: bool = False
) -> JobResult:
    """``run_job`` on an event loop of its own (``new_event_loop``), from a thread
    that runs none, with the garbage collector set for a supervisor."""
    with collector_for_a_supervisor(), asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(run_job(spec, console=console, resume=resume))


@contextlib.contextmanager
def collector_for_a_supervisor() -> Iterator[None]:
    """Collect the youngest generation every ``GC_YOUNG_THRESHOLD`` allocations
    instead of every 700, and leave what exists at the start (modules, classes,
    functions: two thirds of the supervisor's objects) out of full collections.

    At 1,000 workers the supervisor makes thousands of short-lived containers a
    second (tasks, coroutines, decoded reports) and keeps 40,000 status points
    that each live ~40 s; at CPython's default young collections came about 50
    times a second and promoted them, and a full collection over ~150,000
    objects followed every 1.7 s: 90 ms each (up to 200 ms, the loop's longest
    stalls), 13 s of collecting in a 150 s run against 1 s with these settings.
    The previous settings come back afterwards (``dtlaunch.launch`` runs a job
    inside the caller's process)."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


async def run_job(
    spec: JobSpec, *, console: TextIO | None = None, resume: bool = False
) -> JobResult:
    """Run ``spec`` to its end and return its outcome; writes the run directory.

    With ``resume``, take over the run in ``spec.run_dir`` whose supervisor died:
    replay its WAL, rebind its endpoint and let its agents and workers reconnect.

    Raises:
        ConfigError: when the processes do not fit the hosts, or the metrics
            port cannot be bound.
        RunDirError: when the run directory already holds a job (or, resuming,
            when it has ended, is locked by a live supervisor, or is corrupt).
    """
    stops = _StopRequests()
    with _signals_to(stops):
        # The metrics port is bound before the run directory exists: a port in use
        # stops the job before anything is created or launched.
        async with serve_metrics(spec) as metrics:
            return await _run_job(
                spec, console=console or sys.stdout, resume=resume, stops=stops, metrics=metrics
            )


async def _run_job(
    spec: JobSpec,
    *,
    console: TextIO,
    resume: bool,
    stops: _StopRequests,
    metrics: JobMetrics | None,
) -> JobResult:
    hosts = list(spec.hosts) or embedded_hosts(spec)
    assignments = place(hosts, workers=spec.workers, servers=spec.servers)
    if builtin_ps(spec) or spec.framework == "tf":
        _check_listen_ports(assignments, spec.framework)
    history: History | None = None
    released_workers: list[int] = []
    if resume:
        run = RunDir.open(spec.run_dir)
        if run.summary_path.exists():
            raise RunDirError(f"the job in {run.path} has already ended (see summary.json)")
        history = load_history(run.events_path)
        # Workers a `dtlaunch scale` added or removed are the job's now.
        assignments, released_workers = rescaled(assignments, history.scales)
        assignments = rescaled_servers(assignments, history.server_changes)  # and servers
        if run.supervisor_started():
            keys = load_run_keys(run.keys)
            bind = str(run.supervisor()["endpoint"])
        else:
            # Its supervisor stopped before binding: no agent ever heard of this
            # job, so it starts as new in the same run directory.
            log.info("%s: no supervisor had started; starting the job afresh", run.path)
            keys = _keys_of_a_fresh_start(run)
            bind = _bind_address(spec)
    else:
        run = RunDir.create(spec)
        keys = create_run_keys(run.keys)
        bind = _bind_address(spec)
    event_log = JsonlEventLog(run.events_path)
    stop_copying_log = run.copy_log_lines()
    status = StatusTracker(run_id=spec.run_id, policy=spec.policy, mode=spec.mode)
    recorder = EventRecorder([event_log, status])
    output = OutputRouter(run, console, spec.output)
    ctx = zmq.asyncio.Context()
    status_ctx = zmq.asyncio.Context()  # a Router per context: each has its ZAP handler
    started = time.monotonic()
    router_box: list[Router] = []

    async def send(peer: bytes, msg: Message) -> None:
        await router_box[0].send(peer, msg)

    dds = DdsService(
        run_dir=run.path,
        options=spec.dataset(),
        send=send,
        recorder=recorder,
        on_wal_fsync=metrics.observe_wal_fsync if metrics is not None else None,
    )
    try:
        dds.open()  # takes the WAL lock first: a second supervisor stops here
        async with (
            Router(ctx, keys, bind=bind) as router,
            Router(
                status_ctx, keys, bind=_status_bind_address(bind), name="status router"
            ) as status_router,
        ):
            router_box.append(router)
            run.write_supervisor(
                endpoint=router.endpoint,
                pid=os.getpid(),
                status_endpoint=status_router.endpoint,
            )
            recorder.emit(
                "job_start",
                run_id=spec.run_id,
                endpoint=router.endpoint,
                workers=spec.workers,
                servers=spec.servers,
                mode=spec.mode,
                hosts=[h.label for h in hosts],
                embedded=spec.embedded,
                resumed=resume,
            )
            if metrics is not None:
                metrics.announce(run, recorder)
            services = JobServices(
                recorder=recorder,
                output=output,
                dds=dds,
                controller=_controller(spec, hosts),
                regroup=_regroup_coordinator(spec, assignments, history, time.monotonic()),
                placements=PlacementKeeper(run.path, recorder) if spec.mode == "ps" else None,
                ps_keys=keys.peer(),
                rounds=_round_coordinator(spec, history),
            )
            supervisor = _build_supervisor(
                spec, hosts, assignments, keys, router, run, services, history, released_workers
            )
            state = supervisor.state
            if metrics is not None:
                metrics.watch(
                    LiveJob(state=state, status=status, dds=dds, controller=services.controller)
                )
            answering = asyncio.create_task(
                status.serve(status_router, state=state, dds=dds, controller=services.controller),
                name="status",
            )
            try:
                if stops.attach(supervisor):
                    await supervisor.run()
                else:  # Ctrl-C while the job was being set up: nothing was launched
                    state.status = "stopped"
                    state.stop_reason = f"{stops.early} before the job started"
                    recorder.emit("job_end", status=state.status, reason=state.stop_reason)
            except Exception as err:
                fsync = _first(err, WalFsyncError)
                if fsync is not None:
                    # The disk may have lost what it acknowledged: never retry, stop
                    # here. No summary, so the job stays resumable; the agents keep
                    # it running for --orphan-timeout.
                    raise RunDirError(
                        f"writing the data-sharding log failed ({fsync}); the supervisor "
                        f"stopped. Fix the disk, then: dtlaunch run --resume {run.path}"
                    ) from None
                # A bug of ours must still leave a summary; the agents stop the
                # job by themselves after --orphan-timeout.
                log.error("the supervisor failed", exc_info=err)
                state.status = "failed"
                state.stop_reason = f"supervisor error: {_first(err, Exception)!r}"
            finally:
                answering.cancel()
    finally:
        with contextlib.suppress(WalFsyncError):
            await dds.close()
        output.close()
        ctx.destroy(linger=0)
        status_ctx.destroy(linger=0)
        event_log.close()
        stop_copying_log()
    # A resumed run's JCT is wall time from its first event: the time without a
    # supervisor is part of the job's time too.
    if history is not None and history.first_wall:
        jct = time.time() - history.first_wall
    else:
        jct = time.monotonic() - started
    summary = build_summary(spec, state, jct_s=jct, reason=state.stop_reason)
    summary["actions"] = dict(supervisor.actions_taken())
    summary.update(dds.summary_fields())
    run.write_summary(summary)
    run.repaired_marker.unlink(missing_ok=True)
    exit_code = 0 if summary["status"] == "succeeded" else 1
    return JobResult(
        status=summary["status"], exit_code=exit_code, summary=summary, run_dir=run.path
    )


def _check_listen_ports(assignments: list[Any], framework: str) -> None:
    """Built-in servers and TF tasks bind ports their agent found free; it finds a
    fixed number."""
    tf = framework == "tf"
    per_host = Counter(a.host for a in assignments if tf or a.role == "server")
    room = LISTENERS_PER_HOST_MAX
    crowded = sorted(host for host, count in per_host.items() if count > room)
    if crowded:
        what = "TensorFlow tasks" if tf else "parameter servers"
        raise ConfigError(
            f"more than {room} {what} on {', '.join(crowded)}; spread them over more "
            "hosts (lower slots= or servers= on hostfile lines) or start fewer processes"
        )


def _controller(spec: JobSpec, hosts: list[HostSpec]) -> Controller | None:
    """The policy's Controller; none for ``--policy none`` (nothing to decide)."""
    policy = parse_policy(spec.policy)
    if policy.name == "none":
        return None
    spare = [h.label for h in hosts if h.spare]
    return Controller(
        policy,
        interval=spec.control_interval,
        spare_hosts=spare,
        host_devices={h.label: host_device(h) for h in hosts},
    )


def _regroup_coordinator(
    spec: JobSpec, assignments: list[Any], history: History | None, now: float
) -> RegroupCoordinator | None:
    """An allreduce job's regroups. A resumed one has the workers its scales
    left, numbers its regroups after the run's last, and carries on a resize
    that had begun (the newcomers and the store host say so again)."""
    if spec.mode != "allreduce":
        return None
    workers = sum(1 for a in assignments if a.role == "worker")
    resize = history.open_resize if history is not None else None
    coord = RegroupCoordinator(
        world_size=resize.was if resize is not None else workers,
        timeout_s=REGROUP_TIMEOUT_S,
        gen=history.regroup_gen if history is not None else 0,
    )
    if resize is not None:
        log.info("carrying on the resize of the group to %d workers", resize.workers)
        coord.restore_resize(
            gen=resize.gen,
            count=resize.workers,
            joining=resize.joining,
            announced=resize.announced,
            store=resize.store,
            now=now,
        )
    return coord


def _still_leaving(history: History) -> dict[int, tuple[str, int]]:
    """rank -> (host, attempt) of the ranks an open resize removes that have
    not been stopped yet (its store was not up): they finish their shard."""
    resize = history.open_resize
    if resize is None or resize.store is not None:
        return {}
    return {
        rank: (history.hosts.get(f"worker-{rank}", ""), history.attempts.get(f"worker-{rank}", 0))
        for rank in resize.leaving
        if f"worker-{rank}" in history.hosts
    }


def _round_coordinator(spec: JobSpec, history: History | None) -> GroupedCoordinator | None:
    """RNA's groups, probes and rounds, with ``--policy rna``'s parameters; with
    the built-in parameter servers (and ``hierarchical`` not off) the groups
    exchange through them (§4). A resumed supervisor numbers its groups after
    the last one's: a worker's message about a group of the crashed supervisor
    is then never mistaken for one about a new group. It starts with one group;
    the policy partitions the workers again from their iteration times."""
    policy = parse_policy(spec.policy)
    if not isinstance(policy, RnaPolicy):
        return None
    return GroupedCoordinator(
        world_size=spec.workers,
        probes=policy.probes,
        group_timeout_s=policy.group_timeout_s,
        seed=spec.seed,
        first_gen=(history.rna_gen + 1) if history is not None else 1,
        exchange_every=policy.exchange_every if policy.hierarchical and builtin_ps(spec) else 0,
    )


# From KILL_RESTART to the survivors' store: they act at their next step.
REGROUP_TIMEOUT_S = 60.0

_E = TypeVar("_E", bound=BaseException)


def _first(err: BaseException, kind: type[_E]) -> _E | None:
    """The first ``kind`` in ``err`` or, for a TaskGroup's group, inside it."""
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
        return None
    return err if isinstance(err, kind) else None


def _launcher(spec: JobSpec, run: RunDir, *, python: str, workdir: str) -> Launcher:
    if spec.embedded:
        return LocalLauncher(python=python, agents_dir=run.agents)
    options = SshOptions(
        config_paths=tuple(Path(p) for p in spec.ssh_config),
        verify_host_keys=spec.verify_host_keys,
    )
    return SshLauncher(options=options, python=python, workdir=workdir, run_id=spec.run_id)


def _build_supervisor(
    spec: JobSpec,
    hosts: list[HostSpec],
    assignments: list[Any],
    keys: RunKeys,
    router: Router,
    run: RunDir,
    services: JobServices,
    history: History | None,
    released_workers: list[int],
) -> Supervisor:
    python = spec.python or sys.executable
    workdir = spec.workdir or os.getcwd()
    by_label = {h.label: h for h in hosts}
    launch_ctx = LaunchContext(
        spec=spec,
        python=python,
        workdir=workdir,
        hosts_with_workers=len({a.host for a in assignments if a.role == "worker"}),
        endpoints={},
        state_dirs={},
    )
    agents = AgentStarter(
        spec=spec,
        hosts=hosts,
        launcher=_launcher(spec, run, python=python, workdir=workdir),
        launch_ctx=launch_ctx,
        keys=keys,
        run=run,
        router_port=router.port,
    )

    def spawn_for(slot: ProcSlot, master_addr: str, master_port: int) -> Spawn:
        # The workers now: a `dtlaunch scale` changes WORLD_SIZE for later spawns.
        return build_spawn(launch_ctx, slot, master_addr, master_port, workers=state.worker_ranks())

    def master_addr_of(label: str, reported: str) -> str:
        if spec.embedded:
            return "127.0.0.1"
        return by_label[label].hostname or reported

    state = JobState(
        assignments,
        timing=Timing(
            heartbeat_interval=spec.heartbeat_interval,
            dead_after=spec.dead_after,
            orphan_timeout=spec.orphan_timeout,
            kill_grace=spec.kill_grace,
            agent_timeout=spec.agent_timeout,
        ),
        max_restarts=spec.max_restarts,
        restart_scope=spec.restart_scope,
        build_spawn=spawn_for,
        builtin_ps=builtin_ps(spec),
        tf_tasks=spec.mode if spec.framework == "tf" else "",
        master_addr_of=master_addr_of,
        spare_hosts=[h.label for h in hosts if h.spare],
        host_slots={h.label: h.slots for h in hosts},
        host_gpus={h.label: h.gpus for h in hosts if h.gpus},
        limits=LimitRules(
            memory_limit=spec.memory_limit,
            cpu_limit=spec.cpu_limit,
            oom_relaunches=spec.oom_relaunches,
            memory_max=spec.memory_max,
            host_memory={h.label: h.memory_bytes for h in hosts if h.memory_bytes},
            host_cpus={h.label: h.cpus for h in hosts if h.cpus},
            host_slots={h.label: h.slots for h in hosts},
        ),
    )
    leaving = _still_leaving(history) if history is not None else {}
    resume = (
        ResumePlan(
            history=history,
            adopt=agents.started_before,
            restart_workers=(
                "the data-sharding log was repaired; the workers' shards are stale"
                if run.repaired_marker.exists()
                else ""
            ),
            released_workers=tuple(r for r in released_workers if r not in leaving),
            leaving=leaving,
        )
        if history is not None
        else None
    )
    return Supervisor(
        state=state,
        router=router,
        agents=agents,
        services=services,
        run_id=spec.run_id,
        heartbeat_interval=spec.heartbeat_interval,
        resume=resume,
        stall_timeout_s=spec.stall_timeout,
    )


class _StopRequests:
    """SIGINT/SIGTERM from the first line of ``run_job`` to its last: to the
    supervisor once it exists, remembered until then (a Ctrl-C while the run
    directory and sockets are being set up must not kill the process half-way)."""

    def __init__(self) -> None:
        self.early = ""  # the signal that came before the supervisor existed
        self._supervisor: Supervisor | None = None

    def __call__(self, signame: str) -> None:
        if self._supervisor is not None:
            self._supervisor.request_stop(signame)
        elif not self.early:
            log.warning("stopping (%s) before the job started", signame)
            self.early = signame

    def attach(self, supervisor: Supervisor) -> bool:
        """Route later signals to ``supervisor``; False when a stop came first."""
        self._supervisor = supervisor
        return not self.early


def _keys_of_a_fresh_start(run: RunDir) -> RunKeys:
    """The run's keys when its supervisor died before binding: the ones it wrote,
    or new ones when it was killed while writing them (one file, or a torn one).
    Nobody ever received those keys, as no agent was started, so replacing them
    is safe.

    Raises:
        KeyFileError: the keys directory cannot be made private or written.
    """
    if run_keys_exist(run.keys):
        try:
            return load_run_keys(run.keys)
        except KeyFileError as err:
            log.info("%s: replacing the keys its supervisor left unfinished (%s)", run.path, err)
            discard_run_keys(run.keys)
    return create_run_keys(run.keys)


@contextlib.contextmanager
def _signals_to(stops: _StopRequests) -> Any:
    """SIGINT/SIGTERM, and SIGHUP (the terminal closed) as torchrun treats it,
    stop the job in order instead of killing the supervisor. A SIGHUP ignored
    when we start (``nohup``) stays ignored: that user wants the job to outlive
    the terminal."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    # Only the main thread gets signals (a job run from a notebook's thread does not).
    if threading.current_thread() is threading.main_thread():
        wanted = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            wanted.append(signal.SIGHUP)
        for signum in wanted:
            loop.add_signal_handler(signum, stops, signal.Signals(signum).name)
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
