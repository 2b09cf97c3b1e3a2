"""Several workers replaced at once (AntDT-ND's slow host: every one of its
workers moved to spare slots together), in one regroup rather than one per
worker. Unit level with a fake clock: the coordinator's bookkeeping, the
driver's messages and the node table's prewarmed replacements. The live job is
``tests/elastic_run.py``'s slow two-worker host."""

from __future__ import annotations

import asyncio

from dtlaunch.events import EventRecorder, MemorySink
from dtlaunch.hostfile import HostSpec
from dtlaunch.supervisor.control.actions import KillRestart
from dtlaunch.supervisor.jobstate.machine import JobState
from dtlaunch.supervisor.regroup.driver import JOIN_PREFIX, RegroupDriver
from dtlaunch.wire.messages import Kill, Regroup, RegroupGo, RegroupReady
from tests.test_group_resize import _state as resize_state
from tests.test_group_resize import attached_coordinator, spawns


def test_the_regroup_message_names_every_rank_that_leaves():
    many = Regroup(gen=3, leaving_rank=0, store_rank=2, replaced=[0, 1])
    assert [r for r in range(4) if many.leaves(r)] == [0, 1]
    one = Regroup(gen=3, leaving_rank=1, store_rank=0)
    assert [r for r in range(4) if one.leaves(r)] == [1]
    shrink = Regroup(gen=3, leaving_rank=-1, store_rank=0, world_size=2)
    assert [r for r in range(4) if shrink.leaves(r)] == [2, 3]


def test_the_coordinator_announces_once_every_replacement_is_warm_and_ends_when_all_joined():
    coord = attached_coordinator(4)
    assert not coord.can_replace([0, 1, 2, 3])  # nobody would be left to hand the state over
    assert coord.can_replace([0, 1])
    coord.begin_replacing([0, 1], reason="slow host", now=1.0, batch_sizes={0: 6, 1: 10})
    pending = coord.pending
    assert pending is not None and pending.store_rank == 2 and pending.replacing == {0, 1}
    assert not coord.can_regroup(3)  # one regroup at a time
    assert coord.announce(0, 2.0) is None  # rank 1's replacement still imports torch
    regroup = coord.announce(1, 3.0)
    assert regroup == Regroup(gen=1, leaving_rank=0, store_rank=2, replaced=[0, 1])
    assert coord.survivors() == [2, 3]
    assert coord.ready(2, RegroupReady(gen=1, step=40, store_port=4300), "h1-addr") is not None
    go = coord.join_go(1)
    assert go == RegroupGo(gen=1, master_addr="h1-addr", master_port=4300, source_rank=2,
                           batch_size=10)  # fmt: skip
    assert coord.join_go(3) is None  # a survivor is told by the supervisor, not as a joiner
    assert coord.attached(0) is None  # one of two joined
    done = coord.attached(1)
    assert done is not None and done.replaced == {0, 1}
    assert coord.pending is None and coord.world_size == 4


def test_a_regroup_of_several_that_never_gets_its_store_restarts_each_of_them():
    coord = attached_coordinator(3)
    coord.begin_replacing([0, 1], reason="slow host", now=0.0, batch_sizes={})
    expired = coord.expired(11.0)
    assert expired is not None and expired.replacing == {0, 1}


def _state(spare_slots: int) -> JobState:
    """Workers 0 and 1 on h0, worker 2 on h1, and a spare host."""
    hosts = [
        HostSpec(label="h0", hostname="127.0.0.1", slots=2),
        HostSpec(label="h1", hostname="127.0.0.2", slots=1),
    ]
    return resize_state(spare_slots, hosts=hosts, workers=3)


class Harness:
    def __init__(self, spare_slots: int) -> None:
        self.state = _state(spare_slots)
        self.coord = attached_coordinator(3)
        self.sent: list[tuple[bytes, object]] = []
        self.applied: list[object] = []
        self.sink = MemorySink()
        self.measured: list[int] = []

        async def send(peer: bytes, msg: object) -> None:
            self.sent.append((peer, msg))

        self.driver = RegroupDriver(
            self.coord,
            state=self.state,
            recorder=EventRecorder([self.sink]),
            send=send,
            apply=self.applied.extend,
            clock=lambda: 5.0,
            worker_peer=lambda rank: b"worker:%d" % rank,
            measured=lambda rank, seconds: self.measured.append(rank),
            planned_batch=lambda rank: {0: 6, 1: 10}.get(rank, 0),
        )

    def kill(self, *ranks: int) -> None:
        actions = [KillRestart(role="worker", rank=r, target_host="spare", reason="slow host h0")
                   for r in ranks]  # fmt: skip
        asyncio.run(self.driver.kill_restart_many(actions, 1.0))


def test_a_slow_host_s_two_workers_move_to_the_spare_in_one_regroup():
    h = Harness(spare_slots=2)
    h.kill(0, 1)
    started = spawns(h.applied)
    assert sorted(s.proc_id for s in started) == ["worker-0", "worker-1"]
    assert all(s.argv[1:] == ["-m", "dtlaunch.runtime.prewarm"] for s in started)
    assert {h.state.procs[s.proc_id].host for s in started} == {"spare"}
    assert h.sent == []  # the replacements import torch first
    asyncio.run(h.driver.joiner_hello(0))
    assert h.sent == []
    asyncio.run(h.driver.joiner_hello(1))
    regroup = Regroup(gen=1, leaving_rank=0, store_rank=2, replaced=[0, 1])
    assert h.sent == [(b"worker:%d" % r, regroup) for r in range(3)]
    h.sent.clear()
    h.applied.clear()
    asyncio.run(h.driver.store_ready(2, RegroupReady(gen=1, step=40, store_port=4300)))
    assert [peer for peer, _ in h.sent] == [b"worker:2"]  # the one survivor
    killed = sorted(c.message.proc_id for c in h.applied if isinstance(c.message, Kill))
    assert killed == ["worker-0", "worker-1"]  # both old processes, at once
    h.sent.clear()
    for rank in (0, 1):
        asyncio.run(h.driver.worker_gone(rank))
    gos = {peer: msg for peer, msg in h.sent}
    assert set(gos) == {JOIN_PREFIX + b"0", JOIN_PREFIX + b"1"}
    assert [gos[JOIN_PREFIX + b"%d" % r].batch_size for r in (0, 1)] == [6, 10]
    h.driver.attached(0)
    h.driver.attached(1)
    assert h.coord.pending is None and h.measured == [0, 1]
    phases = [(e.data["phase"], e.data.get("ranks")) for e in h.sink.events]
    assert phases == [("prewarm", [0, 1]), ("begin", [0, 1]), ("store", None), ("done", [0, 1])]


def test_with_one_free_spare_slot_one_worker_moves_and_the_other_waits():
    h = Harness(spare_slots=1)
    h.kill(0, 1)
    assert [s.proc_id for s in spawns(h.applied)] == ["worker-0"]
    pending = h.coord.pending
    assert pending is not None and pending.replacing == {0} and not pending.replaced
    asyncio.run(h.driver.joiner_hello(0))
    assert [msg for _, msg in h.sent] == [Regroup(gen=1, leaving_rank=0, store_rank=1)] * 3
