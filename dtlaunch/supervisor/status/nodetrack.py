"""One worker or server as ``dtlaunch status`` keeps it (``fold``): a bounded
series of BPT points from its step reports (a server's: its update times), its
process state and host, and its last resource sample. I/O-free."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "RECENT_POINTS",
    "SPARK_POINTS",
    "BptPoint",
    "NodeTrack",
    "Resources",
    "report_point",
    "server_point",
]

SPARK_POINTS = 40  # BPT points kept per node (one per "reports" event)
RECENT_POINTS = 10  # the newest points behind "recent" BPT, throughput and ratios


@dataclass(frozen=True, slots=True)
class BptPoint:
    """One batch of step reports of a worker."""

    t: float  # event-log seconds when its last step ended
    bpt: float  # mean compute + comm per step
    compute_per_sample: float  # mean compute_s / batch_size (for the equal-share BPT)
    comm: float  # mean comm_s per step
    samples: int
    busy_s: float  # sum of the steps' times
    injected_s: float  # mean injected delay per step


@dataclass(slots=True)
class NodeTrack:
    role: str
    rank: int
    host: str = ""
    state: str = "pending"
    restarts: int = 0
    batch_size: int = 0
    shards_done: int = 0
    since: float = 0.0  # the current process's start: ratios use only its own points
    points: deque[BptPoint] = field(default_factory=lambda: deque(maxlen=SPARK_POINTS))
    action_note: str = ""  # the latest policy action that touched this node
    # From the latest "resources" sample (a live status gets them first-hand).
    resources: Resources | None = None
    removed: bool = False  # a scale took it out of the job (a drained server)

    def recent(self) -> list[BptPoint]:
        """The newest ``RECENT_POINTS`` points of the current process, oldest first.

        Walked from the newest end: a status answer asks this of every node, and
        filtering all ``SPARK_POINTS`` of 1,000 nodes was half of its fold."""
        out: list[BptPoint] = []
        for point in reversed(self.points):
            if point.t >= self.since:
                out.append(point)
                if len(out) == RECENT_POINTS:
                    break
        out.reverse()
        return out

    def bpt_eq(self, batch_ref: float) -> float:
        """Recent BPT as if this node had ``batch_ref`` samples a step (see monitor)."""
        recent = self.recent()
        if not recent:
            return 0.0
        return sum(p.compute_per_sample * batch_ref + p.comm for p in recent) / len(recent)

    def recent_means(self) -> tuple[float, float, float]:
        """(bpt, throughput, injected) from one pass over the recent points: a
        snapshot of 1,000 nodes asks for all three of each."""
        bpt = busy = injected = 0.0
        samples = 0
        recent = self.recent()
        for p in recent:
            bpt += p.bpt
            busy += p.busy_s
            injected += p.injected_s
            samples += p.samples
        if not recent:
            return 0.0, 0.0, 0.0
        n = len(recent)
        return bpt / n, samples / busy if busy > 0 else 0.0, injected / n


class Resources(NamedTuple):
    """A process's use at its last heartbeat beside its limits (0: none)."""

    memory_bytes: int
    memory_limit: int
    cpu_percent: float
    cpu_limit: float


def report_point(data: Mapping[str, Any], at: float) -> BptPoint | None:
    """A ``reports`` event's columns as one point (None if they are malformed)."""
    try:
        compute = [float(x) for x in data["compute_s"]]
        comm = [float(x) for x in data.get("comm_s") or [0.0] * len(compute)]
        sizes = [max(1, int(x)) for x in data["batch_size"]]
        samples = sum(int(x) for x in data.get("samples") or sizes)
        injected = [float(x) for x in data.get("injected_s") or [0.0] * len(compute)]
        ends = data.get("t") or [at]
    except (KeyError, TypeError, ValueError):
        return None
    n = len(compute)
    if n == 0 or len(comm) != n or len(sizes) != n:
        return None
    times = [c + m for c, m in zip(compute, comm, strict=True)]
    return BptPoint(
        t=float(ends[-1]),
        bpt=sum(times) / n,
        compute_per_sample=sum(c / b for c, b in zip(compute, sizes, strict=True)) / n,
        comm=sum(comm) / n,
        samples=samples,
        busy_s=sum(times),
        injected_s=sum(injected) / max(1, len(injected)),
    )


def server_point(data: Mapping[str, Any], at: float) -> BptPoint | None:
    """A ``server_reports`` event's update times as one point (None if malformed)."""
    try:
        updates = [float(x) for x in data["update_s"]]
        injected = [float(x) for x in data.get("injected_s") or [0.0] * len(updates)]
        ends = data.get("t") or [at]
    except (KeyError, TypeError, ValueError):
        return None
    if not updates:
        return None
    return BptPoint(
        t=float(ends[-1]),
        bpt=sum(updates) / len(updates),
        compute_per_sample=0.0,
        comm=0.0,
        samples=0,
        busy_s=sum(updates),
        injected_s=sum(injected) / max(1, len(injected)),
    )
