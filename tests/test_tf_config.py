"""``--framework tf`` without TensorFlow: which TF task every process is, the
TF_CONFIG it gets, the ports the node table keeps for it, and the options refused.
(The jobs themselves run in tests/test_tf_jobs.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtlaunch.config import JobSpec, RunOptions
from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.environment import LaunchContext, build_spawn
from dtlaunch.supervisor.jobstate.machine import JobState, ProcState, SendToAgent, Timing
from dtlaunch.supervisor.jobstate.tftasks import runs_script, tf_cluster, tf_config, tf_task
from dtlaunch.supervisor.placement import place
from dtlaunch.tfserver import read_tf_config
from dtlaunch.wire.messages import Exited, ProcReport, Spawn

TIMING = Timing(
    heartbeat_interval=1.0, dead_after=3, orphan_timeout=60.0, kill_grace=2.0, agent_timeout=30.0
)
HOSTS = [HostSpec(label=f"h{i}", hostname=f"127.0.0.{i + 2}", slots=2) for i in range(3)]


def test_tasks_in_ps_mode_are_a_chief_workers_and_ps():
    assert tf_task("worker", 0, ps_mode=True) == ("chief", 0)
    assert tf_task("worker", 1, ps_mode=True) == ("worker", 0)
    assert tf_task("worker", 2, ps_mode=True) == ("worker", 1)
    assert tf_task("server", 1, ps_mode=True) == ("ps", 1)
    assert [runs_script("worker", r, ps_mode=True) for r in range(3)] == [True, False, False]
    assert not runs_script("server", 0, ps_mode=True)


def test_tasks_in_allreduce_mode_are_all_workers_running_the_script():
    assert [tf_task("worker", r, ps_mode=False) for r in range(3)] == [
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    assert all(runs_script("worker", r, ps_mode=False) for r in range(3))


def test_the_cluster_lists_each_type_in_index_order_whatever_order_it_is_given_in():
    endpoints = [
        ("server", 1, "c:4"),
        ("worker", 2, "b:3"),
        ("worker", 0, "a:1"),
        ("server", 0, "c:5"),
        ("worker", 1, "a:2"),
    ]
    assert tf_cluster(endpoints, ps_mode=True) == {
        "chief": ["a:1"],
        "worker": ["a:2", "b:3"],
        "ps": ["c:5", "c:4"],
    }
    assert tf_cluster(endpoints[1:3] + endpoints[4:], ps_mode=False) == {
        "worker": ["a:1", "a:2", "b:3"]
    }
    with pytest.raises(ValueError, match="not numbered"):
        tf_cluster([("worker", 1, "a:1")], ps_mode=False)


def _ctx(**spec_fields):
    spec = JobSpec(run_id="r1", run_dir=Path("/tmp/r1"), script="train.py", **spec_fields)
    return LaunchContext(
        spec=spec,
        python="py",
        workdir="/w",
        hosts_with_workers=2,
        endpoints={},
        state_dirs={},
    )


def _spawns(out) -> list[Spawn]:
    return [c.message for c in out if isinstance(c, SendToAgent) and isinstance(c.message, Spawn)]


def _bring_up(state: JobState, ports: dict[str, list[int]]) -> list[Spawn]:
    out = state.start(0.0)
    for host in state.agents:
        out += state.agent_hello(
            host, 0.1, free_ports=ports[host], host_addr=f"addr-{host}", procs=[]
        )
    return _spawns(out)


def _state(ctx: LaunchContext, hosts=HOSTS) -> JobState:
    spec = ctx.spec
    return JobState(
        place(hosts, workers=spec.workers, servers=spec.servers),
        timing=TIMING,
        max_restarts=2,
        restart_scope="process" if spec.mode == "ps" else "group",
        build_spawn=lambda slot, addr, port: build_spawn(ctx, slot, addr, port),
        tf_tasks=spec.mode if spec.framework == "tf" else "",
        master_addr_of=lambda label, reported: reported,
        spare_hosts=[h.label for h in hosts if h.spare],
        host_slots={h.label: h.slots for h in hosts},
    )


PORTS = {f"h{i}": [10000 * (i + 1) + p for p in range(32)] for i in range(3)}


def test_every_process_of_a_ps_job_gets_its_task_and_the_whole_cluster():
    ctx = _ctx(workers=3, servers=2, mode="ps", framework="tf")
    state = _state(ctx)
    spawns = {s.proc_id: s for s in _bring_up(state, PORTS)}
    assert sorted(spawns) == ["server-0", "server-1", "worker-0", "worker-1", "worker-2"]
    # Placement: the servers fill h0's two slots, the workers h1's and then h2;
    # ports come after the two MASTER_PORT slots, one per listening process a host.
    cluster = {
        "chief": ["addr-h1:20002"],
        "worker": ["addr-h1:20003", "addr-h2:30002"],
        "ps": ["addr-h0:10002", "addr-h0:10003"],
    }
    expected_task = {
        "worker-0": {"type": "chief", "index": 0},
        "worker-1": {"type": "worker", "index": 0},
        "worker-2": {"type": "worker", "index": 1},
        "server-0": {"type": "ps", "index": 0},
        "server-1": {"type": "ps", "index": 1},
    }
    for proc_id, spawn in spawns.items():
        tf = json.loads(spawn.env["TF_CONFIG"])
        assert tf == {"cluster": cluster, "task": expected_task[proc_id]}, proc_id
    # Only the chief runs the script; it alone is the SDK's world (it reads the data).
    assert spawns["worker-0"].argv == ["py", "-u", "train.py"]
    assert spawns["worker-0"].env["WORLD_SIZE"] == "1"
    for proc_id in ("worker-1", "worker-2", "server-0", "server-1"):
        assert spawns[proc_id].argv == ["py", "-u", "-m", "dtlaunch.tfserver"], proc_id
    # TF's ps tasks are not dtlaunch's built-in servers.
    assert not any(k.startswith("DTLAUNCH_PS_") for s in spawns.values() for k in s.env)


def test_an_allreduce_job_gives_every_worker_the_workers_list_and_its_index():
    ctx = _ctx(workers=3, framework="tf")
    spawns = {s.proc_id: s for s in _bring_up(_state(ctx), PORTS)}
    workers = ["addr-h0:10002", "addr-h0:10003", "addr-h1:20002"]
    for rank in range(3):
        spawn = spawns[f"worker-{rank}"]
        assert spawn.argv == ["py", "-u", "train.py"]
        assert spawn.env["WORLD_SIZE"] == "3"
        assert json.loads(spawn.env["TF_CONFIG"]) == {
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": rank},
        }


def test_without_tf_there_is_no_tf_config():
    spawns = _bring_up(_state(_ctx(workers=2)), PORTS)
    assert spawns and not any("TF_CONFIG" in s.env for s in spawns)


def test_nothing_is_spawned_until_every_tasks_address_is_known():
    ctx = _ctx(workers=3, servers=2, mode="ps", framework="tf")
    state = _state(ctx)
    out = state.start(0.0)
    out += state.agent_hello("h0", 0.1, free_ports=PORTS["h0"], host_addr="addr-h0", procs=[])
    out += state.agent_hello("h1", 0.1, free_ports=PORTS["h1"], host_addr="addr-h1", procs=[])
    assert not _spawns(out)
    out = state.agent_hello("h2", 0.2, free_ports=PORTS["h2"], host_addr="addr-h2", procs=[])
    assert len([c for c in out if isinstance(c, SendToAgent)]) == 5


def _exited(
    proc_id: str,
    attempt: int,
    *,
    code: int | None = None,
    sig: int | None = None,
    requested: bool = False,
):
    return Exited(
        proc_id=proc_id,
        attempt=attempt,
        pid=1,
        exit_code=code,
        signal=sig,
        runtime_s=30.0,
        stderr_tail=[],
        requested=requested,
    )


def test_a_task_of_a_lost_host_waits_for_it_instead_of_moving_to_a_spare():
    hosts = [*HOSTS, HostSpec(label="spare", hostname="127.0.0.9", slots=2, spare=True)]
    state = _state(_ctx(workers=3, framework="tf"), hosts)
    ports = PORTS | {"spare": [40000 + p for p in range(32)]}
    first = {s.proc_id: s.env["TF_CONFIG"] for s in _bring_up(state, ports)}
    for proc_id in first:
        state.spawned(state.procs[proc_id].host, proc_id, 0, 100, 0.2)
    out = state.agent_exited("h1", 5.0, definite=True, detail="ssh channel closed")
    for proc_id in ("worker-0", "worker-1"):  # the group restart stops the others
        out += state.exited("h0", _exited(proc_id, 0, sig=15, requested=True), 5.5)
    out += state.tick(6.0)
    # worker-2's address is in everyone's TF_CONFIG: the group waits for its host.
    assert state.procs["worker-2"].host == "h1"
    assert [s.state for s in state.procs.values()] == [ProcState.PENDING] * 3
    assert not _spawns(out)
    # Back after its cooldown (30 s for a first loss), h0 heard all along.
    state.agent_seen("h0", 35.5)
    out = state.agent_hello("h1", 36.0, free_ports=PORTS["h1"], host_addr="addr-h1", procs=[])
    out += state.tick(36.5)
    again = {s.proc_id: s.env["TF_CONFIG"] for s in _spawns(out)}
    assert again == first


def test_a_restarted_task_keeps_its_address_and_the_chief_ends_the_job():
    ctx = _ctx(workers=3, servers=2, mode="ps", framework="tf")
    state = _state(ctx)
    first = {s.proc_id: s for s in _bring_up(state, PORTS)}
    for proc_id in first:
        state.spawned(state.procs[proc_id].host, proc_id, 0, 100, 0.2)
    host_of = {proc_id: slot.host for proc_id, slot in state.procs.items()}
    out = state.exited(host_of["worker-1"], _exited("worker-1", 0, sig=9), 5.0)
    out += state.tick(6.0)
    [again] = [c.message for c in out if isinstance(c, SendToAgent)]
    assert isinstance(again, Spawn) and (again.proc_id, again.attempt) == ("worker-1", 1)
    assert again.env["TF_CONFIG"] == first["worker-1"].env["TF_CONFIG"]
    # TF's worker and ps tasks serve until stopped: the chief's success is the job's.
    state.spawned(host_of["worker-1"], "worker-1", 1, 101, 6.5)
    state.exited(host_of["worker-0"], _exited("worker-0", 0, code=0), 20.0)
    assert state.procs["worker-0"].state is ProcState.SUCCEEDED
    assert state.status == "succeeded" and state.stop_reason == "the chief (worker 0) finished"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"framework": "jax"}, "--framework must be one of torch, tf"),
        ({"framework": "tf", "mode": "ps", "servers": 1, "workers": 1}, "needs --workers 2"),
        (
            {"framework": "tf", "mode": "ps", "servers": 1, "workers": 2, "policy": "nd"},
            "drop --policy",
        ),
        ({"framework": "tf", "workers": 2, "policy": "lb-bsp:lambda=1.2"}, "drop --policy"),
        (
            {"framework": "tf", "mode": "ps", "servers": 1, "workers": 2, "ps_server": "script"},
            "drop --ps-server script",
        ),
    ],
)
def test_impossible_tf_requests_are_refused_with_the_fix(fields, message):
    with pytest.raises(ConfigError, match=message):
        JobSpec(run_id="r1", run_dir=Path("/tmp/r1"), script="t.py", **fields).validate()


def test_run_options_carry_the_framework_into_the_spec():
    spec = RunOptions(script="t.py", framework="tf", workers=3, servers=2).job_spec()
    assert (spec.framework, spec.mode) == ("tf", "ps")
    assert JobSpec.from_json(spec.to_json()).framework == "tf"


def test_the_tf_server_reads_its_task_and_refuses_what_it_cannot_serve():
    cluster = {"chief": ["a:1"], "worker": ["a:2"], "ps": ["b:3"]}
    task = read_tf_config({"TF_CONFIG": tf_config(cluster, "server", 0, ps_mode=True)})
    assert (task.task_type, task.index, task.address) == ("ps", 0, "b:3")
    with pytest.raises(ConfigError, match="TF_CONFIG is not set"):
        read_tf_config({})
    with pytest.raises(ConfigError, match="not a TensorFlow cluster description"):
        read_tf_config({"TF_CONFIG": "{"})
    with pytest.raises(ConfigError, match="the chief runs the script"):
        read_tf_config({"TF_CONFIG": tf_config(cluster, "worker", 0, ps_mode=True)})
    with pytest.raises(ConfigError, match="not in its cluster"):
        read_tf_config(
            {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 4}})}
        )


def test_a_tasks_port_holds_when_its_agent_reports_other_free_ports():
    # Every Hello probes anew, and the ports the tasks hold are not free then.
    ctx = _ctx(workers=3, servers=2, mode="ps", framework="tf")
    state = _state(ctx)
    first = {s.proc_id: s for s in _bring_up(state, PORTS)}
    for proc_id in first:
        state.spawned(state.procs[proc_id].host, proc_id, 0, 100, 0.2)
    host = state.procs["worker-1"].host
    running = [
        ProcReport(proc_id=p, role=s.role, rank=s.rank, attempt=0, pid=100, state="running")
        for p, s in state.procs.items()
        if s.host == host
    ]
    state.agent_hello(host, 1.0, free_ports=[9000 + p for p in range(32)], host_addr=f"addr-{host}",
                      procs=running, pid=0)  # fmt: skip
    out = state.exited(host, _exited("worker-1", 0, sig=9), 5.0) + state.tick(6.0)
    [again] = [c.message for c in out if isinstance(c, SendToAgent)]
    assert again.attempt == 1
    assert again.env["TF_CONFIG"] == first["worker-1"].env["TF_CONFIG"]


def test_a_resumed_supervisor_gives_restarted_tasks_the_ports_of_the_event_log():
    ctx = _ctx(workers=3, servers=2, mode="ps", framework="tf")
    before = {s.proc_id: s for s in _bring_up(_state(ctx), PORTS)}
    ports = {}
    for proc_id, spawn in before.items():
        task = json.loads(spawn.env["TF_CONFIG"])["task"]
        address = json.loads(spawn.env["TF_CONFIG"])["cluster"][task["type"]][task["index"]]
        ports[proc_id] = (address.split(":")[0].removeprefix("addr-"), int(address.split(":")[1]))
    resumed = _state(ctx)
    attempts = dict.fromkeys(before, 0)
    resumed.resume(0.0, attempts=attempts, restarts=[], failures=[], adopt=set(),
                   listen_ports=ports)  # fmt: skip
    other = {h: [7000 + 100 * i + p for p in range(32)] for i, h in enumerate(PORTS)}
    out: list = []
    for host in resumed.agents:
        out += resumed.agent_hello(host, 1.0, free_ports=other[host], host_addr=f"addr-{host}",
                                   procs=[])  # fmt: skip
    after = {s.proc_id: s for s in _spawns(out)}
    assert {p: s.env["TF_CONFIG"] for p, s in after.items()} == {
        p: s.env["TF_CONFIG"] for p, s in before.items()
    }
