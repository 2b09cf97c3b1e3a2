"""The shard queue against a plain reference model, under random operations,
crashes (rebuild from an earlier snapshot + replay of the log since) and compactions.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from dtlaunch.sharding import DatasetSpec, epoch_order
from dtlaunch.supervisor.dds.queue import (
    Done,
    Grant,
    Release,
    ShardQueue,
    decode_transition,
    encode_transition,
)

WORKERS = range(4)
workers = st.sampled_from(list(WORKERS))


class Model:
    """The rules of the brief, written as plainly as possible."""

    def __init__(self, spec: DatasetSpec) -> None:
        self.spec = spec
        self.todo: list[tuple[int, int]] = []
        self.appended = 0
        self.doing: dict[int, tuple[int, int, int]] = {}  # lease -> (worker, epoch, shard)
        self.done: dict[tuple[int, int], tuple[int, int]] = {}  # (epoch, shard) -> (lease, worker)
        self.next_lease = 0
        self.fetched: Counter[int] = Counter()

    def fetch(self, worker, count):
        out = []
        for _ in range(count):
            if not self.todo and self.appended < self.spec.epochs:
                self.todo = [(self.appended, s) for s in epoch_order(self.spec, self.appended)]
                self.appended += 1
            if not self.todo:
                break
            epoch, shard = self.todo.pop(0)
            self.doing[self.next_lease] = (worker, epoch, shard)
            out.append((self.next_lease, worker, epoch, shard))
            self.next_lease += 1
            self.fetched[worker] += 1
        return out

    def ack(self, worker, lease_ids):
        done, refused = [], []
        for lease in lease_ids:
            if lease in self.doing and self.doing[lease][0] == worker:
                _, epoch, shard = self.doing.pop(lease)
                self.done[(epoch, shard)] = (lease, worker)
                done.append((lease, worker, epoch, shard))
            else:
                refused.append(lease)
        return done, refused

    def release(self, lease_ids):
        out = []
        for lease in lease_ids:
            if lease in self.doing:
                worker, epoch, shard = self.doing.pop(lease)
                self.todo.append((epoch, shard))
                out.append((lease, worker, epoch, shard))
        return out

    def leases_of(self, worker):
        return sorted(lease for lease, held in self.doing.items() if held[0] == worker)


def rows(transitions, kind):
    assert all(type(t) is kind for t in transitions)
    return [(t.lease_id, t.worker, t.epoch, t.shard) for t in transitions]


class ShardQueueMachine(RuleBasedStateMachine):
    @initialize(
        size=st.integers(1, 14),
        shard_size=st.integers(1, 4),
        epochs=st.integers(1, 3),
        seed=st.integers(0, 3),
    )
    def start(self, size, shard_size, epochs, seed):
        self.spec = DatasetSpec(dataset_size=size, shard_size=shard_size, epochs=epochs, seed=seed)
        self.queue = ShardQueue(self.spec)
        self.model = Model(self.spec)
        self.base: bytes | None = None  # recovery starts from this snapshot (None: empty queue)
        self.log: list[bytes] = []  # every transition since the base, as the WAL holds it
        self.checkpoints: list[tuple[int, bytes]] = []  # (log length, snapshot) since base
        self.done_before: dict[tuple[int, int], tuple[int, int]] = {}

    def keep(self, transitions):
        for t in transitions:
            record = encode_transition(t)
            assert decode_transition(record) == t
            self.log.append(record)
        return transitions

    def some_leases(self, data, worker):
        """A mix of the worker's own leases, others', finished or released ones, and unknowns."""
        known = list(range(self.model.next_lease + 2))
        own = self.model.leases_of(worker)
        pool = st.sampled_from(known + own * 3)
        return data.draw(st.lists(pool, max_size=5))

    @rule(worker=workers, count=st.integers(0, 3))
    def fetch(self, worker, count):
        grants = self.keep(self.queue.fetch(worker, count))
        assert rows(grants, Grant) == self.model.fetch(worker, count)
        for g in grants:
            assert (g.start, g.end) == (0, self.spec.shard_length(g.shard))

    @rule(worker=workers, data=st.data())
    def ack(self, worker, data):
        lease_ids = self.some_leases(data, worker)
        done, refused = self.queue.ack(worker, lease_ids)
        self.keep(done)
        want_done, want_refused = self.model.ack(worker, lease_ids)
        assert (rows(done, Done), refused) == (want_done, want_refused)

    @rule(worker=workers)
    def worker_dies(self, worker):
        released = self.keep(self.queue.release_worker(worker))
        assert rows(released, Release) == self.model.release(self.model.leases_of(worker))

    @rule(data=st.data())
    def drop_leases(self, data):
        lease_ids = self.some_leases(data, data.draw(workers))
        released = self.keep(self.queue.release_leases(lease_ids))
        assert rows(released, Release) == self.model.release(lease_ids)

    @rule(worker=workers, data=st.data())
    def reclaim(self, worker, data):
        held = self.some_leases(data, worker)
        released = self.keep(self.queue.reclaim(worker, held))
        lost = [lease for lease in self.model.leases_of(worker) if lease not in held]
        assert rows(released, Release) == self.model.release(lost)

    @rule()
    def checkpoint(self):
        self.checkpoints.append((len(self.log), self.queue.snapshot()))

    @rule()
    def compact(self):
        """A new snapshot replaces the base; the records before it are dropped."""
        self.base = self.queue.snapshot()
        self.log = []
        self.checkpoints = []

    @rule(data=st.data())
    def crash_and_recover(self, data):
        start, snapshot = data.draw(st.sampled_from([(0, self.base), *self.checkpoints]))
        if snapshot is None:
            recovered = ShardQueue(self.spec)
        else:
            recovered = ShardQueue.restore(self.spec, snapshot)
        for record in self.log[start:]:
            recovered.apply(decode_transition(record))
        assert recovered == self.queue
        assert recovered.state_digest() == self.queue.state_digest()
        self.queue = recovered  # carry on with the rebuilt queue, as a resumed supervisor does

    @precondition(lambda self: self.queue.doing_count > 0)
    @rule()
    def everyone_acks(self):
        for worker in WORKERS:
            self.ack_all(worker)

    def ack_all(self, worker):
        lease_ids = self.model.leases_of(worker)
        done, refused = self.queue.ack(worker, lease_ids)
        self.keep(done)
        assert refused == []
        assert rows(done, Done) == self.model.ack(worker, lease_ids)[0]

    # -------------------------------------------------------------- invariants

    @invariant()
    def matches_the_model(self):
        q, m = self.queue, self.model
        assert q.queued() == m.todo
        assert q.epochs_started == m.appended
        assert q.next_lease_id == m.next_lease
        assert q.fetched_by_worker == dict(m.fetched)
        for worker in WORKERS:
            assert [lease.lease_id for lease in q.leases_of(worker)] == m.leases_of(worker)
            assert q.held_count(worker) == len(m.leases_of(worker))
        for lease, (worker, epoch, shard) in m.doing.items():
            assert q.holder(lease) == worker
            assert (q.lease(lease).epoch, q.lease(lease).shard) == (epoch, shard)
        ledger = list(q.done_ledger)
        assert ledger == sorted((e, s, lease, w) for (e, s), (lease, w) in m.done.items())

    @invariant()
    def every_shard_is_in_exactly_one_state(self):
        q = self.queue
        doing = [(lease.epoch, lease.shard) for w in WORKERS for lease in q.leases_of(w)]
        done = [(e, s) for e, s, _, _ in q.done_ledger]
        queued = q.queued()
        places = doing + done + queued
        assert len(places) == len(set(places))
        started = {(e, s) for e in range(q.epochs_started) for s in range(self.spec.num_shards)}
        assert set(places) == started
        assert q.total == self.spec.num_shards * self.spec.epochs
        assert q.done_count + q.doing_count + q.todo_count == q.total
        assert q.todo_count == len(queued) + (self.spec.epochs - q.epochs_started) * (
            self.spec.num_shards
        )
        assert (q.done_count, q.doing_count) == (len(done), len(doing))
        assert [d for d, _ in q.epoch_progress] == [
            sum(1 for e, _ in done if e == epoch) for epoch in range(self.spec.epochs)
        ]
        assert q.finished == (q.done_count == q.total)

    @invariant()
    def leases_are_unique_and_done_is_never_lost(self):
        q = self.queue
        done = {(e, s): (lease, w) for e, s, lease, w in q.done_ledger}
        live = [lease.lease_id for w in WORKERS for lease in q.leases_of(w)]
        all_ids = live + [lease for lease, _ in done.values()]
        assert len(all_ids) == len(set(all_ids))
        assert all(0 <= i < q.next_lease_id for i in all_ids)
        for key, value in self.done_before.items():
            assert done[key] == value  # DONE stays DONE, with the same lease and worker
        self.done_before = done


TestShardQueueModel = ShardQueueMachine.TestCase
TestShardQueueModel.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
