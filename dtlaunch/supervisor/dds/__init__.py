"""Stateful Dynamic Data Sharding, the supervisor's side (AntDT §V-C).

- ``queue``    :class:`ShardQueue`, the I/O-free TODO/DOING/DONE state machine
- ``records``  its durable forms: transitions and snapshot images (pure)
- ``service``  :class:`DdsService`: the queue + the write-ahead log + the replies
               to workers (a reply leaves only once its transition is durable)
"""

from dtlaunch.supervisor.dds.queue import (
    DdsStateError,
    Done,
    Grant,
    Release,
    ShardQueue,
    Transition,
)
from dtlaunch.supervisor.dds.service import DdsService

__all__ = ["DdsService", "DdsStateError", "Done", "Grant", "Release", "ShardQueue", "Transition"]
