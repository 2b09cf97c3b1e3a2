"""dtlaunch: launch and supervise distributed training on plain SSH clusters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtlaunch.version import __version__

if TYPE_CHECKING:
    from dtlaunch.runtime import Job

__all__ = ["__version__", "init"]


def init(
    dataset_size: int | None = None,
    shard_size: int | None = None,
    epochs: int | None = None,
    global_batch: int | None = None,
    seed: int | None = None,
    *,
    prefetch: int = 2,
) -> Job:
    """Connect a training script to its job; see ``dtlaunch.runtime.context.init``.

    Imported lazily so that ``import dtlaunch`` (the CLI, the agent) does not load
    the runtime SDK.
    """
    from dtlaunch.runtime import init as runtime_init

    return runtime_init(
        dataset_size=dataset_size,
        shard_size=shard_size,
        epochs=epochs,
        global_batch=global_batch,
        seed=seed,
        prefetch=prefetch,
    )
