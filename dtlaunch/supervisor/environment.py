"""The command line and environment of every worker and server process.

Workers get torchrun's variables so that a script written for torchrun runs
unmodified; PS-mode processes also get ps-lite's ``DMLC_*`` variables, and with
``--framework tf`` every process gets ``TF_CONFIG`` (``jobstate/tftasks.py``
says which TF task each one is). Secrets
never go here: the CURVE keys are files, and the agent adds their folder as
``DTLAUNCH_KEYS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dtlaunch.config import JobSpec
from dtlaunch.runtime.steps import REPORT_EVERY_S
from dtlaunch.supervisor.control.policies import RnaPolicy, parse_policy
from dtlaunch.supervisor.jobstate.machine import ProcSlot
from dtlaunch.supervisor.jobstate.tftasks import runs_script, tf_config
from dtlaunch.wire.messages import Spawn


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchContext:
    """What the environment depends on besides the job spec."""

    spec: JobSpec
    python: str  # interpreter on the hosts
    workdir: str
    hosts_with_workers: int  # GROUP_WORLD_SIZE
    # Filled in as agents launch, keyed by host label:
    endpoints: dict[str, str]  # the supervisor address as that host reaches it
    state_dirs: dict[str, str]  # the agent's folder on that host


def process_argv(
    spec: JobSpec, python: str, role: str = "worker", rank: int = 0, *, prewarm: bool = False
) -> list[str]:
    if role == "server" and builtin_ps(spec):
        return [python, "-u", "-m", "dtlaunch.ps"]
    if spec.framework == "tf" and not runs_script(role, rank, ps_mode=spec.mode == "ps"):
        return [python, "-u", "-m", "dtlaunch.tfserver"]
    # A replacement started ahead of its regroup warms up in dtlaunch's wrapper,
    # which then runs the script as python would.
    wrapper = ["-m", "dtlaunch.runtime.prewarm"] if prewarm else []
    if spec.module:
        return [python, "-u", *wrapper, "-m", spec.script, *spec.script_args]
    return [python, "-u", *wrapper, spec.script, *spec.script_args]


def process_env(
    ctx: LaunchContext,
    slot: ProcSlot,
    master_addr: str,
    master_port: int,
    *,
    workers: Sequence[int] | None = None,
) -> dict[str, str]:
    """``workers``: the job's worker ranks now (a ``dtlaunch scale`` changes them;
    None: the spec's ``0..workers-1``)."""
    spec = ctx.spec
    a = slot.assignment
    ranks = list(range(spec.workers)) if workers is None else list(workers)
    role_world = len(ranks) if a.role == "worker" else spec.servers
    if spec.framework == "tf" and spec.mode == "ps" and a.role == "worker":
        # Only the chief runs the script (and reads the data): it is the world of
        # torchrun's variables and of the SDK's batches.
        role_world = 1
    env: dict[str, str] = {
        # torchrun / torchelastic
        "RANK": str(a.rank),
        "WORLD_SIZE": str(role_world),
        "LOCAL_RANK": str(a.local_rank),
        "LOCAL_WORLD_SIZE": str(a.local_world_size),
        "GROUP_RANK": str(a.group_rank),
        "GROUP_WORLD_SIZE": str(ctx.hosts_with_workers),
        "ROLE_RANK": str(a.rank),
        "ROLE_NAME": a.role,
        "ROLE_WORLD_SIZE": str(role_world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(slot.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": spec.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": (
            f"{ctx.state_dirs.get(slot.host, '/tmp')}/errors/{slot.proc_id}-{slot.attempt}.json"
        ),
        "PYTHONUNBUFFERED": "1",
        # dtlaunch's own
        "DTLAUNCH_RUN_ID": spec.run_id,
        "DTLAUNCH_ROLE": a.role,
        "DTLAUNCH_RANK": str(a.rank),
        "DTLAUNCH_SUPERVISOR": ctx.endpoints.get(slot.host, ""),
        "DTLAUNCH_HEARTBEAT_INTERVAL": str(spec.heartbeat_interval),
        "DTLAUNCH_HOST": slot.host,
        "DTLAUNCH_JOB_START": repr(spec.created),
        "DTLAUNCH_SEED": str(spec.seed),  # the coins of transient injections
        # Step reports at least twice per decision, so the policy sees fresh windows.
        "DTLAUNCH_REPORT_INTERVAL": f"{min(REPORT_EVERY_S, spec.control_interval / 2):g}",
    }
    if spec.inject:
        env["DTLAUNCH_INJECT"] = ";".join(spec.inject)
    if a.role == "worker" and _runs_rna(spec):
        policy = parse_policy(spec.policy)
        assert isinstance(policy, RnaPolicy)
        env.update(policy.worker_env())
    if slot.join is not None:
        # A newcomer joining the survivors: their store, hosted by a survivor, is
        # reached as a client by every rank (torchrun's agent-store convention).
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        env.update(slot.join.env)
    if a.local_world_size > 1:
        # As torchrun does: several processes on one host must not each take every core.
        env["OMP_NUM_THREADS"] = "1"
    env.update(gpu_env(ctx.spec, slot))
    if spec.mode == "ps":
        env.update(
            {
                "DMLC_ROLE": a.role,
                "DMLC_NUM_WORKER": str(len(ranks)),
                "DMLC_NUM_SERVER": str(spec.servers),
                # PS mode has no torch.distributed store, so its port is free for ps-lite.
                "DMLC_PS_ROOT_URI": master_addr,
                "DMLC_PS_ROOT_PORT": str(master_port),
            }
        )
        env["DMLC_WORKER_ID" if a.role == "worker" else "DMLC_SERVER_ID"] = str(a.rank)
    if builtin_ps(spec):
        env.update(ps_env(ctx, slot, ranks))
    if spec.framework == "tf":
        cluster = {kind: list(addresses) for kind, addresses in slot.tf_cluster}
        env["TF_CONFIG"] = tf_config(cluster, a.role, a.rank, ps_mode=spec.mode == "ps")
    # The user's --env wins over ours except where ours is the job's identity.
    for key, value in spec.env.items():
        env.setdefault(key, value)
        if key in _USER_MAY_OVERRIDE:
            env[key] = value
    return env


# Resource choices the user may make for every process with --env.
_USER_MAY_OVERRIDE = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def gpu_env(spec: JobSpec, slot: ProcSlot) -> dict[str, str]:
    """GPU visibility on a host whose hostfile line declares ``gpus=N``.

    As DeepSpeed's launcher does, every worker there sees the host's GPUs and
    LOCAL_RANK names its own, so ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``
    works unmodified; a worker moved to another host gets the LOCAL_RANK of the
    GPU it was given there. Servers keep off the GPUs. Hosts without ``gpus=``
    are left alone (the process sees what the machine shows it).
    """
    count = next((h.gpus for h in spec.hosts if h.label == slot.host), 0)
    if count == 0:
        return {}
    if slot.role != "worker":
        return {"CUDA_VISIBLE_DEVICES": ""}
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in range(count))}
    if slot.gpu >= 0:
        env["LOCAL_RANK"] = str(slot.gpu)
    return env


def _runs_rna(spec: JobSpec) -> bool:
    return spec.policy.partition(":")[0].strip() == "rna"


def builtin_ps(spec: JobSpec) -> bool:
    """Whether the servers are dtlaunch's own (``python -m dtlaunch.ps``); with
    ``--framework tf`` they are TensorFlow's ps tasks instead."""
    return (
        spec.mode == "ps"
        and spec.servers > 0
        and spec.ps_server == "builtin"
        and spec.framework != "tf"
    )


def ps_env(ctx: LaunchContext, slot: ProcSlot, workers: Sequence[int]) -> dict[str, str]:
    """What the built-in PS server and its clients read (``dtlaunch.ps.config``)."""
    spec = ctx.spec
    if slot.role == "worker":
        return {
            "DTLAUNCH_PS_SERVERS": ",".join(slot.ps_servers),
            "DTLAUNCH_PS_BLOCK_BYTES": str(spec.ps_block_bytes),
        }
    # Every attempt of a server snapshots to and restores from the same file on
    # its host, so a restarted server continues from its last snapshot.
    snapshot = f"{ctx.state_dirs.get(slot.host, '/tmp')}/ps/server-{slot.rank}.snapshot"
    env = {
        "DTLAUNCH_PS_BIND": f"tcp://*:{slot.listen_port}",
        # Hierarchical RNA's groups push and pull at their own pace: a BSP step
        # would wait for every worker, and only a group's initiator pushes.
        "DTLAUNCH_PS_MODE": "asp" if _runs_rna(spec) else spec.ps_consistency,
        "DTLAUNCH_PS_WORKERS": ",".join(str(r) for r in workers),
        "DTLAUNCH_PS_SNAPSHOT": snapshot,
    }
    if spec.ps_snapshot_interval > 0:
        env["DTLAUNCH_PS_SNAPSHOT_INTERVAL"] = str(spec.ps_snapshot_interval)
    if slot.attempt == slot.ps_fresh_attempt:
        env["DTLAUNCH_PS_AWAIT_IMPORT"] = "1"  # its blocks come by migration
    elif slot.attempt > 0:
        env["DTLAUNCH_PS_RESTORE"] = snapshot
        env["DTLAUNCH_PS_RESTORE_OPTIONAL"] = "1"
    return env


def build_spawn(
    ctx: LaunchContext,
    slot: ProcSlot,
    master_addr: str,
    master_port: int,
    *,
    workers: Sequence[int] | None = None,
) -> Spawn:
    return Spawn(
        proc_id=slot.proc_id,
        role=slot.role,
        rank=slot.rank,
        attempt=slot.attempt,
        argv=process_argv(ctx.spec, ctx.python, slot.role, slot.rank, prewarm=slot.prewarm),
        env=process_env(ctx, slot, master_addr, master_port, workers=workers),
        cwd=ctx.workdir,
        memory_limit=slot.memory_limit,
        cpu_limit=slot.cpu_limit,
    )
