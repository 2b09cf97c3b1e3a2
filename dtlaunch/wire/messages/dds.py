"""Stateful DDS: a worker and the supervisor's shard queue (AntDT §V-C).

The data set is registered (``RegisterDataset``) or asked for
(``DatasetReady``); a worker asks for shards (``FetchShards``), is leased them
(``ShardGrant`` with ``Lease`` records), acknowledges the ones it trained
(``AckShards``, answered by ``AckDone`` once DONE is durable) and gives back
what it will not train (``ReleaseShards``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtlaunch.wire.messages.base import Message, Record

__all__ = [
    "MESSAGES",
    "AckDone",
    "AckShards",
    "DatasetInfo",
    "DatasetReady",
    "FetchShards",
    "Lease",
    "RegisterDataset",
    "ReleaseShards",
    "ShardGrant",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetInfo(Record):
    """A job's data set, as in ``dtlaunch.sharding.DatasetSpec``."""

    dataset_size: int
    shard_size: int
    epochs: int
    global_batch: int
    seed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease(Record):
    """A shard (or the remainder of one) handed to one worker.

    ``start``/``end`` index the shard's records in reading order
    (``sharding.shard_records``); a whole shard is ``0..len``.
    """

    lease_id: int
    epoch: int
    shard: int
    start: int
    end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterDataset(Message):
    """A worker's ``dtlaunch.init(dataset_size=...)``; answered by DatasetReady."""

    TYPE: ClassVar[str] = "register_dataset"
    dataset: DatasetInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetReady(Message):
    """The job's data set (``dataset`` None: none registered yet), or why not."""

    TYPE: ClassVar[str] = "dataset_ready"
    dataset: DatasetInfo | None
    error: str = ""  # non-empty: the registration was refused (mismatch, bad values)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchShards(Message):
    TYPE: ClassVar[str] = "fetch_shards"
    request_id: int
    count: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardGrant(Message):
    """Answer to FetchShards, sent once the grant is durable in the WAL.

    No leases and ``finished`` False: nothing to hand out now (others hold the
    rest); ask again after ``retry_after`` seconds.
    """

    TYPE: ClassVar[str] = "shard_grant"
    request_id: int
    leases: list[Lease] = field(default_factory=list)
    finished: bool = False  # every shard of every epoch is DONE or held by others for good
    retry_after: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AckShards(Message):
    """These leases' records are all applied (their last step's gradients are in)."""

    TYPE: ClassVar[str] = "ack_shards"
    lease_ids: list[int]
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseShards(Message):
    """Give these leases back: the step that read them was dropped (BACKUP_WORKERS
    left its gradient out), so their records go back to the DDS to be read again."""

    TYPE: ClassVar[str] = "release_shards"
    lease_ids: list[int]
    step: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AckDone(Message):
    """The DONE records of these leases are durable."""

    TYPE: ClassVar[str] = "ack_done"
    lease_ids: list[int]


# This protocol's messages in the registry (``MESSAGE_TYPES``).
MESSAGES: tuple[type[Message], ...] = (
    RegisterDataset,
    DatasetReady,
    FetchShards,
    ShardGrant,
    AckShards,
    ReleaseShards,
    AckDone,
)
