"""``dtlaunch scale`` of an allreduce job: the group re-forms with a new size.

Unit level (no I/O, a fake clock): the supervisor's resize bookkeeping, the node
table's prewarmed newcomers and regroup-removed ranks, the driver's messages,
and the SDK holding a leaving worker's agreement back until its shard is
trained. The live job is in ``test_scale_allreduce.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.events import EventRecorder, MemorySink
from dtlaunch.hostfile import HostSpec
from dtlaunch.runtime.data import BatchStream
from dtlaunch.sharding import DatasetSpec
from dtlaunch.supervisor.jobstate import AskToLeave
from dtlaunch.supervisor.jobstate.machine import JobState, Timing
from dtlaunch.supervisor.placement import place
from dtlaunch.supervisor.regroup.coordinator import RegroupCoordinator
from dtlaunch.supervisor.regroup.driver import JOIN_PREFIX, RegroupDriver
from dtlaunch.wire.messages import Kill, Lease, Regroup, RegroupGo, RegroupReady, Spawn

TIMING = Timing(
    heartbeat_interval=1.0, dead_after=3, orphan_timeout=60.0, kill_grace=2.0, agent_timeout=30.0
)


def attached_coordinator(world_size: int) -> RegroupCoordinator:
    coord = RegroupCoordinator(world_size=world_size, timeout_s=10.0)
    for rank in range(world_size):
        coord.attached(rank)
    return coord


# ----------------------------------------------------------- the coordinator


def test_a_resize_is_refused_with_the_reason_while_it_cannot_be_carried_out():
    coord = RegroupCoordinator(world_size=2, timeout_s=10.0)
    # No worker attached (a torchrun script): the resize restarts the group.
    assert coord.restarts_to_resize() and coord.resize_refusal(3, global_batch=30) is None
    assert "at most 30 workers" in (coord.resize_refusal(40, global_batch=30) or "")
    coord.attached(0)
    assert not coord.restarts_to_resize()
    refusal = coord.resize_refusal(3, global_batch=30)
    assert refusal is not None and "[1] have not called job.attach" in refusal
    coord.attached(1)
    assert coord.resize_refusal(3, global_batch=30) is None
    refusal = coord.resize_refusal(40, global_batch=30)
    assert refusal is not None and "at most 30 workers" in refusal
    assert coord.resize_refusal(40, global_batch=0) is None  # the shard size per worker
    coord.begin_resize(3, joining=[2], reason="more", now=0.0)
    refusal = coord.resize_refusal(4, global_batch=30)
    assert refusal is not None and "a resize (regroup generation 1) is under way" in refusal
    assert not coord.can_regroup(0)  # and no KILL_RESTART meanwhile


def test_a_group_restarted_with_a_new_size_must_attach_again():
    coord = RegroupCoordinator(world_size=2, timeout_s=10.0)
    coord.attached(0)
    coord.attached(1)
    coord.restarted(3)
    assert coord.world_size == 3 and coord.restarts_to_resize()


def test_growing_waits_for_every_newcomer_to_be_warm_then_for_each_to_attach():
    coord = attached_coordinator(2)
    assert coord.begin_resize(4, joining=[2, 3], reason="more", now=1.0) is None
    assert coord.announce(0, 2.0) is None  # not a newcomer
    assert coord.announce(2, 2.0) is None  # 3 is still importing torch
    msg = coord.announce(3, 3.0)
    assert msg == Regroup(gen=1, leaving_rank=-1, store_rank=0, world_size=4)
    assert coord.announce(3, 3.1) is None  # once
    assert coord.survivors() == [0, 1]
    assert coord.resize_go() is None  # no store yet
    pending = coord.ready(0, RegroupReady(gen=1, step=7, store_port=4100), "10.0.0.1")
    assert pending is not None and pending.leaving == frozenset()
    go = coord.resize_go()
    assert go == RegroupGo(gen=1, master_addr="10.0.0.1", master_port=4100, source_rank=0)
    assert coord.complete_shrink() is None  # newcomers still to join
    assert coord.attached(2) is None
    done = coord.attached(3)
    assert done is not None and done.world_size == 4
    assert coord.world_size == 4 and coord.pending is None
    assert coord.can_regroup(3)  # all four attached: a later KILL_RESTART may regroup


def test_shrinking_goes_out_at_once_and_is_done_when_the_store_is_up():
    coord = attached_coordinator(4)
    msg = coord.begin_resize(2, joining=[], reason="fewer", now=1.0)
    assert msg == Regroup(gen=1, leaving_rank=-1, store_rank=0, world_size=2)
    assert coord.pending is not None and coord.pending.leaving == frozenset({2, 3})
    assert coord.survivors() == [0, 1]
    assert coord.complete_shrink() is None  # the removed ranks are still training
    coord.ready(0, RegroupReady(gen=1, step=30, store_port=4100), "h0")
    done = coord.complete_shrink()
    assert done is not None and coord.world_size == 2 and coord.pending is None
    assert coord.can_regroup(1)  # ranks 2 and 3 no longer count as attached


def test_a_resize_that_never_gets_its_store_leaves_the_group_at_its_new_size():
    coord = attached_coordinator(2)
    coord.begin_resize(3, joining=[2], reason="more", now=0.0)
    assert coord.expired(9.0) is None
    expired = coord.expired(10.5)
    assert expired is not None and expired.world_size == 3
    assert coord.world_size == 3 and coord.pending is None


def test_a_worker_ending_during_a_resize_ends_it_but_a_removed_one_does_not():
    coord = attached_coordinator(3)
    coord.begin_resize(2, joining=[], reason="fewer", now=0.0)
    assert coord.abandon_resize(2) is None  # removed: its exit is part of the resize
    abandoned = coord.abandon_resize(0)
    assert abandoned is not None and coord.world_size == 2 and coord.pending is None
    assert coord.abandon_resize(0) is None  # nothing under way


# ------------------------------------------------------------ the node table


def _state(
    spare_slots: int = 2, *, hosts: list[HostSpec] | None = None, workers: int = 2
) -> JobState:
    """``workers`` on ``hosts`` (default: two on h0) and a spare host, every
    process running; a spawn's argv says whether it is prewarmed."""
    hosts = (hosts or [HostSpec(label="h0", hostname="127.0.0.1", slots=2)]) + [
        HostSpec(label="spare", hostname="127.0.0.3", slots=spare_slots, spare=True),
    ]

    def build_spawn(slot, addr, port):
        workers = state.worker_ranks()  # as job.py's builder reads them
        return Spawn(
            proc_id=slot.proc_id,
            role=slot.role,
            rank=slot.rank,
            attempt=slot.attempt,
            argv=["python", "-m", "dtlaunch.runtime.prewarm"] if slot.prewarm else ["python"],
            env={"WORLD_SIZE": str(len(workers))},
            cwd="/",
        )

    state = JobState(
        place(hosts, workers=workers, servers=0),
        timing=TIMING,
        max_restarts=3,
        restart_scope="group",
        build_spawn=build_spawn,
        master_addr_of=lambda label, reported: label + "-addr",
        spare_hosts=["spare"],
        host_slots={h.label: h.slots for h in hosts},
    )
    out = state.start(0.0)
    for host in state.agents:
        out += state.agent_hello(host, 0.1, free_ports=[5000], host_addr="", procs=[])
    for spawn in [c.message for c in out if isinstance(getattr(c, "message", None), Spawn)]:
        state.spawned(state.procs[spawn.proc_id].host, spawn.proc_id, spawn.attempt, 100, 0.2)
    return state


def spawns(commands) -> list[Spawn]:
    return [c.message for c in commands if isinstance(getattr(c, "message", None), Spawn)]


def test_an_allreduce_job_scales_only_as_a_regroup():
    state = _state()
    with pytest.raises(ConfigError, match="not --policy rna"):
        state.scale_workers(3, 1.0)
    assert state.worker_ranks() == [0, 1]


def test_new_ranks_start_prewarmed_and_removed_ones_are_not_asked_to_leave():
    state = _state()
    out = state.scale_workers(4, 1.0, reason="more", regroup=True)
    started = spawns(out)
    assert sorted(s.proc_id for s in started) == ["worker-2", "worker-3"]
    assert all(s.argv[1:] == ["-m", "dtlaunch.runtime.prewarm"] for s in started)
    assert {s.env["WORLD_SIZE"] for s in started} == {"4"}
    for spawn in started:
        state.spawned("spare", spawn.proc_id, spawn.attempt, 200 + spawn.rank, 1.1)
    out = state.scale_workers(2, 2.0, reason="fewer", regroup=True)
    # The Regroup tells them; nobody is stopped or asked yet.
    assert not [c for c in out if isinstance(c, AskToLeave)]
    assert not [c for c in out if isinstance(getattr(c, "message", None), Kill)]
    assert set(state.removing) == {"worker-2", "worker-3"}
    assert state.worker_ranks() == [0, 1]


# ---------------------------------------------------------------- the driver


class Harness:
    def __init__(self, world_size: int) -> None:
        self.state = _state()
        self.coord = attached_coordinator(world_size)
        self.sent: list[tuple[bytes, object]] = []
        self.applied: list[object] = []
        self.sink = MemorySink()

        async def send(peer: bytes, msg: object) -> None:
            self.sent.append((peer, msg))

        self.resizes = 0

        def resized() -> None:
            self.resizes += 1

        self.driver = RegroupDriver(
            self.coord,
            state=self.state,
            recorder=EventRecorder([self.sink]),
            send=send,
            apply=self.applied.extend,
            clock=lambda: 5.0,
            worker_peer=lambda rank: b"worker:%d@0" % rank,
            resized=resized,
        )


def test_the_driver_grows_the_group_through_warm_newcomers():
    h = Harness(2)
    h.state.scale_workers(4, 1.0, reason="more", regroup=True)
    asyncio.run(h.driver.resize(4, joining=[2, 3], reason="more"))
    assert h.sent == []  # the newcomers import torch first
    asyncio.run(h.driver.joiner_hello(2))
    asyncio.run(h.driver.joiner_hello(3))
    regroup = Regroup(gen=1, leaving_rank=-1, store_rank=0, world_size=4)
    assert h.sent == [(b"worker:0@0", regroup), (b"worker:1@0", regroup)]
    h.sent.clear()
    asyncio.run(h.driver.store_ready(0, RegroupReady(gen=1, step=9, store_port=4100)))
    peers = [peer for peer, _ in h.sent]
    assert peers == [b"worker:0@0", b"worker:1@0", JOIN_PREFIX + b"2", JOIN_PREFIX + b"3"]
    assert all(isinstance(msg, RegroupGo) and msg.master_port == 4100 for _, msg in h.sent)
    h.driver.attached(2)
    assert h.resizes == 0
    h.driver.attached(3)
    assert h.resizes == 1  # the Controller's batch plan for the old group is void
    phases = [(e.data["phase"], e.data.get("workers")) for e in h.sink.events]
    assert phases == [("prewarm", 4), ("begin", None), ("store", None), ("done", 4)]


def test_the_driver_stops_the_removed_ranks_once_the_survivors_store_is_up():
    h = Harness(2)
    h.state.scale_workers(4, 1.0, reason="more", regroup=True)
    for spawn in spawns(h.state.tick(1.2)):
        h.state.spawned("spare", spawn.proc_id, spawn.attempt, 300 + spawn.rank, 1.3)
    h.coord = attached_coordinator(4)
    h.driver.coordinator = h.coord
    h.state.scale_workers(2, 2.0, reason="fewer", regroup=True)
    asyncio.run(h.driver.resize(2, joining=[], reason="fewer"))
    regroup = Regroup(gen=1, leaving_rank=-1, store_rank=0, world_size=2)
    assert [msg for _, msg in h.sent] == [regroup] * 4  # every worker, the removed ones too
    assert not [c for c in h.applied if isinstance(getattr(c, "message", None), Kill)]
    h.sent.clear()
    asyncio.run(h.driver.store_ready(0, RegroupReady(gen=1, step=40, store_port=4200)))
    assert [peer for peer, _ in h.sent] == [b"worker:0@0", b"worker:1@0"]
    killed = [c.message.proc_id for c in h.applied if isinstance(getattr(c, "message", None), Kill)]
    assert sorted(killed) == ["worker-2", "worker-3"]
    assert h.coord.world_size == 2 and h.coord.pending is None


# ------------------------------------------------------------------- the SDK


class Source:
    """Leases of one data set, one after another; records acks and give-backs."""

    def __init__(self, leases: list[Lease]) -> None:
        self.leases = leases
        self.acked: list[int] = []
        self.given_back = 0

    def next_lease(self):
        return self.leases.pop(0) if self.leases else None

    def poll_lease(self, timeout):
        return self.next_lease()

    def ack(self, lease_ids, step):
        self.acked += lease_ids

    def give_back_queued(self, step):
        self.given_back += 1


def test_a_leaving_stream_is_drained_only_once_its_last_shard_is_acked():
    spec = DatasetSpec(dataset_size=40, shard_size=10, epochs=1, global_batch=0)
    lease = [Lease(lease_id=i, epoch=0, shard=i, start=0, end=10) for i in range(3)]
    source = Source(list(lease))
    stream = BatchStream(source, spec, batch_size=6)  # type: ignore[arg-type]
    assert stream.next_batch() is not None  # 6 of lease 0
    stream.step()
    stream.leave()
    stream.leave()  # twice is once
    assert source.given_back == 1 and stream.leaving and not stream.drained
    assert len(stream.next_batch() or []) == 4  # the rest of lease 0, not lease 1
    assert not stream.drained  # trained, but not acked: a step must cover it
    stream.step()
    assert source.acked == [0] and stream.drained
    assert stream.next_batch(first_wait=0.05) is None  # nothing more for this worker
    assert source.leases == lease[1:]  # never opened


# ---------------------------------------------------------- a resumed supervisor


def test_the_history_keeps_a_resize_open_until_it_is_done():
    from dtlaunch.supervisor.history import History, _regroup

    history = History()
    _regroup(history, {"phase": "prewarm", "gen": 3, "workers": 4, "was": 2,
                       "joining": [2, 3], "leaving": []})  # fmt: skip
    resize = history.open_resize
    assert resize is not None and (resize.gen, resize.workers, resize.was) == (3, 4, 2)
    assert not resize.announced and resize.store is None
    _regroup(history, {"phase": "begin", "gen": 3, "rank": 2})
    _regroup(history, {"phase": "store", "gen": 3, "store": "10.0.0.1:4100"})
    assert resize.announced and resize.store == ("10.0.0.1", 4100)
    _regroup(history, {"phase": "done", "gen": 2})  # another generation's
    assert history.open_resize is resize
    _regroup(history, {"phase": "done", "gen": 3, "workers": 4})
    assert history.open_resize is None and history.regroup_gen == 3
    # A KILL_RESTART's regroup is never a resize.
    _regroup(history, {"phase": "begin", "gen": 4, "rank": 1, "store_rank": 0})
    assert history.open_resize is None and history.regroup_gen == 4


def test_a_resumed_coordinator_carries_the_resize_on_with_its_generation():
    coord = RegroupCoordinator(world_size=2, timeout_s=10.0, gen=5)
    coord.restore_resize(gen=5, count=4, joining=[2, 3], announced=False, store=None, now=0.0)
    assert coord.greeted(0) is None  # not announced: the newcomers must be warm first
    assert coord.announce(2, 1.0) is None
    msg = coord.announce(3, 1.0)
    assert msg == Regroup(gen=5, leaving_rank=-1, store_rank=0, world_size=4)
    assert coord.greeted(1) == msg  # a worker that says hello hears it (again)
    assert coord.greeted(2) is None  # a newcomer is not in the group yet
    coord.ready(0, RegroupReady(gen=5, step=3, store_port=4300), "h0")
    coord.attached(2)
    assert coord.attached(3) is not None and coord.world_size == 4
    assert coord.begin_resize(2, joining=[], reason="fewer", now=2.0) is not None
    assert coord.gen == 6  # never a generation a worker has heard of


def test_a_resume_after_the_store_was_up_lets_a_warm_newcomer_join_at_once():
    coord = RegroupCoordinator(world_size=2, timeout_s=10.0, gen=1)
    coord.restore_resize(gen=1, count=3, joining=[2], announced=True, store=("h0", 4400), now=0.0)
    h = Harness(2)
    h.coord = h.driver.coordinator = coord
    asyncio.run(h.driver.joiner_hello(2))
    assert h.sent == [
        (JOIN_PREFIX + b"2", RegroupGo(gen=1, master_addr="h0", master_port=4400, source_rank=0))
    ]
    assert coord.attached(2) is not None and coord.world_size == 3


def test_a_waiting_newcomer_a_resumed_supervisor_does_not_know_is_asked_for_hello():
    from dtlaunch.wire.messages import Hello, Ping, Rehello, Welcome

    h = Harness(2)
    welcome = Welcome(run_id="r1", heartbeat_interval=1.0)
    h.driver = RegroupDriver(
        h.coord,
        state=h.state,
        recorder=EventRecorder([h.sink]),
        send=h.driver._send,
        apply=h.applied.extend,
        clock=lambda: 5.0,
        worker_peer=lambda rank: b"worker:%d@0" % rank,
        welcome=welcome,
    )
    peer = JOIN_PREFIX + b"2"
    asyncio.run(h.driver.from_joiner(peer, Ping(seq=1)))
    assert h.sent == [(peer, Rehello())]
    hello = Hello(role="worker", run_id="other", host="h", pid=1, version="x", rank=2)
    asyncio.run(h.driver.from_joiner(peer, hello))
    assert len(h.sent) == 1  # another run's hello is ignored
    asyncio.run(h.driver.from_joiner(peer, dataclasses.replace(hello, run_id="r1")))
    asyncio.run(h.driver.from_joiner(peer, Ping(seq=2)))
    assert h.sent[1:] == [(peer, welcome)]  # welcomed, and its pings are fine now


def test_a_resize_voids_the_controllers_batch_plan():
    from dtlaunch.supervisor.control.controller import Controller
    from dtlaunch.supervisor.control.policies import parse_policy

    controller = Controller(parse_policy("dd"), interval=1.0, spare_hosts=[])
    controller.batch_plan.update({0: 12, 1: 8, 2: 10})
    controller.accumulation_plan.update({0: 2})
    controller.group_resized()
    assert controller.batch_plan == {} and controller.accumulation_plan == {}


def test_a_resumed_shrink_keeps_the_ranks_still_finishing_their_shard_as_leaving():
    """Killed during a shrink before the store was up: the removed ranks still
    read their shard. The resumed supervisor takes them as leaving (their data
    stays theirs, their messages count), not as released."""
    from dtlaunch.supervisor.history import History, OpenResize
    from dtlaunch.supervisor.job import _still_leaving
    from dtlaunch.supervisor.jobstate.machine import WorkerGone

    history = History(
        hosts={"worker-2": "spare", "worker-3": "spare"},
        attempts={"worker-2": 0, "worker-3": 1},
        open_resize=OpenResize(gen=4, workers=2, was=4, joining=[], leaving=[2, 3]),
    )
    leaving = _still_leaving(history)
    assert leaving == {2: ("spare", 0), 3: ("spare", 1)}
    state = _state()
    out = state.resume(10.0, attempts={}, restarts=[], failures=[], adopt=set(), leaving=leaving)
    assert not [c for c in out if isinstance(c, WorkerGone)]
    assert state.removing == {"worker-2": ("spare", 0), "worker-3": ("spare", 1)}
    # Once the store was up the removed ranks were being stopped: released.
    history.open_resize = OpenResize(
        gen=4, workers=2, was=4, joining=[], leaving=[2, 3], store=("h0", 4500)
    )
    assert _still_leaving(history) == {}
