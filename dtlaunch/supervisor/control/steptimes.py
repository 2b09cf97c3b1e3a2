"""Rules on one worker's sequence of step times: where a new regime starts
(a straggler's onset or end), how far apart batch sizes must be for a slope
to show through the noise, and the time per record measured at each change
of batch size (``SizeChanges``).

Why apart from the windows (``windows.py``): these read the steps in the order
they came, one at a time, and the measurements outlive every window: a plan's
change of sizes is the only evidence of how a step grows with its batch, and
it soon leaves the windows. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "CHANGES_KEPT",
    "CHANGE_STEPS",
    "CHANGE_STEPS_FIRST",
    "MIN_FIT_SPREAD",
    "REGIME_JUMP",
    "SizeChange",
    "SizeChanges",
    "regime_flags",
    "regime_starts",
]

Floats = npt.NDArray[np.float64]

# A step time that jumps by more than this between two steps of one batch size,
# and whose next step stays on the new side, starts a new regime. Step-time noise
# on a shared machine is a few per cent; a straggler's onset is tens.
REGIME_JUMP = 0.15
# A fit needs batch sizes at least this far apart (relative to the largest):
# closer ones leave the slope to the step-time noise.
MIN_FIT_SPREAD = 0.1


def regime_flags(work: Floats, bpt: Floats) -> npt.NDArray[np.bool_]:
    """``flags[j]``: a new regime starts at step ``j`` (``since_regime_change``'s
    rule, for every ``j`` in ``1 .. n-2`` at once; the ends are never flagged)."""
    flags = np.zeros(len(work), dtype=bool)
    if len(work) < 3:
        return flags
    old, new = bpt[:-2], bpt[1:-1]
    up, down = new > old * (1 + REGIME_JUMP), new * (1 + REGIME_JUMP) < old
    per_old = old / work[:-2]
    per_after = bpt[2:] / work[2:]
    half = 1 + REGIME_JUMP / 2
    flags[1:-1] = (work[:-2] == work[1:-1]) & (
        (up & (per_after > per_old * half)) | (down & (per_after * half < per_old))
    )
    return flags


def regime_starts(
    before: tuple[float, float, float], first: tuple[float, float, float], per_after: float
) -> bool:
    """``regime_flags``' rule for one step ``first`` once the step after it is
    known: ``before`` and ``first`` are ``(t, work, bpt)`` of the same work,
    ``per_after`` the next step's time per record."""
    old, new = before[2], first[2]
    up, down = new > old * (1 + REGIME_JUMP), new * (1 + REGIME_JUMP) < old
    per_old = old / before[1]
    half = 1 + REGIME_JUMP / 2
    return (up and per_after > per_old * half) or (down and per_after * half < per_old)


# A measurement of the time per record at a change of batch size takes up to
# this many steps on each side of the change (and none from before a regime
# change); each worker keeps its newest few.
CHANGE_STEPS = 8
CHANGE_STEPS_FIRST = 2  # before CHANGE_STEPS: a first measurement (SizeChanges.measured)
CHANGES_KEPT = 8


class SizeChange(NamedTuple):
    """One change of a worker's batch size: the mean step after it minus the
    mean step before it, per record of the change (``slope``, s/record), and
    how much that measurement weighs (``weight``: the inverse of its variance in
    units of the step noise's; a change of a few records is mostly noise)."""

    slope: float
    weight: float


class SizeChanges:
    """A worker's measurements of the time per record at its changes of batch
    size (module doc), over its counted steps in arrival order, apart from the
    rows (which pruning and compaction move): ``add`` each step.

    A change is measured as the mean of up to ``CHANGE_STEPS`` steps after it
    against the mean of up to ``CHANGE_STEPS`` newest steps of the run it ends,
    from that run's newest regime change on (a straggler's onset a few steps
    before its plan applies must not count as the plan's effect); a change of
    less than ``MIN_FIT_SPREAD`` of the batch is not measured (the noise would
    drown it), and a change cut short by the next one counts what it has."""

    __slots__ = ("_after", "_before", "_last", "_recent", "done")

    def __init__(self) -> None:
        self.done: deque[SizeChange] = deque(maxlen=CHANGES_KEPT)
        # The current run's newest step times since its newest regime change
        self._recent: deque[float] = deque(maxlen=CHANGE_STEPS)
        # The change being measured: [sum and count of the steps after it, the
        # mean step before it, of how many steps, the sizes before and after]
        self._after: list[float] | None = None
        self._last: tuple[float, float, float] | None = None  # (0, work, bpt) of the last step
        self._before: tuple[float, float, float] | None = None  # and of the one before it

    def add(self, work: float, bpt: float) -> None:
        last, before = self._last, self._before
        changed = last is not None and work != last[1]
        if changed:
            assert last is not None
            self._size_changed(last[1], work)
        elif (
            last is not None
            and before is not None
            and before[1] == last[1]
            and regime_starts(before, last, bpt / work)
        ):
            while len(self._recent) > 1:  # the run's steps before the last do not count
                self._recent.popleft()
        self._recent.append(bpt)
        self._before, self._last = last, (0.0, work, bpt)
        after = self._after
        if after is not None:
            after[0] += bpt
            after[1] += 1
            if after[1] >= CHANGE_STEPS:
                self._finish()

    def measured(self) -> list[SizeChange]:
        """The newest ``CHANGES_KEPT`` measurements, and the change being measured
        once it has ``CHANGE_STEPS_FIRST`` steps: a plan's next decision often
        comes before its change has ``CHANGE_STEPS``."""
        out = list(self.done)
        if self._after is not None and self._after[1] >= CHANGE_STEPS_FIRST:
            out.append(_measured(self._after))
        return out

    def _size_changed(self, old: float, new: float) -> None:
        if self._after is not None:
            self._finish()
        recent = self._recent
        if recent and abs(new - old) >= MIN_FIT_SPREAD * max(new, old):
            self._after = [0.0, 0.0, sum(recent) / len(recent), float(len(recent)), old, new]
        recent.clear()

    def _finish(self) -> None:
        after, self._after = self._after, None
        if after is not None and after[1] > 0:
            self.done.append(_measured(after))


def _measured(after: list[float]) -> SizeChange:
    total, steps, before, steps_before, old, new = after
    delta = new - old
    # The slope's variance is the step noise's times (1/n_before + 1/n_after) / delta².
    return SizeChange(
        (total / steps - before) / delta, delta * delta / (1 / steps_before + 1 / steps)
    )
