"""The stall watchdog: a job that stops making progress is noticed, never left
hanging silently (issue 12). I/O-free; time and progress come in as arguments.

Progress is anything that shows training moving: a step reported by a worker,
an update applied by a parameter server, a shard changing state in the queue.
The caller hands in monotonic counters of those each tick (``progress``); when
none of them has moved for the stall bound, ``tick`` returns a ``Stall`` once,
and the supervisor records it with a diagnosis and restarts the stuck
processes as a retryable failure. If the restarted job still makes no
progress, the next bound fires again, so a job that can never move runs out of
restarts and fails: it never hangs.

The bound is ``--stall-timeout`` when given, else adaptive: the larger of
``floor_s`` (120 s: start-up, a checkpoint, an evaluation pass) and
``factor`` (20) times the slowest step seen recently, so a job of minute-long
steps is not declared stalled between two of them.

The watchdog is armed by the first progress: a script that never reports steps
(plain torchrun code, no SDK) is never judged by it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_FACTOR", "DEFAULT_FLOOR_S", "Stall", "StallWatch"]

DEFAULT_FLOOR_S = 120.0
DEFAULT_FACTOR = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Stall:
    """No progress since ``since`` (seconds of the caller's clock)."""

    since: float
    waited_s: float
    bound_s: float


class StallWatch:
    def __init__(
        self,
        timeout_s: float | None,
        *,
        floor_s: float = DEFAULT_FLOOR_S,
        factor: float = DEFAULT_FACTOR,
    ) -> None:
        """``timeout_s``: a fixed bound; None: adaptive (see module doc); 0 or
        less: never (the watchdog is off).

        Raises: ValueError for a non-finite bound or a floor/factor <= 0.
        """
        if timeout_s is not None and not math.isfinite(timeout_s):
            raise ValueError(f"stall timeout must be finite, got {timeout_s}")
        if floor_s <= 0 or factor <= 0:
            raise ValueError(f"need floor_s > 0 and factor > 0, got {floor_s}, {factor}")
        self._timeout_s = timeout_s
        self._floor_s = floor_s
        self._factor = factor
        self._marks: tuple[int, ...] = ()
        self._last_progress: float | None = None  # None: not armed yet
        self._reported = False

    @property
    def enabled(self) -> bool:
        return self._timeout_s is None or self._timeout_s > 0

    def bound(self, slowest_step_s: float) -> float:
        """Seconds without progress that make a stall."""
        if self._timeout_s is not None:
            return self._timeout_s
        return max(self._floor_s, self._factor * max(0.0, slowest_step_s))

    def tick(
        self,
        now: float,
        *,
        progress: tuple[int, ...],
        slowest_step_s: Callable[[], float] = lambda: 0.0,
    ) -> Stall | None:
        """``progress``: counters that only grow while the job moves (steps,
        updates, shard transitions); ``slowest_step_s``: the slowest recent step,
        asked only while nothing moves (it scans every node). Returns a
        ``Stall`` once per episode."""
        if not self.enabled:
            return None
        if progress != self._marks:
            moved = any(m > 0 for m in progress)
            self._marks = progress
            if moved:
                self._last_progress = now
                self._reported = False
            return None
        if self._last_progress is None or self._reported:
            return None
        waited = now - self._last_progress
        bound = self.bound(slowest_step_s())
        if waited < bound:
            return None
        self._reported = True
        return Stall(since=self._last_progress, waited_s=waited, bound_s=bound)

    def restarted(self, now: float) -> None:
        """The stuck processes were restarted: give them a whole bound again."""
        if self._last_progress is not None:
            self._last_progress = now
            self._reported = False
