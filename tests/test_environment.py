"""The environment given to each process: torchrun's and ps-lite's variables."""

from __future__ import annotations

from pathlib import Path

from dtlaunch.config import JobSpec
from dtlaunch.supervisor.environment import LaunchContext, build_spawn
from dtlaunch.supervisor.jobstate.machine import ProcSlot
from dtlaunch.supervisor.placement import Assignment


def _ctx(**spec_fields):
    spec = JobSpec(
        run_id="r1",
        run_dir=Path("/tmp/r1"),
        script="train.py",
        script_args=("--lr", "1"),
        **spec_fields,
    )
    return LaunchContext(
        spec=spec,
        python="/usr/bin/python3",
        workdir="/work",
        hosts_with_workers=2,
        endpoints={"h1": "tcp://10.0.0.1:5555"},
        state_dirs={"h1": "/home/u/.cache/dtlaunch/runs/r1/h1"},
    )


def _slot(role="worker", rank=3, attempt=2, local_world=2):
    a = Assignment(
        role=role, rank=rank, host="h1", local_rank=1, local_world_size=local_world, group_rank=1
    )
    return ProcSlot(assignment=a, host="h1", attempt=attempt)


def test_worker_gets_torchrun_variables():
    spawn = build_spawn(_ctx(workers=4), _slot(), "10.0.0.9", 29500)
    env = spawn.env
    assert spawn.argv == ["/usr/bin/python3", "-u", "train.py", "--lr", "1"]
    assert spawn.cwd == "/work"
    assert (spawn.proc_id, spawn.attempt) == ("worker-3", 2)
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "4"
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "2"
    assert env["GROUP_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "2"
    assert (
        env["ROLE_NAME"] == "worker" and env["ROLE_RANK"] == "3" and env["ROLE_WORLD_SIZE"] == "4"
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.9", "29500")
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "3"
    assert env["TORCHELASTIC_RUN_ID"] == "r1"
    assert (
        env["TORCHELASTIC_ERROR_FILE"]
        == "/home/u/.cache/dtlaunch/runs/r1/h1/errors/worker-3-2.json"
    )
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["DTLAUNCH_SUPERVISOR"] == "tcp://10.0.0.1:5555"
    assert env["DTLAUNCH_REPORT_INTERVAL"] == "1"  # the default 10 s interval: at most 1 s
    assert not any(k.startswith("DMLC_") for k in env)


def test_step_reports_come_at_least_twice_per_control_interval():
    env = build_spawn(_ctx(control_interval=0.5), _slot(), "10.0.0.9", 29500).env
    assert env["DTLAUNCH_REPORT_INTERVAL"] == "0.25"


def test_ps_mode_adds_ps_lite_variables_and_user_env_cannot_override_identity():
    ctx = _ctx(
        workers=4, servers=2, mode="ps", env={"RANK": "99", "OMP_NUM_THREADS": "4", "MY_VAR": "x"}
    )
    env = build_spawn(ctx, _slot(role="server", rank=1), "10.0.0.9", 29500).env
    assert env["DMLC_ROLE"] == "server" and env["DMLC_SERVER_ID"] == "1"
    assert env["DMLC_NUM_WORKER"] == "4" and env["DMLC_NUM_SERVER"] == "2"
    assert env["WORLD_SIZE"] == "2"  # the server role's world
    assert env["RANK"] == "1"
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["MY_VAR"] == "x"


def test_module_mode():
    spec = JobSpec(run_id="r1", run_dir=Path("/tmp"), script="pkg.train", module=True)
    ctx2 = LaunchContext(
        spec=spec, python="py", workdir="/", hosts_with_workers=1, endpoints={}, state_dirs={}
    )
    assert build_spawn(ctx2, _slot(local_world=1), "a", 1).argv == ["py", "-u", "-m", "pkg.train"]


def test_builtin_ps_servers_run_dtlaunch_ps_and_workers_get_their_endpoints():
    ctx = _ctx(workers=2, servers=2, mode="ps", ps_snapshot_interval=5.0)
    server = _slot(role="server", rank=1, attempt=0)
    server.listen_port = 41000
    spawn = build_spawn(ctx, server, "10.0.0.9", 29500)
    assert spawn.argv == ["/usr/bin/python3", "-u", "-m", "dtlaunch.ps"]
    env = spawn.env
    assert env["DTLAUNCH_PS_BIND"] == "tcp://*:41000"
    assert env["DTLAUNCH_PS_MODE"] == "bsp" and env["DTLAUNCH_PS_WORKERS"] == "0,1"
    assert env["DTLAUNCH_PS_SNAPSHOT"].endswith("/r1/h1/ps/server-1.snapshot")
    assert env["DTLAUNCH_PS_SNAPSHOT_INTERVAL"] == "5.0"
    assert "DTLAUNCH_PS_RESTORE" not in env  # a first start has nothing to restore
    server.attempt = 1
    restarted = build_spawn(ctx, server, "10.0.0.9", 29500).env
    assert restarted["DTLAUNCH_PS_RESTORE"] == env["DTLAUNCH_PS_SNAPSHOT"]
    worker = _slot(role="worker", rank=0)
    worker.ps_servers = ("tcp://10.0.0.1:41000", "tcp://10.0.0.2:41001")
    wenv = build_spawn(ctx, worker, "10.0.0.9", 29500).env
    assert wenv["DTLAUNCH_PS_SERVERS"] == "tcp://10.0.0.1:41000,tcp://10.0.0.2:41001"
    assert wenv["DTLAUNCH_PS_BLOCK_BYTES"] == str(4 << 20)


def test_script_servers_keep_the_users_program():
    ctx = _ctx(workers=2, servers=1, mode="ps", ps_server="script")
    spawn = build_spawn(ctx, _slot(role="server", rank=0), "10.0.0.9", 29500)
    assert spawn.argv[-3:] == ["train.py", "--lr", "1"]
    assert not any(k.startswith("DTLAUNCH_PS_") for k in spawn.env)


def test_gpu_hosts_show_workers_their_gpus_and_local_rank_names_the_one_given():
    """DeepSpeed's contract on a host with gpus=: CUDA_VISIBLE_DEVICES lists the
    host's GPUs, LOCAL_RANK indexes it; servers see none; --env may override."""
    from dtlaunch.hostfile import HostSpec

    hosts = (HostSpec(label="h1", hostname="10.0.0.1", slots=4, gpus=3),)
    ctx = _ctx(workers=4, hosts=hosts)
    worker = _slot()
    worker.gpu = 2  # e.g. moved here: not its local rank (1)
    env = build_spawn(ctx, worker, "10.0.0.9", 29500).env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2" and env["LOCAL_RANK"] == "2"
    server = build_spawn(_ctx(workers=2, servers=1, hosts=hosts), _slot("server", 0), "a", 1)
    assert server.env["CUDA_VISIBLE_DEVICES"] == ""
    chosen = _ctx(workers=4, hosts=hosts, env={"CUDA_VISIBLE_DEVICES": "5"})
    assert build_spawn(chosen, worker, "a", 1).env["CUDA_VISIBLE_DEVICES"] == "5"
    plain = build_spawn(_ctx(workers=4), _slot(), "a", 1).env
    assert "CUDA_VISIBLE_DEVICES" not in plain and plain["LOCAL_RANK"] == "1"
