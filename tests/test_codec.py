"""The msgpack codec: round trips, strict validation, fuzzing (decode raises only WireError)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtlaunch.errors import WireError
from dtlaunch.wire import messages as wire_messages
from dtlaunch.wire.codec import MAX_MESSAGE_BYTES, decode, encode, from_dict, to_dict
from dtlaunch.wire.messages import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Ack,
    AckDone,
    AckShards,
    ActionStatus,
    AdjustBatchSize,
    AdjustLR,
    AgentBootstrap,
    AgentHeartbeat,
    Attached,
    Bye,
    DatasetInfo,
    DatasetReady,
    Exited,
    FetchShards,
    Hello,
    Kill,
    Lease,
    LeaveJob,
    NodeStatus,
    Output,
    Ping,
    PlacementReady,
    ProcReport,
    PsPlacedBlock,
    PsPlacementMap,
    RankBatch,
    RankFactor,
    RegisterDataset,
    RegisterPlacement,
    Regroup,
    RegroupGo,
    RegroupReady,
    Rehello,
    ReleaseShards,
    ScaleJob,
    ServerComm,
    ShardGrant,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    StatusReply,
    StatusRequest,
    StatusSnapshot,
    StepReport,
    StepReports,
    StopJob,
    Welcome,
)

FUZZ = settings(max_examples=300, deadline=None, database=None)

REPORT = ProcReport(
    proc_id="worker-3", role="worker", rank=3, attempt=1, pid=4242, state="running",
    rss_bytes=123_456_789, cpu_percent=87.5,
)
DATASET = DatasetInfo(dataset_size=1000, shard_size=100, epochs=2, global_batch=64, seed=7)

PLACEMENT = PsPlacementMap(
    version=2,
    servers=2,
    blocks=[
        PsPlacedBlock(param=0, name="emb.weight", row_start=0, row_end=512, shape=[512, 16],
                      dtype="float32", nbytes=32768, server=1),
        PsPlacedBlock(param=1, name="bias", row_start=0, row_end=0, shape=[],
                      dtype="float32", nbytes=4, server=0),
    ],
)  # fmt: skip

SAMPLES = [
    AgentBootstrap(
        run_id="r-1", host="node1", endpoint="tcp://10.0.0.1:45123",
        server_public="s" * 40, client_public="c" * 40, client_secret="x" * 40,
        state_dir="/tmp/dtl/r-1/node1", heartbeat_interval=1.0, dead_after=3,
        orphan_timeout=30.0, kill_grace=5.0,
    ),
    Hello(
        role="agent", run_id="r-1", host="node1", pid=100, version="0.1.0",
        procs=[REPORT, ProcReport(proc_id="server-0", role="server", rank=0, attempt=0,
                                  pid=101, state="stopped")],
        free_ports=[29500, 29501], host_addr="10.0.0.2",
    ),
    Hello(role="worker", run_id="r-1", host="node1", pid=7, version="0.1.0", rank=3),
    AgentHeartbeat(seq=17, procs=[REPORT]),
    Spawned(proc_id="worker-3", attempt=1, pid=4242),
    SpawnFailed(proc_id="worker-3", attempt=0, error="cwd /nope does not exist"),
    Output(proc_id="worker-3", attempt=0, stream="stderr", data=b"\xff\x00bin\nary\r\n"),
    Exited(proc_id="worker-3", attempt=0, pid=4242, exit_code=None, signal=9, runtime_s=12.5,
           stderr_tail=["Traceback", "Killed"], oom_killed=True),
    Exited(proc_id="server-0", attempt=2, pid=9, exit_code=1, signal=None, runtime_s=0,
           requested=True),
    Bye(reason="orphan timeout"),
    StopJob(),
    ScaleJob(workers=3),
    LeaveJob(reason="dtlaunch scale removed worker 3"),
    Ping(seq=0),
    Welcome(run_id="r-1", heartbeat_interval=0.5),
    Rehello(),
    Spawn(proc_id="worker-3", role="worker", rank=3, attempt=1,
          argv=["python", "train.py", "--lr", "0.1"], env={"RANK": "3", "ü": "✓"},
          cwd="/home/u/job"),
    Kill(proc_id="worker-3", attempt=1, grace_s=5.0),
    Shutdown(grace_s=2.5, reason="job done"),
    wire_messages.DumpStacks(request_id=3, proc_ids=["worker-0", "server-1"]),
    wire_messages.Stacks(request_id=3, stacks={"worker-0": "Thread 1 (idle)\n    f (x.py:3)"}),
    Ack(ok=False, detail="no such run"),
    RegisterDataset(dataset=DATASET),
    DatasetReady(dataset=DATASET),
    DatasetReady(dataset=None, error="--dataset-size 10 but the worker registered 12"),
    RegisterPlacement(placement=PLACEMENT),
    PlacementReady(placement=PLACEMENT),
    PlacementReady(placement=None, error="the job's model has 3 blocks, this worker's 4"),
    FetchShards(request_id=4, count=2),
    ShardGrant(request_id=4, leases=[Lease(lease_id=9, epoch=1, shard=3, start=0, end=100)]),
    ShardGrant(request_id=5, retry_after=0.2),
    ShardGrant(request_id=6, finished=True),
    AckShards(lease_ids=[9, 10], step=77),
    ReleaseShards(lease_ids=[11], step=78, reason="step 78 was dropped (BACKUP_WORKERS)"),
    AckDone(lease_ids=[9]),
    StepReports.of(
        [
            StepReport(step=5, batch_size=32, compute_s=0.25, comm_s=0.01, samples=32, age_s=0.1),
            StepReport(
                step=6, batch_size=32, compute_s=0.25, comm_s=0.01, samples=32,
                servers=[ServerComm(server=1, nbytes=4096, comm_s=0.004)],
            ),
        ]
    ),
    StepReports.of([StepReport(step=7, batch_size=32, compute_s=0.25)]),
    AdjustBatchSize(
        sizes=[RankBatch(rank=0, batch_size=24, accumulation=3), RankBatch(rank=1, batch_size=72)],
        apply_at_step=120,
    ),
    AdjustLR(factors=[RankFactor(rank=1, factor=0.5)], apply_at_step=120),
    Attached(),
    Regroup(gen=1, leaving_rank=2, store_rank=0),
    RegroupReady(gen=1, step=40, store_port=41234),
    RegroupGo(gen=1, master_addr="10.0.0.1", master_port=41234),
    wire_messages.RnaJoin(applied=12, finished=True),
    wire_messages.RnaOpenStore(gen=2),
    wire_messages.RnaStoreReady(gen=2, port=40123),
    wire_messages.RnaGroup(
        gen=2, members=[0, 2, 3], store_addr="10.0.0.2", store_port=40123, source_rank=2,
        timeout_s=30.0, group_size=4,
    ),
    wire_messages.RnaFormed(gen=2, applied=140),
    wire_messages.RnaProbe(gen=2, round=141),
    wire_messages.RnaReady(gen=2, round=141, waited_s=0.012),
    wire_messages.RnaStart(gen=2, round=141, initiator=3, exchange=True, final=True),
    wire_messages.RnaExchanged(gen=2, round=141, seconds=0.0026),
    wire_messages.RnaExchanged(gen=2, round=145, seconds=2.5, ok=False, error="PsError: gone"),
    wire_messages.RnaFailed(gen=2, round=142, error="Connection closed by peer"),
    wire_messages.RnaLeave(applied=150),
    wire_messages.RnaLeft(round=151),
    wire_messages.RnaRounds(
        gen=2, members=[0, 2, 3], rounds=9, contributions=[9, 4, 7],
        sampled=[wire_messages.RnaRoundRecord(
            round=141, initiator=3, contributors=[0, 3], staleness=[0, 1], comm_s=0.004
        )],
    ),
    StatusRequest(request_id=3, run_id="r-1"),
    StatusReply(
        request_id=3,
        snapshot=StatusSnapshot(
            run_id="r-1", policy="nd:lambda=2", mode="ps", phase="running", source="live",
            elapsed_s=12.5, shards_done=4, shards_total=10, throughput=99.5, eta_s=None,
            nodes=[NodeStatus(role="worker", rank=2, host="n1", proc_state="running",
                              recent_bpt_s=[0.1, 0.3], straggler="3.0x the mean BPT")],
            actions=[ActionStatus(at_s=3.0, action="KILL_RESTART", target="worker 2",
                                  reason="persistent straggler")],
            rna_groups=[[0, 2], [1, 3]],
        ),
    ),
    Hello(
        role="worker", run_id="r", host="n1", pid=7, version="0.1.0", rank=3, attempt=2, leases=[9]
    ),
]
# Parameter server (dtlaunch.ps): tensors travel as extra frames, not in these.
_PS_OPT = wire_messages.PsOptimizer(name="adam", lr=1e-3, beta2=0.99)
_PS_BLOCK = wire_messages.PsBlockSpec(block_id=3, shape=[128, 64], dtype="float32")
_PS_STATE = wire_messages.PsBlockState(block=_PS_BLOCK, step=5, tensors=["exp_avg", "exp_avg_sq"])
_PS_UPDATE = wire_messages.PsUpdate(
    version=8, step=7, update_s=0.01, samples=64, applied=[0, 1], dropped=[2]
)
SAMPLES += [
    wire_messages.PsInit(request_id=1, worker=0, optimizer=_PS_OPT, blocks=[_PS_BLOCK],
                         with_data=True, version=6),
    wire_messages.PsInitReply(request_id=1, seeded=True, version=4, incarnation=2**47 + 5,
                              recovered_at=3),
    wire_messages.PsPull(request_id=2, min_version=7, blocks=[3, 5], incarnation=9),
    wire_messages.PsParams(request_id=2, version=7, blocks=[3, 5], incarnation=9),
    wire_messages.PsPush(request_id=3, worker=1, step=7, samples=32, blocks=[3, 5],
                         incarnation=9),
    wire_messages.PsPushAck(request_id=3, step=7, accepted=False, version=8, incarnation=9),
    wire_messages.PsMembership(request_id=4, workers=[0, 1, 3], backup=1),
    wire_messages.PsLeave(request_id=5, worker=2),
    wire_messages.PsIdle(request_id=5, worker=2, idle=True),
    wire_messages.PsIdleReply(request_id=5, member_from=9, version=8, incarnation=9),
    wire_messages.PsSnapshotNow(request_id=6),
    wire_messages.PsExport(request_id=7, blocks=[3], at_version=8, remove=True),
    wire_messages.PsExport(request_id=7, blocks=[3, 4], at_version=9, remove=False, hold=True),
    wire_messages.PsRelease(request_id=12, blocks=[3], placement_version=2),
    wire_messages.PsHoldEnd(request_id=13, blocks=[3, 4]),
    wire_messages.PsExported(request_id=7, version=8, optimizer=_PS_OPT, blocks=[_PS_STATE]),
    wire_messages.PsImport(request_id=8, version=8, optimizer=_PS_OPT, blocks=[_PS_STATE]),
    wire_messages.PsStatsRequest(request_id=9, since_version=2),
    wire_messages.PsStats(request_id=9, server=1, version=8, mode="bsp", backup=1,
                          workers=[0, 1], blocks=[3], updates=[_PS_UPDATE], incarnation=9),
    wire_messages.PsShutdown(request_id=10),
    wire_messages.PsReply(request_id=10, ok=False, version=8, detail="not seeded",
                          incarnation=9, holding=True),
    wire_messages.PsReply(request_id=10, ok=False, version=9, placement_version=2),
    wire_messages.PsPing(request_id=11, awaiting=10),
]
# A valid frame's fields, for building wrong variants of it.
V = PROTOCOL_VERSION  # short: the frames below spell it many times
PING = {"t": "ping", "v": V, "seq": 1}


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def hello_fields(**changes):
    fields = {"t": "hello", "v": V, "role": "agent", "run_id": "r", "host": "h",
              "pid": 1, "version": "0.1.0"}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not ...}


def refused(obj, *fragments: str) -> str:
    with pytest.raises(WireError) as info:
        decode(obj if isinstance(obj, bytes) else pack(obj))
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text
    return text


# ---------------------------------------------------------------- round trips


def test_samples_cover_every_message_type():
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES)


def _ruff_all_order(name: str) -> tuple[int, str]:
    """``__all__``'s order as ruff's RUF022 keeps it: CONSTANTS, then Classes, then the rest."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_messages_package_all_is_sorted_and_every_message_is_registered():
    """The face re-exports each protocol module's names; no message escapes the registry."""
    names = wire_messages.__all__
    assert names == sorted(names, key=_ruff_all_order)
    assert len(set(names)) == len(names)
    assert len({cls.TYPE for cls in MESSAGE_TYPES}) == len(MESSAGE_TYPES)  # tags are unique
    found = 0
    for info in pkgutil.iter_modules(wire_messages.__path__):
        module = importlib.import_module(f"{wire_messages.__name__}.{info.name}")
        exported = set(module.__all__) - {"MESSAGES"}  # each protocol's part of the registry
        assert exported <= set(names), info.name
        if info.name != "base":  # the lazily imported ones: the face knows their names
            assert set(wire_messages._PROTOCOLS[info.name]) == exported, info.name
            assert set(module.MESSAGES) <= set(MESSAGE_TYPES)
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__ or not isinstance(obj, type):
                continue
            assert name in names, f"{info.name}.{name} is not re-exported"
            assert getattr(wire_messages, name) is obj
            if issubclass(obj, wire_messages.Message) and obj is not wire_messages.Message:
                assert obj in MESSAGE_TYPES, f"{info.name}.{name} is not in MESSAGE_TYPES"
                found += 1
    assert found == len(MESSAGE_TYPES)


def test_the_type_checker_sees_what_the_lazy_names_resolve_to():
    """``messages`` imports its protocol modules when asked (PEP 562); its
    ``TYPE_CHECKING`` block must name the same modules and names for mypy."""
    tree = ast.parse(Path(wire_messages.__file__).read_text())
    guarded = next(
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test)
    )
    seen = {
        node.module.rsplit(".", 1)[1]: tuple(a.name for a in node.names)
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
    }
    assert seen == wire_messages._PROTOCOLS


def test_a_protocol_module_is_imported_when_first_asked_for():
    code = """
import sys
from dtlaunch.wire.codec import decode, encode
from dtlaunch.wire.messages import Spawn, PROTOCOL_MODULES
from dtlaunch.wire.messages.base import PROTOCOL_VERSION as V
loaded = lambda: {m.rsplit(".", 1)[1] for m in PROTOCOL_MODULES if m in sys.modules}
assert loaded() == {"agent", "session"}, loaded()  # the wire's face re-exports these two
msg = Spawn(proc_id="w0", role="worker", rank=0, attempt=0, argv=["x"], env={}, cwd="/")
assert decode(encode(msg)) == msg and loaded() == {"agent", "session"}, loaded()
import msgpack
# A tag of an imported protocol never sent from here: found without importing more.
welcome = decode(msgpack.packb({"t": "welcome", "v": V, "run_id": "r", "heartbeat_interval": 1.0}))
assert type(welcome).__name__ == "Welcome" and loaded() == {"agent", "session"}, loaded()
# A tag of a protocol not imported yet: the codec imports the rest, once.
ping = decode(msgpack.packb({"t": "ps_ping", "v": V, "request_id": 7}))
assert type(ping).__name__ == "PsPing" and ping.request_id == 7
assert loaded() == {m.rsplit(".", 1)[1] for m in PROTOCOL_MODULES}, loaded()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_encode_decode_round_trip(msg):
    data = encode(msg)
    assert decode(data) == msg
    raw = msgpack.unpackb(data)
    assert raw["t"] == msg.TYPE
    assert raw["v"] == PROTOCOL_VERSION


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_to_dict_is_json_and_round_trips(msg):
    line = json.dumps(to_dict(msg))
    assert "\n" not in line
    assert from_dict(type(msg), json.loads(line)) == msg


def test_nested_records_are_plain_maps():
    raw = msgpack.unpackb(encode(AgentHeartbeat(seq=1, procs=[REPORT])))
    assert raw["procs"][0] == {
        "proc_id": "worker-3", "role": "worker", "rank": 3, "attempt": 1, "pid": 4242,
        "state": "running", "rss_bytes": 123_456_789, "cpu_percent": 87.5,
        "cpu_throttled": 0.0,
    }


def test_int_is_accepted_for_float_and_becomes_float():
    msg = decode(pack({"t": "welcome", "v": V, "run_id": "r",
                       "heartbeat_interval": 2}))
    assert msg == Welcome(run_id="r", heartbeat_interval=2.0)
    assert type(msg.heartbeat_interval) is float


def test_defaults_are_applied():
    msg = decode(pack(hello_fields()))
    assert msg == Hello(role="agent", run_id="r", host="h", pid=1, version="0.1.0")
    assert msg.rank == -1
    assert msg.procs == []
    assert msg.free_ports == []
    assert msg.host_addr == ""


def test_from_dict_checks_tags_when_present():
    fields = to_dict(Ping(seq=3))
    assert from_dict(Ping, {"seq": 3}) == Ping(seq=3)
    with pytest.raises(WireError, match="does not match"):
        from_dict(Bye, fields)
    with pytest.raises(WireError, match=rf"protocol version 99 .* speaks {PROTOCOL_VERSION}"):
        from_dict(Ping, {**fields, "v": 99})
    with pytest.raises(WireError, match="not valid base64"):
        from_dict(Output, {"proc_id": "w", "attempt": 0, "stream": "stdout", "data": "%%%"})
    with pytest.raises(WireError, match="expected a mapping"):
        from_dict(Ping, [("seq", 1)])  # type: ignore[arg-type]


# ---------------------------------------------------------- strict validation


def test_wrong_version_names_both_versions():
    text = refused({**PING, "v": V + 1}, f"version {PROTOCOL_VERSION + 1}",
                   f"speaks {PROTOCOL_VERSION}")
    assert "same dtlaunch version" in text
    # A newer peer's unknown message type is reported as the version problem it is.
    refused({"t": "from_the_future", "v": 7}, "version 7")


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        ({"v": V, "seq": 1}, "type tag"),
        ({"t": 5, "v": V}, "type tag"),
        ({"t": "nope", "v": V}, "unknown message type 'nope'"),
        ({"t": "ping", "seq": 1}, "protocol version"),
        ({"t": "ping", "v": True, "seq": 1}, "protocol version"),
        ({**PING, "extra": 1}, "unknown field(s) 'extra'"),
        ({"t": "ping", "v": V}, "missing required field(s) seq"),
        ({**PING, "seq": True}, "ping.seq: expected int, got bool"),
        ({**PING, "seq": 1.0}, "ping.seq: expected int, got float"),
        ({**PING, "seq": "1"}, "ping.seq: expected int, got str"),
        ({**PING, "seq": None}, "ping.seq: expected int, got null"),
        ({**PING, "seq": -1}, "ping.seq: -1 is out of range"),
        ({"t": "ack", "v": V, "ok": 1}, "ack.ok: expected bool, got int"),
        ({"t": "bye", "v": V, "reason": b"bytes"}, "bye.reason: expected str, got bytes"),
        ({"t": "output", "v": V, "proc_id": "w", "attempt": 0, "stream": "stdout",
          "data": "text"}, "output.data: expected bytes, got str"),
        ({"t": "output", "v": V, "proc_id": "w", "attempt": 0, "stream": "stdin",
          "data": b""}, "'stdin' is not one of stdout, stderr"),
        ({"t": "welcome", "v": V, "run_id": "r", "heartbeat_interval": True}, "got bool"),
        ({"t": "welcome", "v": V, "run_id": "r", "heartbeat_interval": 0}, "must be > 0"),
        ({"t": "kill", "v": V, "proc_id": "w", "attempt": 0, "grace_s": -1.0}, "must be >= 0"),
        ({"t": "spawned", "v": V, "proc_id": "w", "attempt": 0, "pid": 0}, "pid: 0 is out"),
        ({"t": "spawned", "v": V, "proc_id": "w", "attempt": -1, "pid": 5}, "attempt: -1"),
        ({"t": "ps_ping_x", "v": V}, "unknown message type"),
        ({"t": "ps_reply", "v": V, "request_id": 1, "ok": True, "incarnation": -3},
         "ps_reply.incarnation: -3 is out of range"),
        (hello_fields(role="worker", rank=-2), "hello.rank: -2 is out of range"),
        (hello_fields(role="root"), "hello.role: 'root' is not one of agent, worker"),
        (hello_fields(free_ports=[80, 70000]), "hello.free_ports[1]: 70000 is not a TCP port"),
        (hello_fields(free_ports=[80, True]), "hello.free_ports[1]: expected int, got bool"),
        (hello_fields(free_ports=(1,)), None),  # msgpack arrays are lists; checked below
        (hello_fields(procs=[{"proc_id": "a"}]), "hello.procs[0]: missing required field(s)"),
        (hello_fields(procs=[{"x": 1}]), "hello.procs[0]: unknown field(s) 'x'"),
        (hello_fields(procs=[[1, 2]]), "hello.procs[0]: expected a map, got list"),
        (hello_fields(procs="none"), "hello.procs: expected a list, got str"),
        (hello_fields(host=None), "hello.host: expected str, got null"),
        (hello_fields(pid=...), "missing required field(s) pid"),
        ({"t": "spawn", "v": V, "proc_id": "w", "role": "agent", "rank": 0, "attempt": 0,
          "argv": [], "env": {}, "cwd": "/"}, "spawn.role: 'agent' is not one of worker, server"),
        ({"t": "spawn", "v": V, "proc_id": "w", "role": "worker", "rank": 0, "attempt": 0,
          "argv": ["a", 1], "env": {}, "cwd": "/"}, "spawn.argv[1]: expected str, got int"),
        ({"t": "spawn", "v": V, "proc_id": "w", "role": "worker", "rank": 0, "attempt": 0,
          "argv": [], "env": {"K": 1}, "cwd": "/"}, "spawn.env['K']: expected str, got int"),
        ({"t": "spawn", "v": V, "proc_id": "w", "role": "worker", "rank": 0, "attempt": 0,
          "argv": [], "env": {b"K": "v"}, "cwd": "/"}, "spawn.env: key b'K' is not a string"),
        ({"t": "exited", "v": V, "proc_id": "w", "attempt": 0, "pid": 3, "exit_code": "1",
          "signal": None, "runtime_s": 1.0}, "exited.exit_code: expected int | None, got str"),
        ({"t": "exited", "v": V, "proc_id": "w", "attempt": 0, "pid": 3, "exit_code": None,
          "signal": 0, "runtime_s": 1.0}, "exited.signal: 0 is out of range"),
        ({"t": "exited", "v": V, "proc_id": "w", "attempt": 0, "pid": 3, "exit_code": 0,
          "signal": None, "runtime_s": float("nan")}, "is not a finite number"),
        ({"t": "exited", "v": V, "proc_id": "w", "attempt": 0, "pid": 3, "exit_code": 0,
          "signal": None, "runtime_s": float("inf")}, "is not a finite number"),
    ],
)
def test_bad_fields_are_refused_with_a_path(frame, fragment):
    if fragment is None:
        # A tuple packs as an array and decodes as a list: fine, not an error.
        assert decode(pack(frame)).free_ports == [1]
        return
    refused(frame, fragment)


def test_record_state_and_role_are_enumerated():
    report = {"proc_id": "w-0", "role": "worker", "rank": 0, "attempt": 0, "pid": 1,
              "state": "running"}
    assert decode(pack(hello_fields(procs=[report]))).procs[0].state == "running"
    refused(hello_fields(procs=[{**report, "state": "dead"}]), "hello.procs[0].state: 'dead'")
    refused(hello_fields(procs=[{**report, "role": "agent"}]), "hello.procs[0].role: 'agent'")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (pack(PING) + b"\x00", "not valid msgpack"),  # trailing bytes
        (pack(PING)[:-1], "not valid msgpack"),  # truncated
        (pack([1, 2]), "msgpack list, expected a map"),
        (pack("ping"), "msgpack str, expected a map"),
        (pack(None), "msgpack NoneType, expected a map"),
        (pack({1: "x"}), "not valid msgpack"),  # strict_map_key: int keys refused
        (b"\x81\xa1t\xa2\xff\xfe", "not valid msgpack"),  # invalid UTF-8 in a str
        (pack({**PING, "seq": msgpack.ExtType(5, b"x")}), "ext type 5 is not allowed"),
        (b"\x83\xa1t\xa4ping\xa1v" + bytes([V]) + b"\xa3seq\xd6\xff\x00\x00\x00\x01",
         "ping.seq: expected int"),
        (b"\x91" * 5000 + b"\x01", "not valid msgpack"),  # absurd nesting
    ],
)
def test_garbage_is_refused(data, fragment):
    refused(data, fragment)


def test_oversized_frame_is_refused_before_unpacking():
    limit_ok = pack({"t": "bye", "v": V, "reason": "x" * 100})
    assert decode(limit_ok) == Bye(reason="x" * 100)
    # Valid msgpack, so only the size check can refuse it.
    huge = pack({"t": "output", "v": V, "proc_id": "w", "attempt": 0, "stream": "stdout",
                 "data": b"\0" * MAX_MESSAGE_BYTES})
    refused(huge, f"{len(huge)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")


def test_non_bytes_input_is_a_wire_error():
    with pytest.raises(WireError):
        decode(12)  # type: ignore[arg-type]
    with pytest.raises(WireError):
        decode("text")  # type: ignore[arg-type]


def test_encode_refuses_what_a_receiver_would_drop():
    with pytest.raises(WireError, match=r"hello\.role: 'root'"):
        encode(Hello(role="root", run_id="r", host="h", pid=1, version="0"))
    with pytest.raises(WireError, match=r"spawned\.pid: expected int, got str"):
        encode(Spawned(proc_id="w", attempt=0, pid="1"))  # type: ignore[arg-type]
    with pytest.raises(WireError, match="smaller chunks"):
        encode(Output(proc_id="w", attempt=0, stream="stdout", data=b"\0" * MAX_MESSAGE_BYTES))
    with pytest.raises(WireError, match="not a registered wire message"):
        encode(ProcReport(proc_id="w", role="worker", rank=0, attempt=0, pid=1,
                          state="running"))  # type: ignore[arg-type]


# ----------------------------------------------------------------- fuzzing

scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20,
)


def decode_or_wire_error(data: bytes) -> None:
    try:
        msg = decode(data)
    except WireError:
        return
    assert type(msg) in MESSAGE_TYPES
    assert decode(encode(msg)) == msg  # whatever is accepted is a valid message


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    decode_or_wire_error(data)


@FUZZ
@given(values)
def test_fuzz_random_msgpack_values(value):
    decode_or_wire_error(pack(value))


@FUZZ
@given(
    st.sampled_from(SAMPLES),
    st.sampled_from(["drop", "set", "add"]),
    st.data(),
)
def test_fuzz_mutated_valid_messages(msg, action, data):
    fields = msgpack.unpackb(encode(msg))
    key = data.draw(st.sampled_from(sorted(fields)))
    if action == "drop":
        del fields[key]
    elif action == "set":
        fields[key] = data.draw(values)
    else:
        fields[data.draw(st.text(max_size=8))] = data.draw(values)
    decode_or_wire_error(pack(fields))


@FUZZ
@given(st.binary(max_size=2000), st.sampled_from(["stdout", "stderr"]),
       st.integers(min_value=0, max_value=2**31))
def test_fuzz_output_round_trip(data, stream, attempt):
    msg = Output(proc_id="worker-0", attempt=attempt, stream=stream, data=data)
    assert decode(encode(msg)) == msg
    assert from_dict(Output, json.loads(json.dumps(to_dict(msg)))) == msg


@FUZZ
@given(
    st.lists(st.text(max_size=30), max_size=8),
    st.dictionaries(st.text(max_size=10), st.text(max_size=30), max_size=8),
    st.one_of(st.none(), st.integers(min_value=-(2**31), max_value=2**31)),
    st.floats(min_value=0, max_value=1e9, allow_nan=False),
)
def test_fuzz_spawn_and_exited_round_trip(argv, env, exit_code, runtime):
    spawn = Spawn(proc_id="server-1", role="server", rank=1, attempt=0, argv=argv, env=env,
                  cwd="/")
    exited = Exited(proc_id="server-1", attempt=0, pid=2, exit_code=exit_code, signal=None,
                    runtime_s=runtime, stderr_tail=argv)
    for msg in (spawn, exited):
        assert decode(encode(msg)) == msg
        assert from_dict(type(msg), json.loads(json.dumps(to_dict(msg)))) == msg


# --------------------------------------------- hostile frames (issue 12, defect 2)


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("where", ["tag", "version", "field"])
def test_a_deeply_nested_value_is_a_wire_error_not_a_recursion_error(where):
    """One authenticated frame with a value nested 1,000 deep used to raise
    RecursionError from repr() in the error path, outside every guard."""
    deep = _nested(1000)
    frame = {"t": "fetch_shards", "v": V, "request_id": 1, "count": 1}
    frame[{"tag": "t", "version": "v", "field": "count"}[where]] = deep
    with pytest.raises(WireError):
        decode(msgpack.packb(frame))


# 1,200 fresh examples a run (no database, no fixed seed): every CI run mutates others.
@settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_decode_raises_only_wire_error_on_mutated_frames(data):
    """Coverage-guided by hypothesis: valid frames of every registered message,
    with bytes flipped, cut, inserted or replaced; decode either returns a
    message or raises WireError, never anything else."""
    msg = data.draw(st.sampled_from(SAMPLES))
    frame = bytearray(encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "replace"]))
        at = data.draw(st.integers(0, max(0, len(frame) - 1)))
        if op == "flip" and frame:
            frame[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del frame[at:]
        elif op == "insert":
            frame[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        elif frame:
            frame[at] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireError):
        decode(bytes(frame))


@settings(max_examples=1000, deadline=None)
@given(value=st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=40,
))  # fmt: skip
def test_decode_raises_only_wire_error_on_any_msgpack_value(value):
    for frame in (value, {"t": "hello", "v": V, "role": value}, {"t": "step_reports", "v": V,
                                                                  "step": [value]}):  # fmt: skip
        with contextlib.suppress(WireError):
            decode(msgpack.packb(frame))


def test_a_list_of_floats_taken_in_one_pass_is_still_checked_item_by_item_when_it_must():
    """The fast path for float lists (a status snapshot's 10^4 sparkline points)
    passes only finite floats through; anything else gets the per-item check:
    an int becomes a float, NaN and text are refused with the item's path."""
    node = {"role": "worker", "rank": 0, "host": "h", "proc_state": "running"}
    snapshot = {"run_id": "r", "policy": "none", "mode": "ps", "phase": "running",
                "source": "live", "nodes": [node]}  # fmt: skip

    def reply(points):
        nodes = [{**node, "recent_bpt_s": points}]
        frame = {"t": "status_reply", "v": V, "request_id": 1}
        return pack({**frame, "snapshot": {**snapshot, "nodes": nodes}})

    def points_of(frame):
        return decode(frame).snapshot.nodes[0].recent_bpt_s

    assert points_of(reply([0.1, 0.2])) == [0.1, 0.2]
    mixed = points_of(reply([0.1, 2]))
    assert mixed == [0.1, 2.0] and type(mixed[1]) is float
    with pytest.raises(WireError, match=r"recent_bpt_s\[1\]: nan is not a finite number"):
        decode(reply([0.1, float("nan")]))
    with pytest.raises(WireError, match=r"recent_bpt_s\[0\]: expected float"):
        decode(reply(["0.1"]))
