"""The shard queue (Stateful DDS) driven by hand on small data sets."""

from __future__ import annotations

import random
import time

import msgpack
import pytest

from dtlaunch.errors import ConfigError, DtlaunchError
from dtlaunch.sharding import DatasetSpec, epoch_order
from dtlaunch.supervisor.dds.queue import (
    DdsStateError,
    Done,
    Grant,
    Release,
    ShardQueue,
    decode_transition,
    encode_transition,
)
from dtlaunch.wire.messages import Lease

# K = 4 shards (lengths 3, 3, 3, 1), two epochs.
SPEC = DatasetSpec(dataset_size=10, shard_size=3, epochs=2, seed=7)
ORDER0 = epoch_order(SPEC, 0)
ORDER1 = epoch_order(SPEC, 1)


def shards(transitions):
    return [(t.epoch, t.shard) for t in transitions]


def ids(transitions):
    return [t.lease_id for t in transitions]


def replay(spec, log, base=None):
    queue = ShardQueue(spec) if base is None else ShardQueue.restore(spec, base)
    for record in log:
        queue.apply(decode_transition(record))
    return queue


class Recorder:
    """A queue whose every transition is kept encoded, as the WAL would."""

    def __init__(self, spec):
        self.queue = ShardQueue(spec)
        self.log: list[bytes] = []

    def keep(self, transitions):
        self.log += [encode_transition(t) for t in transitions]
        return transitions


def test_orders_differ_so_the_tests_below_mean_something():
    assert sorted(ORDER0) == sorted(ORDER1) == [0, 1, 2, 3]
    assert ORDER0 != ORDER1


def test_grants_follow_epoch_order_then_next_epoch_with_whole_shards():
    q = ShardQueue(SPEC)
    grants = [g for _ in range(8) for g in q.fetch(0)]
    assert shards(grants) == [(0, s) for s in ORDER0] + [(1, s) for s in ORDER1]
    assert ids(grants) == list(range(8))
    assert all(isinstance(g, Grant) and g.worker == 0 and g.start == 0 for g in grants)
    assert [g.end for g in grants] == [SPEC.shard_length(g.shard) for g in grants]
    assert {g.end for g in grants} == {3, 1}  # the last shard is shorter
    assert grants[0].lease() == Lease(lease_id=0, epoch=0, shard=ORDER0[0], start=0, end=3)
    assert q.fetch(0) == []
    assert not q.can_grant and not q.finished


def test_next_epoch_starts_while_a_straggler_holds_the_previous_one():
    q = ShardQueue(SPEC)
    straggler = q.fetch(9)
    fast = q.fetch(1, 3)
    assert shards(fast) == [(0, s) for s in ORDER0[1:]]
    q.ack(1, ids(fast))
    assert q.queued() == [] and q.epochs_started == 1
    assert shards(q.fetch(1)) == [(1, ORDER1[0])]
    assert q.epochs_started == 2
    assert q.queued() == [(1, s) for s in ORDER1[1:]]
    assert q.lease(straggler[0].lease_id) is not None  # still DOING in epoch 0
    assert q.epoch_progress == [(3, 4), (0, 4)]


def test_a_released_shard_goes_to_the_end_of_todo():
    q = ShardQueue(SPEC)
    first, second = q.fetch(0, 2)
    assert shards(q.release_leases([first.lease_id])) == [(0, ORDER0[0])]
    assert q.queued() == [(0, ORDER0[2]), (0, ORDER0[3]), (0, ORDER0[0])]
    regrants = q.fetch(1, 4)
    # the release is read again before the next epoch starts, and under a new lease
    assert shards(regrants) == [(0, ORDER0[2]), (0, ORDER0[3]), (0, ORDER0[0]), (1, ORDER1[0])]
    assert regrants[2].lease_id == 4 and regrants[2].lease_id != first.lease_id
    assert q.lease(first.lease_id) is None
    assert q.holder(second.lease_id) == 0


def test_a_release_while_todo_is_empty_is_served_before_the_next_epoch():
    q = ShardQueue(SPEC)
    held = q.fetch(0, 4)
    assert q.queued() == []
    q.release_leases([held[1].lease_id])
    assert q.queued() == [(0, ORDER0[1])]
    assert shards(q.fetch(2, 2)) == [(0, ORDER0[1]), (1, ORDER1[0])]


def test_a_release_after_the_next_epoch_started_queues_behind_it():
    q = ShardQueue(SPEC)
    held = q.fetch(0, 5)  # epoch 0 whole + first of epoch 1
    q.release_leases([held[0].lease_id])
    assert q.queued() == [(1, s) for s in ORDER1[1:]] + [(0, ORDER0[0])]


def test_fetch_counts():
    q = ShardQueue(SPEC)
    assert q.fetch(0, 0) == []
    assert len(q.fetch(0, 3)) == 3
    assert len(q.fetch(1, 100)) == 5  # fewer than asked: only 5 remain
    assert q.fetched_by_worker == {0: 3, 1: 5}
    assert q.fetch(2, 1) == []
    with pytest.raises(ValueError, match="fetch count must be 0 or more"):
        q.fetch(0, -1)
    with pytest.raises(ValueError, match="worker rank must be 0 or more"):
        q.fetch(-1)


def test_ack_refuses_other_workers_unknown_done_released_and_repeated_leases():
    q = ShardQueue(SPEC)
    a, b, c = q.fetch(0, 3)
    (d,) = q.fetch(1)
    q.release_leases([c.lease_id])
    done, refused = q.ack(0, [a.lease_id, d.lease_id, 99, c.lease_id, a.lease_id, b.lease_id])
    assert [(t.lease_id, type(t)) for t in done] == [(a.lease_id, Done), (b.lease_id, Done)]
    assert done[0] == Done(lease_id=a.lease_id, worker=0, epoch=0, shard=a.shard)
    assert refused == [d.lease_id, 99, c.lease_id, a.lease_id]
    assert q.holder(d.lease_id) == 1  # another worker's ack does not touch it
    assert "held by worker 1" in q.refusal_reason(0, d.lease_id)
    assert "never granted" in q.refusal_reason(0, 99)
    assert "released" in q.refusal_reason(0, c.lease_id)
    assert f"shard {a.shard}) is DONE already, by 0" in q.refusal_reason(0, a.lease_id)
    assert "accepted" in q.refusal_reason(1, d.lease_id)
    assert q.ack(0, [a.lease_id]) == ([], [a.lease_id])
    assert q.done_count == 2 and q.doing_count == 1


def test_release_worker_returns_only_its_leases_oldest_first():
    q = ShardQueue(SPEC)
    mine = q.fetch(0, 2)
    theirs = q.fetch(1)
    more = q.fetch(0)
    q.ack(0, [mine[1].lease_id])
    released = q.release_worker(0)
    assert all(isinstance(t, Release) and t.worker == 0 for t in released)
    assert ids(released) == [mine[0].lease_id, more[0].lease_id]
    assert q.leases_of(0) == []
    assert q.leases_of(1) == [theirs[0].lease()]
    assert q.queued()[-2:] == shards(released)
    assert q.release_worker(0) == []
    assert q.release_worker(5) == []


def test_release_leases_skips_what_is_not_doing():
    q = ShardQueue(SPEC)
    a, b = q.fetch(0, 2)
    q.ack(0, [a.lease_id])
    assert ids(q.release_leases([a.lease_id, 42, b.lease_id, b.lease_id])) == [b.lease_id]


def test_reclaim_keeps_held_doing_leases_and_releases_the_others():
    q = ShardQueue(SPEC)
    a, b, c = q.fetch(0, 3)
    (other,) = q.fetch(1)
    q.ack(0, [c.lease_id])
    # worker 0 reconnects and claims a, c (DONE), another's lease and an unknown id
    released = q.reclaim(0, [a.lease_id, c.lease_id, other.lease_id, 77])
    assert ids(released) == [b.lease_id]
    assert q.leases_of(0) == [a.lease()]
    assert q.leases_of(1) == [other.lease()]
    assert q.reclaim(1, [other.lease_id]) == []
    assert ids(q.reclaim(1, [])) == [other.lease_id]


def test_finished_after_every_shard_of_every_epoch_is_done():
    q = ShardQueue(SPEC)
    assert (q.total, q.todo_count, q.queued_count) == (8, 8, 0)
    for worker in range(8):
        grants = q.fetch(worker % 2)
        assert not q.finished
        q.ack(worker % 2, ids(grants))
    assert q.finished and q.done_count == 8 and q.todo_count == 0
    assert q.epoch_progress == [(4, 4), (4, 4)]
    assert q.fetch(0) == [] and not q.can_grant


def run_randomly(q, rng, workers, log=None, steps=None, release_p=0.15):
    """Fetch, ack, kill and drop at random until finished (or ``steps`` ran out)."""
    keep = log.keep if log else (lambda ts: ts)
    step = 0
    while not q.finished and (steps is None or step < steps):
        step += 1
        worker = rng.randrange(workers)
        keep(q.fetch(worker, rng.randrange(1, 4)))
        held = [lease.lease_id for lease in q.leases_of(worker)]
        roll = rng.random()
        if roll < release_p / 2:
            keep(q.release_worker(worker))
        elif roll < release_p:
            keep(q.release_leases(rng.sample(held, k=len(held) // 2)))
        else:
            done, refused = q.ack(worker, rng.sample(held, k=rng.randrange(len(held) + 1)))
            assert refused == []
            keep(done)


def test_ledger_holds_every_shard_of_every_epoch_exactly_once():
    spec = DatasetSpec(dataset_size=50, shard_size=4, epochs=3, seed=1)
    rec = Recorder(spec)
    run_randomly(rec.queue, random.Random(3), workers=4, log=rec)
    ledger = list(rec.queue.done_ledger)
    assert sorted((e, s) for e, s, _, _ in ledger) == [
        (e, s) for e in range(3) for s in range(spec.num_shards)
    ]
    lease_ids = [lease for _, _, lease, _ in ledger]
    assert len(set(lease_ids)) == len(lease_ids)
    transitions = [decode_transition(r) for r in rec.log]
    dones = {(t.epoch, t.shard, t.lease_id, t.worker) for t in transitions if isinstance(t, Done)}
    assert dones == set(ledger)
    grants = [t for t in transitions if isinstance(t, Grant)]
    assert len(grants) > spec.total_shards  # releases did happen and were re-granted
    assert [t.lease_id for t in grants] == list(range(len(grants)))  # increasing, never reused
    assert sum(rec.queue.fetched_by_worker.values()) == len(grants)


def test_replaying_the_log_or_a_snapshot_plus_the_rest_gives_the_live_state():
    spec = DatasetSpec(dataset_size=40, shard_size=3, epochs=2, seed=5)
    rec = Recorder(spec)
    rng = random.Random(11)
    cuts = []
    while not rec.queue.finished:
        run_randomly(rec.queue, rng, workers=3, log=rec, steps=3)
        cuts.append((len(rec.log), rec.queue.snapshot()))
        assert replay(spec, rec.log) == rec.queue
    for cut, snap in cuts:
        recovered = replay(spec, rec.log[cut:], base=snap)
        assert recovered == rec.queue
        assert recovered.state_digest() == rec.queue.state_digest()
    assert replay(spec, rec.log[:-1]) != rec.queue


def test_a_recovered_queue_never_reuses_lease_ids():
    rec = Recorder(SPEC)
    rec.keep(rec.queue.fetch(0, 3))
    rec.keep(rec.queue.release_worker(0))
    recovered = ShardQueue.restore(SPEC, rec.queue.snapshot())
    assert recovered.next_lease_id == 3
    assert ids(recovered.fetch(1, 2)) == [3, 4]
    assert shards(recovered.leases_of(1)) == [(0, ORDER0[3]), (0, ORDER0[0])]


def test_snapshot_restore_keeps_every_view():
    q = ShardQueue(SPEC)
    run_randomly(q, random.Random(2), workers=3, steps=4)
    q.fetch(2, 2)
    r = ShardQueue.restore(SPEC, q.snapshot())
    assert r == q
    assert r.queued() == q.queued()
    assert list(r.done_ledger) == list(q.done_ledger)
    assert [r.leases_of(w) for w in range(3)] == [q.leases_of(w) for w in range(3)]
    assert (r.fetched_by_worker, r.epoch_progress) == (q.fetched_by_worker, q.epoch_progress)
    assert r.fetch(0, 8) == q.fetch(0, 8)
    assert r == q


def test_restore_refuses_another_data_set_and_corrupt_snapshots():
    q = ShardQueue(SPEC)
    q.fetch(0, 2)
    snap = q.snapshot()
    other = DatasetSpec(dataset_size=10, shard_size=3, epochs=2, seed=8)
    with pytest.raises(DdsStateError, match="another data set"):
        ShardQueue.restore(other, snap)
    for bad in (b"", b"garbage", snap[:-5], snap[:5] + b"\x00" * 20):
        with pytest.raises(DdsStateError, match="snapshot"):
            ShardQueue.restore(SPEC, bad)
    assert issubclass(DdsStateError, DtlaunchError)


def test_restore_refuses_a_snapshot_whose_parts_contradict():
    import zlib

    q = ShardQueue(SPEC)
    q.fetch(0, 2)
    snap = q.snapshot()
    body = msgpack.unpackb(zlib.decompress(snap[5:]))
    body["pos"] = 1  # the second fresh shard would be both DOING and queued
    forged = snap[:5] + zlib.compress(msgpack.packb(body))
    with pytest.raises(DdsStateError, match="is in 2 states instead of one"):
        ShardQueue.restore(SPEC, forged)
    body["pos"], body["next"] = 2, 1  # lease 1 would be ahead of the counter
    forged = snap[:5] + zlib.compress(msgpack.packb(body))
    with pytest.raises(DdsStateError, match="lease ids repeat or run ahead"):
        ShardQueue.restore(SPEC, forged)


def test_apply_refuses_a_grant_the_queue_would_not_make():
    q = ShardQueue(SPEC)
    head = dict(lease_id=0, worker=0, epoch=0, shard=ORDER0[0], start=0, end=3)
    for wrong in (
        {"shard": ORDER0[1]},
        {"epoch": 1},
        {"lease_id": 1},
        {"end": 2},
        {"start": 1},
    ):
        with pytest.raises(DdsStateError, match=r"another data set .* or is corrupt"):
            q.apply(Grant(**{**head, **wrong}))
    assert q == ShardQueue(SPEC)  # a refused record changes nothing
    q.apply(Grant(**head))
    assert q.leases_of(0) == [Lease(lease_id=0, epoch=0, shard=ORDER0[0], start=0, end=3)]


def test_apply_refuses_done_or_release_of_a_lease_that_is_not_doing_so():
    q = ShardQueue(SPEC)
    (g,) = q.fetch(0)
    for t in (
        Done(lease_id=g.lease_id, worker=1, epoch=0, shard=g.shard),
        Release(lease_id=g.lease_id, worker=0, epoch=1, shard=g.shard),
        Done(lease_id=5, worker=0, epoch=0, shard=g.shard),
    ):
        with pytest.raises(DdsStateError, match="log disagrees"):
            q.apply(t)
    q.apply(Done(lease_id=g.lease_id, worker=0, epoch=0, shard=g.shard))
    with pytest.raises(DdsStateError, match="not DOING"):
        q.apply(Release(lease_id=g.lease_id, worker=0, epoch=0, shard=g.shard))


def test_apply_refuses_a_grant_beyond_the_end():
    q = ShardQueue(DatasetSpec(dataset_size=1, shard_size=1))
    q.fetch(0)
    with pytest.raises(DdsStateError, match="has nothing to grant"):
        q.apply(Grant(lease_id=1, worker=0, epoch=0, shard=0, start=0, end=1))


def test_a_log_of_another_seed_is_refused_on_replay():
    rec = Recorder(SPEC)
    rec.keep(rec.queue.fetch(0, 4))
    other = DatasetSpec(dataset_size=10, shard_size=3, epochs=2, seed=8)
    assert epoch_order(other, 0)[0] != ORDER0[0]
    with pytest.raises(DdsStateError, match="would grant lease 0 of epoch 0 shard"):
        replay(other, rec.log)


def test_transitions_round_trip_compactly():
    big = Grant(lease_id=2**31, worker=9999, epoch=99, shard=1_000_000, start=0, end=100_000)
    cases = [
        big,
        Grant(lease_id=0, worker=0, epoch=0, shard=0, start=0, end=1),
        Done(lease_id=12345, worker=3, epoch=1, shard=7),
        Release(lease_id=7, worker=1, epoch=0, shard=2),
    ]
    for t in cases:
        data = encode_transition(t)
        assert decode_transition(data) == t
        assert type(decode_transition(data)) is type(t)
    assert len(encode_transition(big)) < 40
    assert len(encode_transition(cases[1])) < 10


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb({"a": 1}), "unknown shape"),
        (msgpack.packb([]), "unknown shape"),
        (msgpack.packb([9, 0, 0, 0, 0]), "unknown tag 9"),
        (msgpack.packb([1, 0, 0, 0, 0]), "Grant record needs 6"),
        (msgpack.packb([2, 0, 0, 0, 0, 0, 1]), "Done record needs 4"),
        (msgpack.packb([2, 0, -1, 0, 0]), "non-negative integers"),
        (msgpack.packb([3, 0, True, 0, 0]), "non-negative integers"),
        (msgpack.packb([3, 0, "0", 0, 0]), "non-negative integers"),
        (msgpack.packb([3, 0, 0, 0, 0]) + b"\x00", "not valid msgpack"),
    ],
)
def test_decode_refuses_bad_records(data, problem):
    with pytest.raises(DdsStateError, match=problem):
        decode_transition(data)


def test_a_bad_spec_is_refused():
    with pytest.raises(ConfigError, match="--shard-size"):
        ShardQueue(DatasetSpec(dataset_size=10, shard_size=0))


def test_large_job_snapshot_is_small_and_quick():
    """K = 100 000 shards x 3 epochs: 300k shards, nearly all DONE, by 64 workers
    (benchmarks/dds.py measures 1M and more; here the fetch/ack loop that builds
    the state is what costs)."""
    spec = DatasetSpec(dataset_size=1_000_000, shard_size=10, epochs=3, seed=3)
    assert spec.total_shards == 300_000
    q = ShardQueue(spec)
    rng = random.Random(0)
    while not q.finished:
        worker = rng.randrange(64)
        grants = q.fetch(worker, 50)
        if rng.random() < 0.01:
            q.release_leases(ids(grants[:5]))
        q.ack(worker, ids(grants))
        if q.done_count >= 297_000 and q.doing_count == 0:
            break  # leave some shards DOING and TODO: a snapshot mid-run
    for worker in range(64):
        q.fetch(worker, 10)
    assert q.doing_count > 0 and q.queued_count > 0
    began = time.perf_counter()
    snap = q.snapshot()
    took = time.perf_counter() - began
    assert len(snap) < 300_000, len(snap)  # < 1 byte per shard
    assert took < 2.0
    began = time.perf_counter()
    restored = ShardQueue.restore(spec, snap)
    assert time.perf_counter() - began < 3.0
    assert restored == q
    assert restored.queued() == q.queued()


def open_service(tmp_path, sent: list, sink=None, note=lambda: None):
    """A DdsService of 100 shards over ``tmp_path``, its replies appended to
    ``sent`` as (peer, message, note())."""
    from dtlaunch.events import EventRecorder, MemorySink
    from dtlaunch.supervisor.dds.service import DdsService

    async def send(peer, msg):
        sent.append((peer, msg, note()))

    service = DdsService(
        run_dir=tmp_path,
        options=DatasetSpec(dataset_size=1000, shard_size=10),
        send=send,
        recorder=EventRecorder([sink or MemorySink()]),
    )
    service.open()
    return service


def test_a_fetch_is_bounded_by_what_one_worker_may_hold(tmp_path):
    """Issue 12, defect 4: FetchShards(count=2**62) leased every remaining shard
    to one peer, and the others waited for them forever."""
    import asyncio

    from dtlaunch.supervisor.dds.service import MAX_HELD_LEASES
    from dtlaunch.wire.messages import FetchShards

    async def scenario() -> list:
        sent: list = []
        service = open_service(tmp_path, sent)
        try:
            await service.handle(b"worker:0", 0, FetchShards(request_id=1, count=2**62))
            await service.handle(b"worker:0", 0, FetchShards(request_id=2, count=3))
            await service.handle(b"worker:1", 1, FetchShards(request_id=3, count=2))
        finally:
            await service.close()
        return [msg for _, msg, _ in sent]

    greedy, more, other = asyncio.run(scenario())
    assert len(greedy.leases) == MAX_HELD_LEASES < 100
    assert more.leases == [] and more.retry_after > 0  # holds its share already
    assert len(other.leases) == 2  # the others still get shards


def test_snapshots_are_spaced_by_their_own_cost(tmp_path, monkeypatch):
    """Scale benchmark finding: a data set of millions of shards snapshots to a
    few compressed bytes, so the size rule asked for a snapshot every 16 KiB of
    log, and each one (a pass over every shard, on the event loop) took longer
    than the traffic between them: 10 workers got 743 fetch+ack ops/s and the
    agents' heartbeats went unanswered. A snapshot that cost C seconds is now
    followed by the next only C / SNAPSHOT_MAX_LOOP_SHARE seconds later."""
    import asyncio

    from dtlaunch.events import EventRecorder, MemorySink
    from dtlaunch.sharding import DatasetSpec
    from dtlaunch.supervisor.dds import service as service_module
    from dtlaunch.supervisor.dds.queue import ShardQueue
    from dtlaunch.wire.messages import AckShards, FetchShards

    now = [100.0]
    snapshot = ShardQueue.snapshot

    def costly_snapshot(queue: ShardQueue) -> bytes:
        now[0] += 0.1  # this snapshot holds the loop for 0.1 s (fake clock)
        return snapshot(queue)

    monkeypatch.setattr(ShardQueue, "snapshot", costly_snapshot)
    spacing = 0.1 / service_module.SNAPSHOT_MAX_LOOP_SHARE

    async def scenario() -> list[int]:
        async def send(peer, msg):
            return None

        service = DdsService(
            run_dir=tmp_path,
            options=DatasetSpec(dataset_size=10**6, shard_size=10),
            send=send,
            recorder=EventRecorder([MemorySink()]),
            clock=lambda: now[0],
        )
        service.open()
        taken = []
        try:
            lease = 0
            # Enough traffic for many snapshots by size alone, at three instants.
            for advance in (0.0, spacing - 0.2, 0.2):
                now[0] += advance
                for request in range(400):
                    await service.handle(b"w", 0, FetchShards(request_id=request, count=1))
                    await service.handle(b"w", 0, AckShards(lease_ids=[lease], step=request))
                    lease += 1
                taken.append(service.snapshots)
        finally:
            await service.close()
        return taken

    from dtlaunch.supervisor.dds.service import DdsService

    first, before_spacing, after_spacing = asyncio.run(scenario())
    assert first == 1  # the first one at once, then none while the loop pays for it
    assert before_spacing == 1
    assert after_spacing == 2


def test_taken_requests_change_the_queue_at_once_and_are_answered_after_one_fsync(tmp_path):
    """The supervisor takes every fetch and ack of a received batch (queue changes
    in arrival order, records staged) and answers them in one task after one
    fsync: no reply leaves before its records are durable."""
    import asyncio

    from dtlaunch.events import MemorySink
    from dtlaunch.supervisor.wal import files as wal_files
    from dtlaunch.wire.messages import AckDone, AckShards, FetchShards, ShardGrant

    syncs: list[int] = []
    fsync = wal_files.RealFiles.fsync

    def counted_fsync(self, handle):
        syncs.append(1)
        time.sleep(0.05)  # long enough that an early reply would be seen before it ends
        fsync(self, handle)

    async def scenario() -> None:
        sent: list[tuple[bytes, object, int]] = []
        sink = MemorySink()
        service = open_service(tmp_path, sent, sink=sink, note=lambda: len(syncs))
        try:
            await service.handle(b"w0", 0, FetchShards(request_id=1, count=2))  # warm-up
            assert service.queue is not None
            held = [lease.lease_id for lease in sent[-1][1].leases]
            wal_files_before = len(syncs)
            for rank in range(1, 9):
                service.take(b"w%d" % rank, rank, FetchShards(request_id=rank, count=1))
            service.take(b"w0", 0, AckShards(lease_ids=held, step=1))
            # Queue changed at once, in arrival order; nothing sent yet.
            assert service.queue.doing_count == 8 and service.queue.done_count == 2
            assert service.has_taken and len(sent) == 1
            await service.answer_taken()
            assert not service.has_taken
            replies = sent[1:]
            assert [peer for peer, _, _ in replies] == [b"w%d" % r for r in range(1, 9)] + [b"w0"]
            assert all(isinstance(m, ShardGrant) and len(m.leases) == 1 for _, m, _ in replies[:8])
            assert isinstance(replies[-1][1], AckDone)
            # One fsync for the nine requests, and every reply after it.
            assert len(syncs) - wal_files_before == 1
            assert all(after == len(syncs) for _, _, after in replies)
            grants = [m.leases[0].lease_id for _, m, _ in replies[:8]]
            assert len(set(grants)) == 8  # in arrival order, no lease twice
            done = [e for e in sink.events if e.kind == "shards_done"]
            assert done and done[-1].data["done"] == 2
        finally:
            await service.close()

    mp = pytest.MonkeyPatch()
    mp.setattr(wal_files.RealFiles, "fsync", counted_fsync)
    try:
        asyncio.run(scenario())
    finally:
        mp.undo()


def test_a_hello_reclaims_before_a_fetch_taken_after_it(tmp_path):
    """worker_hello changes the queue when called, not when its task runs: a fetch
    the same worker sends right after (same received batch) is not released by it."""
    import asyncio

    from dtlaunch.wire.messages import FetchShards, ReleaseShards

    async def scenario() -> None:
        sent: list = []
        service = open_service(tmp_path, sent)
        try:
            await service.handle(b"w0", 0, FetchShards(request_id=1, count=3))
            assert service.queue is not None
            kept = sent[-1][1].leases[0].lease_id
            reclaim = service.worker_hello(0, attempt=1, leases=[kept])  # not yet awaited
            assert service.queue.held_count(0) == 1  # released the two others already
            service.take(b"w0", 0, FetchShards(request_id=2, count=2))
            await reclaim
            await service.answer_taken()
            assert service.queue.held_count(0) == 3  # the new grants stay its own
            # A release changes the queue when it arrives, too.
            given_back = service.release(0, ReleaseShards(lease_ids=[kept], step=3))
            assert service.queue.held_count(0) == 2
            await given_back
        finally:
            await service.close()

    asyncio.run(scenario())
