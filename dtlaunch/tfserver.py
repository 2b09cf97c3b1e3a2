"""``python -m dtlaunch.tfserver``: one TensorFlow task that runs no user code.

With ``--framework tf`` in PS mode, TensorFlow's ``ParameterServerStrategy``
runs the script only on the chief; the ``worker`` and ``ps`` tasks are plain
``tf.distribute.Server``s that the chief's coordinator sends functions and
variables to. dtlaunch starts them with this module, like the agent starts any
process (own process group, logs, restarts on the same host:port), so a user
writes none of them.

Everything comes from ``TF_CONFIG`` (its ``cluster`` and this process's
``task``). The server serves until it is stopped (SIGTERM from the agent when
the chief has finished). Exit codes: 2 for a missing or malformed TF_CONFIG or
a host without TensorFlow.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.proctitle import name_this_process

__all__ = ["TfTask", "main", "read_tf_config"]

_TASK_TYPES = ("worker", "ps")  # the tasks this module serves (the chief runs the script)


class TfTask:
    """This process's task and the cluster it belongs to, from TF_CONFIG."""

    def __init__(self, cluster: dict[str, list[str]], task_type: str, index: int) -> None:
        self.cluster = cluster
        self.task_type = task_type
        self.index = index

    @property
    def address(self) -> str:
        return self.cluster[self.task_type][self.index]


def read_tf_config(environ: Mapping[str, str]) -> TfTask:
    """The task TF_CONFIG names, checked before TensorFlow is imported (seconds).

    Raises:
        ConfigError: TF_CONFIG is missing or does not describe a worker or ps task.
    """
    text = environ.get("TF_CONFIG", "")
    if not text:
        raise ConfigError("TF_CONFIG is not set; dtlaunch run --framework tf sets it")
    try:
        data: Any = json.loads(text)
        cluster = {str(k): [str(a) for a in v] for k, v in data["cluster"].items()}
        task_type, index = str(data["task"]["type"]), int(data["task"]["index"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"TF_CONFIG is not a TensorFlow cluster description: {err}") from err
    if task_type not in _TASK_TYPES:
        raise ConfigError(
            f"TF_CONFIG names a {task_type!r} task; this server runs only "
            f"{' or '.join(_TASK_TYPES)} tasks (the chief runs the script)"
        )
    if not 0 <= index < len(cluster.get(task_type, [])):
        raise ConfigError(f"TF_CONFIG's task {task_type} {index} is not in its cluster")
    return TfTask(cluster, task_type, index)


def main() -> int:
    try:
        task = read_tf_config(os.environ)
    except ConfigError as err:
        print(f"dtlaunch.tfserver: {err}", file=sys.stderr)
        return 2
    name_this_process(
        f"tf-{task.task_type}", os.environ.get("DTLAUNCH_RUN_ID", "?"), str(task.index)
    )
    try:
        import tensorflow as tf
    except ImportError as err:
        print(
            f"dtlaunch.tfserver: TensorFlow cannot be imported here ({err}); install it "
            "on every host: pip install 'dtlaunch[tf]'",
            file=sys.stderr,
        )
        return 2
    server = tf.distribute.Server(
        tf.train.ClusterSpec(task.cluster),
        job_name=task.task_type,
        task_index=task.index,
        protocol="grpc",
        start=True,
    )
    print(f"TensorFlow {task.task_type} {task.index} serving at {task.address}", flush=True)
    server.join()  # until the agent stops this process
    return 0


if __name__ == "__main__":
    sys.exit(main())
