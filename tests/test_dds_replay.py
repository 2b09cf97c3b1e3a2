"""ShardQueue.replay: the fast recovery path gives exactly the state apply() gives,
and refuses what apply() refuses."""

from __future__ import annotations

import msgpack
import pytest

from dtlaunch.sharding import DatasetSpec
from dtlaunch.supervisor.dds.queue import ShardQueue
from dtlaunch.supervisor.dds.records import DdsStateError, encode_transition

SPEC = DatasetSpec(dataset_size=1000, shard_size=30, epochs=3, seed=5)


def _workload():
    live = ShardQueue(SPEC)
    log = []
    step = 0
    while not live.finished:
        step += 1
        for worker in range(3):
            grants = live.fetch(worker, 2)
            log += grants
            if grants and step % 5 == 0:
                log += live.release_worker(worker)  # a death: back to TODO
                continue
            done, _ = live.ack(worker, [t.lease_id for t in grants[:1]])
            log += done
            log += live.ack(worker, [t.lease_id for t in grants[1:]])[0]
    return live, log


def test_replay_equals_the_live_queue_and_apply():
    live, log = _workload()
    payloads = [encode_transition(t) for t in log]
    fast = ShardQueue(SPEC)
    fast.replay(payloads)
    slow = ShardQueue(SPEC)
    for t in log:
        slow.apply(t)
    assert fast == live == slow
    assert fast.state_digest() == live.state_digest()


@pytest.mark.parametrize(
    "bad",
    [
        msgpack.packb([1, 0, 0, 0, -1, 0, 30]),  # negative
        msgpack.packb([1, 0, 0, "x", 0, 0, 30]),  # not a number
        msgpack.packb([9, 0, 0, 0, 0]),  # unknown tag
        msgpack.packb([1, 0, 0, 0]),  # too short
        msgpack.packb({"t": 1}),  # not a row
        b"\xc1",  # not msgpack
    ],
)
def test_replay_refuses_malformed_records(bad):
    with pytest.raises(DdsStateError):
        ShardQueue(SPEC).replay([bad])


def test_replay_refuses_a_log_that_disagrees_with_the_queue():
    _, log = _workload()
    payloads = [encode_transition(t) for t in log]
    with pytest.raises(DdsStateError, match="disagrees"):
        ShardQueue(SPEC).replay(payloads[1:])  # a missing first grant shifts everything
    other = DatasetSpec(dataset_size=1000, shard_size=30, epochs=3, seed=6)
    with pytest.raises(DdsStateError):
        ShardQueue(other).replay(payloads)  # another data set's log


def test_two_records_in_one_payload_are_refused():
    _, log = _workload()
    joined = encode_transition(log[0]) + encode_transition(log[1])
    with pytest.raises(DdsStateError, match="payloads"):
        ShardQueue(SPEC).replay([joined])
