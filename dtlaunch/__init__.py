"""dtlaunch: launch and supervise distributed training on plain SSH clusters."""

from __future__ import annotations

from dtlaunch.version import __version__

# Not typing.TYPE_CHECKING: importing typing (and collections.abc) here would be
# paid by every host's `dtlaunch check` probe and agent start; mypy honours any
# name TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from dtlaunch.launch_api import LaunchResult
    from dtlaunch.runtime import Job

__all__ = ["LaunchResult", "__version__", "init", "launch"]


def init(
    dataset_size: int | None = None,
    shard_size: int | None = None,
    epochs: int | None = None,
    global_batch: int | None = None,
    seed: int | None = None,
    *,
    prefetch: int = 2,
) -> Job:
    """Connect a training script to its job; see ``dtlaunch.runtime.start.init``.

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


def launch(
    target: str | Callable[..., Any], args: Sequence[Any] = (), **options: Any
) -> LaunchResult:
    """Run ``target`` as a supervised job from Python; see ``dtlaunch.launch_api.launch``.

    Imported lazily: a training process that imports dtlaunch does not load the
    supervisor.
    """
    from dtlaunch.launch_api import launch as launch_job

    return launch_job(target, args, **options)


def __getattr__(name: str) -> Any:
    if name == "rna":  # dtlaunch.rna.Trainer without an import of its own; loads torch
        import importlib

        return importlib.import_module("dtlaunch.rna")
    if name == "LaunchResult":  # the result type, without importing the launcher eagerly
        from dtlaunch.launch_api import LaunchResult

        return LaunchResult
    raise AttributeError(f"module 'dtlaunch' has no attribute {name!r}")
