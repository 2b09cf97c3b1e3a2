"""Exact integer batch balancing: AntDT eq. 3 (§VI-A, transient stragglers).

Given worker throughputs ``v_i > 0`` (samples/s), a global batch ``B`` and a
per-worker minimum ``B_min``, find integers ``B_i`` minimising the makespan
``z = max_i B_i / v_i`` subject to ``sum B_i = B`` and ``B_i >= B_min``.

Formulation as a selection problem
----------------------------------
Every worker starts with ``B_min``.  The ``R = B - n * B_min`` remaining samples
are *units*; the ``k``-th sample of worker ``i`` (``k > B_min``) finishes at time
``k / v_i``.  Call the pair ``(i, k)`` an *element* with value ``k / v_i``.  A
feasible allocation is exactly a per-worker prefix-closed set of ``R`` elements
(worker ``i`` holding ``B_i`` samples holds the elements ``B_min+1 .. B_i``), and
its makespan is ``max(max_i B_min / v_i, largest value in the set)``.

Order the elements by ``(value, i)`` (exact rational values; equal values are
ordered by worker rank).  Taking the ``R`` smallest elements is prefix-closed
(within one worker the values grow with ``k``), so it is feasible, and no other
set of ``R`` elements has a smaller largest value.  Hence it is optimal.  It is
also exactly what the greedy "hand out units one at a time to the worker that
would finish it soonest, lowest rank on ties" produces, which is our
deterministic tie-break among the (usually many) optimal solutions: it is the
water-filling solution closest to proportional (``B_i ≈ B * v_i / sum v``), a
faster worker never gets fewer samples than a slower one, equal workers differ
by at most one sample, and the extra samples of an exact tie go to the lowest
ranks.

Finding the ``R``-th smallest element fast and exactly
-------------------------------------------------------
Let ``C(t)`` count the elements with value ``<= t`` and ``g_c(t) = sum_i max(0,
t v_i - c)``.  Since ``x - 1 < floor(x) <= x``::

    g_{B_min + 1}(t) <= C(t) <= g_{B_min}(t)

The ``R``-th smallest value ``t*`` satisfies ``C(t*) >= R``, so ``t* >= t_lo``
where ``g_{B_min}(t_lo) = R``, and ``C(t_hi) >= R`` where ``g_{B_min+1}(t_hi) = R``,
so ``t* <= t_hi``.  Both levels are "water levels"; with workers sorted by
speed, ``t = min_j (R + c j) / (v_(1) + ... + v_(j))`` (each term solves the
equation with the ``j`` fastest workers active and is ``>= t`` because ``g_c``
dominates every partial sum).  Elements below ``t_lo`` need no look; the ones in
``[t_lo, t_hi]`` number at most ``g(t_hi) - g(t_lo) + 3n <= 4n`` (as
``g_{B_min} - g_{B_min+1} <= n``), so we list them with numpy and select.

Floating point: every bound is widened by a relative ``1e-9`` (far above the
``n * 2**-53`` error of the sums) and floors by one unit, so the listed window
provably contains ``t*``.  Element values ``k / v_i`` are one correctly
rounded IEEE division, and rounding is monotone: ``fl(x) < fl(y)`` implies
``x < y``.  So the float ``R``-th value ``tau`` splits the window exactly:
elements with float value below ``tau`` are all selected, those above are not,
and only the elements whose float value *equals* ``tau`` (exact ties and
near-ties that rounded together) are ranked by exact ``fractions.Fraction``
arithmetic (floats are exact dyadic rationals), then by rank.  Scaling all
throughputs by a power of two (done to avoid overflow) is exact, so it changes
nothing.  A final integer check (sum and minimum) guards the result.

Cost: O(n log n) numpy work plus Python work proportional to the number of exact
ties near ``t*`` (distinct ``(k, v)`` pairs only; equal throughputs collapse).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dtlaunch.errors import InfeasibleError

__all__ = ["MAX_SPEED_RATIO", "MAX_TOTAL", "InfeasibleError", "makespan", "solve_batch_sizes"]

# Products t * v_i stay far below 2**53, so float floors are off by at most one.
MAX_TOTAL = 2**50
# Keeps every k / v_i a normal float after scaling; a wider spread is a broken measurement.
MAX_SPEED_RATIO = 1e100
# Bounds widened by this relative margin; float error of the water levels is < n * 2**-53.
_LEVEL_MARGIN = 1e-9

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def solve_batch_sizes(throughputs: Sequence[float], total: int, minimum: int = 1) -> list[int]:
    """Return integer batch sizes, in worker order, minimising ``max_i B_i / v_i``.

    The result sums to ``total``, every entry is ``>= minimum``, and its makespan
    is the true integer optimum of AntDT eq. 3.  Among optimal solutions it is the
    water-filling one: samples beyond ``minimum`` go one at a time to the worker
    that would finish them soonest, ties to the lowest rank (see module docs).

    Raises:
        InfeasibleError: ``len(throughputs) * minimum > total``, or a throughput
            that is not a finite number > 0, a negative ``total`` or ``minimum``,
            an empty worker list, or values beyond the supported range.
    """
    speeds = _validated_speeds(throughputs)
    total = _validated_int("total", total)
    minimum = _validated_int("minimum", minimum)
    n = int(speeds.size)
    if total > MAX_TOTAL:
        raise InfeasibleError(
            f"total batch {total} is larger than the supported {MAX_TOTAL}; "
            "pass a realistic global batch size"
        )
    if n * minimum > total:
        raise InfeasibleError(
            f"{n} workers x minimum {minimum} = {n * minimum} samples exceeds the global "
            f"batch {total}; lower the minimum to at most {total // n} or raise the "
            f"global batch to at least {n * minimum}"
        )
    units = total - n * minimum
    if units == 0:
        return [minimum] * n
    # A power-of-two scale is exact: it keeps every ratio and tie of the input.
    _, exponent = math.frexp(float(speeds.max()))
    speeds = np.ldexp(speeds, -exponent)
    sizes = _select_units(speeds, units, minimum)
    if int(sizes.sum()) != total or int(sizes.min()) < minimum:
        raise RuntimeError(  # pragma: no cover - guards the proof, never expected
            f"batch solver bug: sizes sum to {int(sizes.sum())} (want {total}) "
            f"with minimum {int(sizes.min())} (want >= {minimum}); please report it"
        )
    return [int(size) for size in sizes]


def makespan(batch_sizes: Sequence[int], throughputs: Sequence[float]) -> float:
    """Return ``max_i batch_sizes[i] / throughputs[i]`` (0.0 for all-zero batches).

    Raises:
        InfeasibleError: the lengths differ, a throughput is not finite and > 0,
            or a batch size is negative.
    """
    speeds = _validated_speeds(throughputs)
    if len(batch_sizes) != speeds.size:
        raise InfeasibleError(
            f"{len(batch_sizes)} batch sizes for {speeds.size} throughputs; "
            "pass one batch size per worker"
        )
    sizes = np.asarray(batch_sizes, dtype=np.float64)
    if sizes.size and float(sizes.min()) < 0:
        raise InfeasibleError("a batch size is negative; batch sizes must be >= 0")
    return float(np.max(sizes / speeds))


def _validated_speeds(throughputs: Sequence[float]) -> FloatArray:
    try:
        speeds = np.asarray(throughputs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InfeasibleError(
            f"throughputs must be a sequence of numbers (samples/s): {exc}"
        ) from None
    if speeds.ndim != 1 or speeds.size == 0:
        raise InfeasibleError(
            "throughputs must be a non-empty flat sequence with one value per worker"
        )
    bad = ~(np.isfinite(speeds) & (speeds > 0))
    if bad.any():
        rank = int(np.flatnonzero(bad)[0])
        raise InfeasibleError(
            f"throughput of worker {rank} is {speeds[rank]!r}; every throughput must be a "
            "finite number > 0 samples/s (drop or re-measure workers without a valid rate)"
        )
    ratio = float(speeds.max()) / float(speeds.min())
    if not ratio <= MAX_SPEED_RATIO:
        raise InfeasibleError(
            f"fastest/slowest throughput ratio {ratio:.3g} exceeds {MAX_SPEED_RATIO:g}; "
            "the measurements are broken, drop the stalled worker instead"
        )
    return speeds


def _validated_int(name: str, value: int) -> int:
    if isinstance(value, bool):
        raise InfeasibleError(f"{name} must be an integer, not a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise InfeasibleError(
            f"{name} must be an integer number of samples, got {value!r}"
        ) from None
    if number < 0:
        raise InfeasibleError(f"{name} is {number}; it must be >= 0 samples")
    return number


def _water_level(sorted_desc: FloatArray, units: int, floor: int) -> float:
    """Return t with sum_i max(0, t v_i - floor) = units (speeds sorted descending)."""
    active = np.arange(1, sorted_desc.size + 1, dtype=np.float64)
    return float(np.min((units + floor * active) / np.cumsum(sorted_desc)))


def _select_units(speeds: FloatArray, units: int, minimum: int) -> IntArray:
    """Return B_i = minimum + (elements of worker i among the `units` smallest)."""
    sorted_desc = np.sort(speeds)[::-1]
    t_low = _water_level(sorted_desc, units, minimum) * (1 - _LEVEL_MARGIN)
    t_high = _water_level(sorted_desc, units, minimum + 1) * (1 + _LEVEL_MARGIN)
    # Elements k <= below[i] are certainly < t*; elements k > above[i] certainly > t*.
    below = np.maximum(minimum, np.floor(t_low * speeds).astype(np.int64) - 1)
    above = np.maximum(minimum, np.ceil(t_high * speeds).astype(np.int64) + 1)
    wanted = units - int((below - minimum).sum())
    counts = above - below
    owner = np.repeat(np.arange(speeds.size, dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    k = below[owner] + 1 + (np.arange(owner.size, dtype=np.int64) - starts[owner])
    values = k / speeds[owner]
    if not 1 <= wanted <= values.size:
        raise RuntimeError(  # pragma: no cover - guards the proof, never expected
            f"batch solver bug: window holds {values.size} elements, need #{wanted}"
        )
    pivot = float(np.partition(values, wanted - 1)[wanted - 1])
    # Monotone rounding: a float strictly below the pivot is exactly below every
    # element that rounds to the pivot; only the latter need exact ranking.
    surely_below = values < pivot
    near_index = np.flatnonzero(values == pivot)
    chosen_near = near_index[_exact_order(k[near_index], speeds, owner[near_index])]
    chosen_near = chosen_near[: wanted - int(surely_below.sum())]
    taken = np.bincount(owner[surely_below], minlength=speeds.size)
    taken += np.bincount(owner[chosen_near], minlength=speeds.size)
    sizes: IntArray = below + taken
    return sizes


def _exact_order(k: IntArray, speeds: FloatArray, owner: IntArray) -> IntArray:
    """Return the permutation sorting elements by exact (k / v_owner, owner)."""
    pairs = np.stack([k, speeds[owner].view(np.int64)], axis=1)
    distinct, inverse = np.unique(pairs, axis=0, return_inverse=True)
    exact = [
        Fraction(int(count)) / Fraction(float(speed))
        for count, speed in zip(distinct[:, 0], distinct[:, 1].copy().view(np.float64), strict=True)
    ]
    ranks = np.empty(len(exact), dtype=np.int64)
    order = sorted(range(len(exact)), key=exact.__getitem__)
    rank = -1
    previous: Fraction | None = None
    for position in order:
        if exact[position] != previous:
            rank += 1
            previous = exact[position]
        ranks[position] = rank
    permutation: IntArray = np.lexsort((owner, ranks[inverse.reshape(-1)]))
    return permutation
