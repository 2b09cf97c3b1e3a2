"""The data set a script names in ``dtlaunch.init()``: checked, completed, compared.

A script may pass the whole data set (standalone, or to register it with the
supervisor), some of its values (then they must agree with the job's, from
``dtlaunch run --dataset-size ...``), or none. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from dtlaunch.errors import ConfigError
from dtlaunch.sharding import DatasetSpec

__all__ = ["check_args_agree", "dataset_from_args", "given_dataset_args"]


def given_dataset_args(**values: int | None) -> dict[str, int]:
    """The values the script passed (None: not passed), each checked to be an int."""
    given: dict[str, int] = {}
    for name, value in values.items():
        if value is None:
            continue
        if type(value) is not int:
            raise ConfigError(f"{name} must be an int, got {value!r}")
        given[name] = value
    return given


def dataset_from_args(given: Mapping[str, int]) -> DatasetSpec | None:
    """The data set the script gave, or None when it gave no size and shard size."""
    if "dataset_size" not in given and "shard_size" not in given:
        return None
    missing = [name for name in ("dataset_size", "shard_size") if name not in given]
    if missing:
        raise ConfigError(
            f"dtlaunch.init() got {', '.join(sorted(given))} but not {missing[0]}: "
            "pass dataset_size= and shard_size= together"
        )
    for name, low in (("dataset_size", 1), ("shard_size", 1), ("epochs", 1)):
        if given.get(name, low) < low:
            raise ConfigError(f"{name} must be at least {low}, got {given[name]}")
    if given.get("global_batch", 0) < 0:
        raise ConfigError(f"global_batch must be 0 or more, got {given['global_batch']}")
    if not 0 <= given.get("seed", 0) < 2**63:
        raise ConfigError(f"seed must be in [0, 2**63), got {given['seed']}")
    return DatasetSpec(**given).validate()


def check_args_agree(spec: DatasetSpec, given: Mapping[str, int]) -> None:
    """Values the script gave must match the job's data set."""
    wrong = [
        f"{name}={value} (the job has {getattr(spec, name)})"
        for name, value in given.items()
        if getattr(spec, name) != value
    ]
    if wrong:
        raise ConfigError(
            f"dtlaunch.init() got {', '.join(wrong)}; make dtlaunch.init() and the "
            "dtlaunch run data set options agree"
        )
