"""Leases without a supervisor: ``python train.py`` reads every shard itself.

Used when ``DTLAUNCH_SUPERVISOR`` is not set, so a training script written for
dtlaunch runs as a plain single process for debugging. It hands out every
epoch's shards whole, in the order the supervisor would (``epoch_order``), as
rank 0 of 1. Acks have nobody to go to; they are only counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from dtlaunch.runtime.data import NotReady
from dtlaunch.runtime.steps import TimedReport
from dtlaunch.sharding import DatasetSpec, epoch_order
from dtlaunch.wire.messages import Lease, Message

__all__ = ["StandaloneSource"]


class StandaloneSource:
    """A ``LeaseSource`` over the whole data set, epoch after epoch."""

    def __init__(self, spec: DatasetSpec) -> None:
        self._leases = self._all_leases(spec)
        self._given: dict[int, Lease] = {}
        self._again: deque[Lease] = deque()  # released leases, read again last (as the DDS does)
        self.acked: list[int] = []

    def next_lease(self) -> Lease | None:
        lease = next(self._leases, None)
        if lease is None and self._again:
            lease = self._again.popleft()
        if lease is not None:
            self._given[lease.lease_id] = lease
        return lease

    def ack(self, lease_ids: Sequence[int], step: int) -> None:
        self.acked.extend(lease_ids)

    def release(self, lease_ids: Sequence[int], step: int) -> None:
        self._again.extend(self._given[i] for i in lease_ids if i in self._given)

    def give_back_queued(self, step: int) -> None:
        return None  # nothing is fetched ahead

    def close(self, timeout: float) -> None:
        return None

    def poll_lease(self, timeout: float) -> Lease | NotReady | None:
        return self.next_lease()  # every lease is always at hand

    def report(self, reports: list[TimedReport]) -> None:
        return None  # no Monitor without a supervisor

    def flush_reports(self) -> None:
        return None

    def actions(self) -> list[Message]:
        return []

    @staticmethod
    def _all_leases(spec: DatasetSpec) -> Iterator[Lease]:
        lease_id = 0
        for epoch in range(spec.epochs):
            for shard in epoch_order(spec, epoch):
                yield Lease(
                    lease_id=lease_id,
                    epoch=epoch,
                    shard=shard,
                    start=0,
                    end=spec.shard_length(shard),
                )
                lease_id += 1
