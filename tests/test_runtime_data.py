"""dtlaunch.runtime.data and standalone mode: batching across leases, what step()
acks, and the no-supervisor source (pure, no I/O)."""

from __future__ import annotations

from collections import deque

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.runtime.data import BatchStream, local_batch_size
from dtlaunch.runtime.standalone import StandaloneSource
from dtlaunch.sharding import DatasetSpec, epoch_order, shard_records
from dtlaunch.wire.messages import (
    Lease,
)


class ListSource:
    def __init__(self, leases):
        self.leases = deque(leases)
        self.acks = []

    def next_lease(self):
        return self.leases.popleft() if self.leases else None

    def poll_lease(self, timeout):
        return self.next_lease()

    def ack(self, lease_ids, step):
        self.acks.append((list(lease_ids), step))

    def close(self, timeout):
        pass


SPEC = DatasetSpec(dataset_size=25, shard_size=10)


def lease(lease_id, shard, start=0, end=None):
    return Lease(
        lease_id=lease_id, epoch=0, shard=shard, start=start, end=end or SPEC.shard_length(shard)
    )


def test_local_batch_size_splits_the_global_batch():
    spec = DatasetSpec(dataset_size=100, shard_size=10, global_batch=10)
    assert [local_batch_size(spec, r, 4) for r in range(4)] == [3, 3, 2, 2]
    assert local_batch_size(DatasetSpec(dataset_size=100, shard_size=10), 2, 4) == 10
    with pytest.raises(ConfigError, match="smaller than the 11 workers"):
        local_batch_size(spec, 0, 11)


def test_batches_cross_leases_and_step_acks_what_was_returned():
    source = ListSource([lease(1, 0), lease(2, 2), lease(3, 1, start=4)])  # 10 + 5 + 6
    stream = BatchStream(source, SPEC, 4)
    got = [stream.next_batch() for _ in range(6)]
    records = [r for b in got if b for r in b]
    parts = [shard_records(SPEC, 0, 0), shard_records(SPEC, 0, 2), shard_records(SPEC, 0, 1)[4:]]
    assert records == [r for part in parts for r in part]
    assert [len(b) for b in got if b] == [4, 4, 4, 4, 4, 1]
    assert stream.next_batch() is None and stream.ended
    # Five batches returned before this step: leases 1 (batch 3) and 2 (batch 4) are done,
    # lease 3 ends in the sixth batch, also returned: all three.
    stream.step()
    assert source.acks == [([1, 2, 3], 1)]
    stream.step()
    assert source.acks == [([1, 2, 3], 1)]


def test_one_batch_per_step_acks_only_trained_batches():
    source = ListSource([lease(1, 0), lease(2, 2)])
    stream = BatchStream(source, SPEC, 5)
    stream.set_mode("one_per_step")
    batches = [stream.next_batch() for _ in range(3)]  # read ahead, like a DataLoader
    assert [len(b) for b in batches] == [5, 5, 5]
    stream.step()
    assert source.acks == []
    stream.step()  # batch 2 held lease 1's last record
    assert source.acks == [([1], 2)]
    stream.step()
    assert source.acks == [([1], 2), ([2], 3)]
    stream.step()  # nothing left to cover
    assert len(source.acks) == 2 and stream.steps == 4


def test_empty_lease_is_acked_at_once():
    source = ListSource([lease(1, 0, 3, 3), lease(2, 2)])
    stream = BatchStream(source, SPEC, 10)
    assert len(stream.next_batch()) == 5
    assert source.acks == [([1], 0)]


def test_standalone_source_hands_out_every_shard_of_every_epoch():
    spec = DatasetSpec(dataset_size=23, shard_size=5, epochs=3)
    source = StandaloneSource(spec)
    leases = list(iter(source.next_lease, None))
    assert [(x.epoch, x.shard) for x in leases] == [
        (e, s) for e in range(3) for s in epoch_order(spec, e)
    ]
    assert len({x.lease_id for x in leases}) == len(leases) == 15
    assert all(x.end == spec.shard_length(x.shard) for x in leases)
