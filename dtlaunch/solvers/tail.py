"""The end of the data: batch sizes for the records the workers still hold.

Once every shard of a data set is handed out, the job's last steps run on the
records each worker holds. BSP steps go on until the last worker has read its
records; a worker whose records ran out steps with none. A worker that
balancing shrank (a straggler with a fixed per-step cost: contention, a slow
local disk) may hold many steps' worth at its small batch, and the job then
ends on its steps alone while the others wait (benchmarks/stragglers.py
--quick: lb-bsp ran 77 steps for 44 steps' worth of data and was 1.19x slower
than not balancing at all). Taking more records a step ends its records sooner
whenever its step line has a fixed part, and costs the others nothing once they
have run out.

``raise_for_tail`` raises such workers' batch sizes, up to a cap (the caller's:
the equal share of the global batch, which every worker's memory held at the
start, or the device's bound), where the estimated time to the last record
falls. The records a worker holds are known only between two bounds (the
oldest of its leases may be read in part or whole), so a raise must not
lengthen the estimate at either bound.

Pure: step lines ``(fixed_s, per_sample_s)``, sizes and record counts in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Raise", "raise_for_tail", "time_to_last_record"]

Line = tuple[float, float]  # a step's seconds: fixed_s + per_sample_s x batch
MAX_CANDIDATES = 256  # sizes tried per worker
MAX_PASSES = 8  # over the workers (raise_for_tail)


@dataclass(frozen=True, slots=True)
class Raise:
    """Worker ``index``'s batch from ``old`` to ``new``; the estimated seconds to
    the job's last record before and after, with every held record left."""

    index: int
    old: int
    new: int
    before_s: float
    after_s: float


def _steps(records: int, size: int) -> int:
    return math.ceil(records / size) if records > 0 else 0


def _step_s(line: Line, size: int) -> float:
    return line[0] + line[1] * size


def _profile(
    lines: Sequence[Line], sizes: Sequence[int], records: Sequence[int], skip: int
) -> list[float]:
    """Step ``s`` (from 0) of the others than ``skip``: as long as the slowest of
    those still reading records then (0.0 past the last)."""
    profile: list[float] = []
    for j, (line, size, left) in enumerate(zip(lines, sizes, records, strict=True)):
        n = _steps(left, size) if j != skip else 0
        if n == 0:
            continue
        t = _step_s(line, size)
        if n > len(profile):
            profile.extend([0.0] * (n - len(profile)))
        for s in range(n):
            if profile[s] < t:
                profile[s] = t
    return profile


def _total(profile: list[float], steps: int, step_s: float) -> float:
    """Seconds to the last record: the others' profile with one worker of
    ``steps`` steps of ``step_s`` beside it."""
    total = 0.0
    for s in range(max(steps, len(profile))):
        own = step_s if s < steps else 0.0
        other = profile[s] if s < len(profile) else 0.0
        total += own if own > other else other
    return total


def _estimate(line: Line, size: int, *bounds: tuple[int, list[float]]) -> tuple[float, float]:
    """Seconds to the last record with this worker at ``size``, at each bound
    (its records left, the others' profile)."""
    t = _step_s(line, size)
    most, fewest = (_total(profile, _steps(left, size), t) for left, profile in bounds)
    return most, fewest


def time_to_last_record(
    lines: Sequence[Line], sizes: Sequence[int], records: Sequence[int]
) -> float:
    """Seconds until every worker has read its ``records`` at ``sizes``: BSP
    steps, each as long as the slowest worker that still reads records in it."""
    return _total(_profile(lines, sizes, records, skip=-1), 0, 0.0)


def raise_for_tail(
    lines: Sequence[Line],
    sizes: Sequence[int],
    most: Sequence[int],
    fewest: Sequence[int],
    caps: Sequence[int],
    *,
    margin: float,
) -> list[Raise]:
    """The raises that end the data sooner (empty: none does).

    ``most``/``fewest``: each worker's records left, at most and at least.
    Workers are taken in order of how many steps their records last at the
    fewest (the one ending the job first); each one's batch goes to the size in
    ``(size, cap]`` with the smallest estimate, at the most and at the fewest
    records summed, provided neither estimate gets longer and the sum falls by
    more than ``margin``. The first worker whose raise does not pay ends the
    pass: the ones after it end sooner still. Passes repeat while one raises
    a worker. Each worker is named once, with its first estimate before and
    the last after.
    """
    plan = list(sizes)
    raised: list[Raise] = []
    # A worker's raise gains only down to where the others' steps bound the end:
    # with two shrunk workers holding records, the first raise stops at the
    # second's steps. So passes over the workers until one raises nobody.
    for _ in range(MAX_PASSES):
        more = _one_pass(lines, plan, most, fewest, caps, margin)
        if not more:
            break
        raised += more
    # One entry per worker: from its size before to its size after.
    first: dict[int, Raise] = {}
    for r in raised:
        first.setdefault(r.index, r)
    return [
        Raise(index=i, old=r.old, new=plan[i], before_s=r.before_s, after_s=raised[-1].after_s)
        for i, r in first.items()
    ]


def _one_pass(
    lines: Sequence[Line],
    plan: list[int],
    most: Sequence[int],
    fewest: Sequence[int],
    caps: Sequence[int],
    margin: float,
) -> list[Raise]:
    """One pass of ``raise_for_tail`` over the workers, raising ``plan`` in place."""
    raised: list[Raise] = []
    order = sorted(range(len(plan)), key=lambda i: (-_steps(fewest[i], plan[i]), i))
    for i in order:
        if most[i] <= 0 or caps[i] <= plan[i]:
            continue
        bounds = (
            (most[i], _profile(lines, plan, most, i)),
            (fewest[i], _profile(lines, plan, fewest, i)),
        )
        base_hi, base_lo = _estimate(lines[i], plan[i], *bounds)
        # The step counts change only where a size divides the records anew:
        # the smallest size for each count of steps from the cap's down (at most
        # MAX_CANDIDATES counts: a batch of 1 may hold thousands of steps).
        candidates = {caps[i]}
        for left in (most[i], fewest[i]):
            first = _steps(left, caps[i])
            for s in range(max(first, 1), min(_steps(left, plan[i]), first + MAX_CANDIDATES)):
                x = math.ceil(left / s)
                if plan[i] < x <= caps[i]:
                    candidates.add(x)
        best: tuple[float, int, float] | None = None
        for x in sorted(candidates):
            t_hi, t_lo = _estimate(lines[i], x, *bounds)
            if t_hi <= base_hi and t_lo <= base_lo and (best is None or t_hi + t_lo < best[0]):
                best = (t_hi + t_lo, x, t_hi)
        if best is None or best[0] >= (base_hi + base_lo) * (1.0 - margin):
            break
        raised.append(Raise(index=i, old=plan[i], new=best[1], before_s=base_hi, after_s=best[2]))
        plan[i] = best[1]
    return raised
