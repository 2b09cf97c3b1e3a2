"""How a data set is cut into shards and in which order they are read (pure).

Records are indices ``0..N-1``. The data set is cut into ``K = ceil(N / S)`` shards
of ``S`` consecutive records (the last one may be shorter). Each epoch reads the
shards in a permutation seeded by ``(seed, epoch)``, and the records inside a shard
in a permutation seeded by ``(seed, epoch, shard)``, so a re-run of a shard (after
its worker died) reads the very same records in the same order. The supervisor and
every worker compute the same orders from the same ``DatasetSpec``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from dtlaunch.errors import ConfigError

if TYPE_CHECKING:  # the wire and numpy load on first use: every CLI command imports this
    import numpy as np
    from numpy.typing import NDArray

    from dtlaunch.wire.messages import DatasetInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetSpec:
    dataset_size: int  # N records
    shard_size: int  # S records per shard
    epochs: int = 1
    global_batch: int = 0  # B; 0 = not given (then the SDK's local batch is the shard size)
    seed: int = 0

    def validate(self) -> DatasetSpec:
        """Raises ConfigError naming the option when a value is out of range."""
        if self.dataset_size < 1:
            raise ConfigError(f"--dataset-size must be at least 1, got {self.dataset_size}")
        if self.shard_size < 1:
            raise ConfigError(f"--shard-size must be at least 1, got {self.shard_size}")
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be at least 1, got {self.epochs}")
        if self.global_batch < 0:
            raise ConfigError(f"--global-batch must be 0 or more, got {self.global_batch}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"--seed must be in [0, 2**63), got {self.seed}")
        return self

    @property
    def num_shards(self) -> int:
        """K = ceil(N / S)."""
        return math.ceil(self.dataset_size / self.shard_size)

    @property
    def total_shards(self) -> int:
        """Shards over all epochs: K x E."""
        return self.num_shards * self.epochs

    def shard_length(self, shard: int) -> int:
        start = shard * self.shard_size
        return min(self.shard_size, self.dataset_size - start)


def epoch_order(spec: DatasetSpec, epoch: int) -> list[int]:
    """The shards of ``epoch`` in the order they are handed out."""
    return epoch_order_array(spec, epoch).tolist()  # type: ignore[no-any-return]


def epoch_order_array(spec: DatasetSpec, epoch: int) -> NDArray[np.int64]:
    """``epoch_order`` as an int64 array: 8 bytes a shard instead of a Python int's
    ~36, which matters for the supervisor's queue at millions of shards."""
    import numpy as np

    rng = np.random.default_rng([spec.seed, epoch])
    return rng.permutation(spec.num_shards).astype(np.int64, copy=False)


def shard_records(spec: DatasetSpec, epoch: int, shard: int) -> list[int]:
    """The record indices of ``shard`` in ``epoch``, in reading order."""
    start = shard * spec.shard_size
    length = spec.shard_length(shard)
    import numpy as np

    rng = np.random.default_rng([spec.seed, epoch, shard, 1])
    return [start + int(i) for i in rng.permutation(length)]


def dataset_info(spec: DatasetSpec) -> DatasetInfo:
    """The wire form of a data set."""
    from dtlaunch.wire.messages import DatasetInfo

    return DatasetInfo(**asdict(spec))


def dataset_spec(info: DatasetInfo) -> DatasetSpec:
    """A data set from its wire form (not validated: call ``validate()``)."""
    return DatasetSpec(
        dataset_size=info.dataset_size,
        shard_size=info.shard_size,
        epochs=info.epochs,
        global_batch=info.global_batch,
        seed=info.seed,
    )
