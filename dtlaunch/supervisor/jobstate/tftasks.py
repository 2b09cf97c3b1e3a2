"""TensorFlow's names for a job's processes (``--framework tf``). Pure.

TensorFlow addresses its processes as *tasks*: a type (``chief``, ``worker``,
``ps``) and an index, and every task reads the whole cluster from ``TF_CONFIG``.
dtlaunch's processes map onto them one to one, so a worker keeps its rank
everywhere else (status, logs, the DDS):

* allreduce mode (``MultiWorkerMirroredStrategy``): worker ``r`` is TF's
  ``worker`` ``r``; worker 0 is TF's implicit chief, as TF itself treats it.
* PS mode (``ParameterServerStrategy``): worker 0 is the ``chief`` (it runs the
  script and coordinates), workers ``1..n-1`` are TF's ``worker`` tasks
  ``0..n-2``, server ``r`` is ``ps`` ``r``. Only the chief runs user code; the
  other tasks are ``tf.distribute.Server``s dtlaunch starts
  (``python -m dtlaunch.tfserver``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

__all__ = ["TF_TASK_TYPES", "runs_script", "tf_cluster", "tf_config", "tf_task"]

# The order TF_CONFIG's cluster lists the task types in.
TF_TASK_TYPES = ("chief", "worker", "ps")


def tf_task(role: str, rank: int, *, ps_mode: bool) -> tuple[str, int]:
    """The TF task (type, index) of dtlaunch's process ``role`` ``rank``."""
    if role == "server":
        return "ps", rank
    if ps_mode:
        return ("chief", 0) if rank == 0 else ("worker", rank - 1)
    return "worker", rank


def runs_script(role: str, rank: int, *, ps_mode: bool) -> bool:
    """Whether that process runs the user's script (else a TF server)."""
    return tf_task(role, rank, ps_mode=ps_mode)[0] == ("chief" if ps_mode else "worker")


def tf_cluster(endpoints: Iterable[tuple[str, int, str]], *, ps_mode: bool) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG from (role, rank, "host:port") of every
    process: each task type's addresses in index order, empty types left out."""
    by_type: dict[str, dict[int, str]] = {kind: {} for kind in TF_TASK_TYPES}
    for role, rank, endpoint in endpoints:
        kind, index = tf_task(role, rank, ps_mode=ps_mode)
        by_type[kind][index] = endpoint
    cluster: dict[str, list[str]] = {}
    for kind, tasks in by_type.items():
        if tasks:
            if sorted(tasks) != list(range(len(tasks))):
                raise ValueError(f"TF {kind} tasks are not numbered 0..{len(tasks) - 1}")
            cluster[kind] = [tasks[i] for i in range(len(tasks))]
    return cluster


def tf_config(cluster: Mapping[str, list[str]], role: str, rank: int, *, ps_mode: bool) -> str:
    """The TF_CONFIG value of process ``role`` ``rank`` (compact JSON)."""
    kind, index = tf_task(role, rank, ps_mode=ps_mode)
    body = {
        "cluster": {kind_: list(addrs) for kind_, addrs in cluster.items()},
        "task": {"type": kind, "index": index},
    }
    return json.dumps(body, separators=(",", ":"))
