"""Exact AntDT-DD solver: batch size and gradient accumulation per device class (eq. 4).

Problem (AntDT §VI-B, eq. 4): ``k`` device series, series ``i`` has ``n_i`` devices of
throughput ``v_i`` samples/s; find integers ``B_i`` (micro-batch) and ``C_i``
(accumulation passes) per series that::

    minimise    z = max_i C_i B_i / v_i
    subject to  sum_i n_i C_i B_i = B,  Bmin_i <= B_i <= Bmax_i,  Cmin <= C_i <= Cmax

``Bmin_i`` is the saturation point, ``Bmax_i`` the memory limit; ``Cmin``/``Cmax``
are shared (defaults 1, 5).  The typeset eq. 4 swaps the subscripts of min and max
and sums to ``n``; with ``B_i, C_i`` per series and the factor ``n_i`` this is the
consistent reading.  A series shares ``B_i, C_i`` as in the paper;
:func:`solve_dd_workers` makes each worker a series of one.

Only ``w_i = C_i B_i`` enters: pick ``w_i`` in ``W_i = {c b : Cmin <= c <= Cmax,
Bmin_i <= b <= Bmax_i}`` with ``sum n_i w_i = B`` minimising ``max w_i / v_i``.
That is weakly NP-hard (``W_i = {1, 2}``, ``n_i = a_i`` is subset sum), so an exact
method is pseudo-polynomial in the worst case; ours only in the slack below.

Exact window test.  For windows ``lo_i <= w_i <= hi_i`` let ``top_i`` (``bot_i``)
be the largest (smallest) element of ``W_i`` in the window.  The solutions are
exactly ``top`` minus removals ``n_i (top_i - w_i)`` summing to ``D = sum n_i top_i
- B``, or ``bot`` plus additions summing to ``E = B - sum n_i bot_i``; we take the
smaller slack.  Per ``c`` a class's offsets form an arithmetic progression.  A
subset-sum DP adds the classes last to first, keeping the reachable set as a solid
prefix ``[0, base)`` plus a Python-int bitset above it (sums of flexible classes
fill in, so the bitset stays narrow), offsets divided by their gcd; a progression
of length ``L`` costs ``O(log L)`` shift-ors.  Complete, hence exact.

Exact search.  ``z*`` is a candidate time ``w / v_i``.  "Feasible with every
``w_i / v_i <= t``" is monotone in ``t``, changes only at candidates, and is the
window test with ``hi_i`` the largest integer whose time is ``<= t``.  From the
continuous water level (below it even ``sum n_i top_i < B``) we gallop up, then
bisect on the integer order of positive floats, snapping probes to candidates
(``O(k)`` numpy), until no candidate lies strictly between the last infeasible probe
and the best feasible one, which is then optimal: no candidate is skipped.

Tie-break among optimal solutions (deterministic): 1. minimum makespan ``z*``;
2. then the latest earliest finish ``min_i w_i / v_i`` (least idle time at the
barrier; the same search downwards on windows ``lo_i``); 3. then the
lexicographically largest ``(w_1, ..., w_k)``: earlier series keep the larger share,
as eq. 3's solver gives ties to the lowest rank (walking forward, each class takes
the least removal / largest addition whose remainder the later classes can still
make, read off a bit-reversed suffix set); 4. ``C_i`` is the smallest count with
``w_i = C_i B_i`` in bounds: fewest passes, largest micro-batch (the linear model
rates them equal; devices pay per pass).  Equal speeds give the even split, up to
the granularity of ``W_i``.

Floating point.  Times are the correctly rounded ``w / v_i`` (speeds scaled by an
exact power of two).  Rounding is monotone, so each window bound is an exact integer
threshold (``floor(t v)`` corrected by +-1 with the division itself) and the search
finds ``fl(z*)`` exactly; distinct exact times that round to that float are then
ranked with :class:`fractions.Fraction` (``w <= 2**40`` leaves one integer per float
time and series, so at most one element per series, usually none).

Cost.  A probe is ``O(k (Cmax - Cmin + 1))`` numpy plus a DP that is short near the
optimum; up to about 15 probes per step.  Median CPU time with Cmax = 5 and about
64 samples per device: 1,000 workers in 3-4 series 1.4-16 ms, 1,000 workers of
distinct speeds 7-21 ms (wall time up to 3x that on a 2-core box at load 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dtlaunch.solvers.batch import MAX_SPEED_RATIO, InfeasibleError

__all__ = ["MAX_CLASSES", "MAX_GLOBAL_BATCH", "DDPlan", "DeviceClass", "InfeasibleError"]
__all__ += ["dd_makespan", "solve_dd", "solve_dd_workers"]

MAX_GLOBAL_BATCH = 2**40  # each float time w / v then holds one integer w per series
MAX_CLASSES = 2**22  # keeps every sum_i n_i w_i below 2**63

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Runs = list[tuple[int, int, int]]  # offset progressions (first, step, length)
Sets = dict[int, tuple[int, int]]  # class -> reachable set [0, base) | base + bits
Probe = Callable[[int], bool]
Check = Callable[[npt.NDArray[np.int64]], bool]
Step = Callable[[int], int | None]
_NONE = np.iinfo(np.int64).max
_NAMES = ("min_batch", "max_batch", "count")
_SCALARS = ("global_batch", "min_accumulation", "max_accumulation")


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """One device series of eq. 4: ``count`` devices of equal speed and memory."""

    throughput: float  # v_i: samples/s of one device (linear above saturation)
    min_batch: int  # Bmin_i: the saturation point, the smallest useful micro-batch
    max_batch: int  # Bmax_i: the largest micro-batch that fits in memory
    count: int = 1  # n_i: devices in the series, all given the same B_i and C_i


@dataclass(frozen=True, slots=True)
class DDPlan:
    """Solution of eq. 4, one entry per input series in input order."""

    batch_sizes: tuple[int, ...]  # B_i: micro-batch per pass
    accumulations: tuple[int, ...]  # C_i: passes per optimizer step
    counts: tuple[int, ...]  # n_i
    step_times: tuple[float, ...]  # C_i B_i / v_i seconds
    global_batch: int  # B = sum_i n_i C_i B_i
    makespan: float  # max_i C_i B_i / v_i: the minimised objective
    earliest_finish: float  # min_i C_i B_i / v_i: maximised among optimal plans

    def worker_batch_sizes(self) -> list[int]:
        """``B_i`` per worker: the series in order, each repeated ``count`` times."""
        return [b for b, n in zip(self.batch_sizes, self.counts, strict=True) for _ in range(n)]

    def worker_accumulations(self) -> list[int]:
        """``C_i`` per worker, in the order of :meth:`worker_batch_sizes`."""
        return [c for c, n in zip(self.accumulations, self.counts, strict=True) for _ in range(n)]


def solve_dd(
    classes: Sequence[DeviceClass],
    global_batch: int,
    *,
    min_accumulation: int = 1,
    max_accumulation: int = 5,
) -> DDPlan:
    """Return the exact optimum of AntDT eq. 4, tie-broken as the module docs say.

    Raises:
        InfeasibleError: no integers meet the constraints (the message names the
            binding bound and how to relax it), or an input is invalid.
    """
    if not classes or not all(isinstance(cls, DeviceClass) for cls in classes):
        raise InfeasibleError("classes must be a non-empty sequence of DeviceClass")
    fields = ((c.throughput, c.min_batch, c.max_batch, c.count) for c in classes)
    columns = list(zip(*fields, strict=True))
    return _Problem(columns, global_batch, min_accumulation, max_accumulation).solve()


def solve_dd_workers(
    throughputs: Sequence[float],
    min_batch: int | Sequence[int],
    max_batch: int | Sequence[int],
    global_batch: int,
    *,
    min_accumulation: int = 1,
    max_accumulation: int = 5,
) -> DDPlan:
    """Solve eq. 4 with every worker a series of its own (``count = 1``), in worker order.

    ``min_batch`` and ``max_batch`` are one value for all workers or one per worker.
    Each worker then chooses alone: never a worse makespan than tying equal workers.
    """
    n = len(throughputs)
    lows = np.full(n, min_batch) if np.ndim(min_batch) == 0 else min_batch
    highs = np.full(n, max_batch) if np.ndim(max_batch) == 0 else max_batch
    columns = [throughputs, lows, highs, np.ones(n, dtype=np.int64)]
    return _Problem(columns, global_batch, min_accumulation, max_accumulation).solve()


def dd_makespan(
    classes: Sequence[DeviceClass], batch_sizes: Sequence[int], accumulations: Sequence[int]
) -> float:
    """Return eq. 4's objective ``max_i C_i B_i / v_i`` for per-series ``B_i`` and ``C_i``."""
    if not len(classes) == len(batch_sizes) == len(accumulations) > 0:
        raise InfeasibleError("pass one batch size and one accumulation count per class")
    pairs = zip(classes, batch_sizes, accumulations, strict=True)
    return max(float(c * b / cls.throughput) for cls, b, c in pairs)


def _ints(name: str, values: object) -> IntArray:
    array = np.asarray(values)
    if array.dtype.kind not in "iu" or array.ndim > 1:
        raise InfeasibleError(f"{name} must be integers, got {values!r:.80}")
    if (bad := np.flatnonzero((array < 1) | (array > MAX_GLOBAL_BATCH))).size:
        where = f" of class {bad[0]}" if array.ndim else ""
        raise InfeasibleError(
            f"{name}{where} is {array.reshape(-1)[bad[0]]}; it must be 1 to {MAX_GLOBAL_BATCH}"
        )
    return array.astype(np.int64)


def _speeds(throughputs: object) -> FloatArray:
    try:
        speeds = np.asarray(throughputs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InfeasibleError(f"throughputs must be numbers (samples/s): {exc}") from None
    if speeds.ndim != 1 or not 1 <= speeds.size <= MAX_CLASSES:
        raise InfeasibleError(f"pass a flat list of 1 to {MAX_CLASSES} throughputs, one per class")
    if (bad := np.flatnonzero(~(np.isfinite(speeds) & (speeds > 0)))).size:
        raise InfeasibleError(
            f"throughput of class {bad[0]} is {speeds[bad[0]]!r}; every throughput must be a "
            "finite number > 0 samples/s (re-measure it or leave the device out)"
        )
    if not float(speeds.max()) / float(speeds.min()) <= MAX_SPEED_RATIO:
        raise InfeasibleError(
            f"fastest/slowest throughput ratio exceeds {MAX_SPEED_RATIO:g}; "
            "the measurements are broken, leave the stalled device out"
        )
    return speeds


def _check(ok: bool, what: str) -> None:
    if not ok:  # pragma: no cover - guards the proof, never expected
        raise RuntimeError(f"dd solver bug: {what}; please report it")


def _spread(bits: int, step: int, length: int, mask: int) -> int:
    """Return OR_{t < length} (bits << t*step), masked: O(log length) shift-ors."""
    have = 1
    while have < length:
        take = min(have, length - have)
        bits = (bits | bits << (take * step)) & mask
        have += take
    return bits


def _shift(bits: int, base: int, by: int) -> int:
    """Window bits of ([0, base) + window) + by: the solid part lands on [by, by + base)."""
    return bits << by | ((1 << by) - 1) ^ ((1 << max(0, by - base)) - 1)


def _grow(base: int, bits: int, runs: Runs, target: int) -> tuple[int, int]:
    """Sumset of the set [0, base) | base + bits with {0} and the runs, up to target."""
    mask = (1 << (target - base + 1)) - 1
    grown = bits
    for first, step, length in runs:
        spread, have = bits, 1
        while have < length:  # {0, step, ...}: doubling, each copy keeps its solid part
            take = min(have, length - have)
            spread = (spread | _shift(spread, base, take * step)) & mask
            have += take
        grown |= _shift(spread, base, first) & mask
    ones = ((grown + 1) & -(grown + 1)).bit_length() - 1  # trailing ones join the prefix
    return base + ones, grown >> ones


def _pick(runs: Runs, base: int, bits: int, left: int, smallest: bool) -> int:
    """The smallest (else largest) option x with left - x in [0, base) | base + bits."""
    best: list[int] = []
    edge = left - base  # options above edge leave a remainder in the solid part
    for first, step, length in [(0, 1, 1), *runs]:
        low, high = max(first, edge + 1), min(first + (length - 1) * step, left)
        x = first + (-(-(low - first) // step) if smallest else (high - first) // step) * step
        best += [x] if low <= x <= high else []
    if bits and edge >= 0 and (smallest or not best):
        width, options = edge + 1, 0
        for first, step, length in [(0, 1, 1), *runs]:
            if first <= edge:
                options |= _spread(1 << first, step, length, (1 << width) - 1)
        # Bit x of the mirror is bit edge - x of `bits`: the remainder base + edge - x.
        fits = options & int(format(bits & ((1 << width) - 1), f"0{width}b")[::-1], 2)
        if fits:
            best.append((fits & -fits).bit_length() - 1 if smallest else fits.bit_length() - 1)
    return min(best) if smallest else max(best)


def _key(time: float) -> int:
    """Order-preserving integer of a positive float: its bit pattern."""
    return int(np.float64(time).view(np.int64))


def _time(key: int) -> float:
    return float(np.int64(key).view(np.float64))


class _Problem:
    """Eq. 4 on validated arrays (module docs); speeds scaled by an exact power of two."""

    __slots__ = ("bmax", "bmin", "c", "n", "scale", "total", "v", "wmax", "zero")

    def __init__(self, columns: Sequence[object], total: int, cmin: int, cmax: int) -> None:
        speeds = _speeds(columns[0])
        bmin, bmax, n = (_ints(name, v) for name, v in zip(_NAMES, columns[1:], strict=True))
        scalars = zip(_SCALARS, (total, cmin, cmax), strict=True)
        total, cmin, cmax = (int(_ints(name, v)) for name, v in scalars)
        if not bmin.shape == bmax.shape == n.shape == speeds.shape:
            raise InfeasibleError("pass one throughput, min_batch, max_batch and count per class")
        if cmin > cmax:
            raise InfeasibleError(f"min_accumulation {cmin} exceeds max_accumulation {cmax}")
        if (bad := np.flatnonzero(bmin > bmax)).size:
            raise InfeasibleError(
                f"class {bad[0]}: min_batch {bmin[bad[0]]} exceeds max_batch {bmax[bad[0]]}; "
                "the saturation point must fit in memory (lower min_batch or drop the device)"
            )
        # The smallest and largest steps, clipped near B so that int64 cannot overflow.
        least = cmin * np.minimum(bmin, total // cmin + 1)
        if int(np.minimum(np.minimum(n, total // least + 1) * least, total + 1).sum()) > total:
            smallest = sum(int(a) * int(b) for a, b in zip(n, bmin, strict=True)) * cmin
            raise InfeasibleError(
                f"global batch {total} is below the smallest step sum_i n_i*Cmin*Bmin_i = "
                f"{smallest}; raise the global batch to at least {smallest}, or lower "
                "min_batch (saturation points) or min_accumulation"
            )
        most = np.where(bmax > total // cmax, total, cmax * np.minimum(bmax, total // cmax))
        most = np.where(most > total // n, total, n * np.minimum(most, total // n))
        if (largest := int(most.sum())) < total:
            raise InfeasibleError(
                f"global batch {total} exceeds the largest step sum_i n_i*Cmax*Bmax_i = "
                f"{largest}; raise max_accumulation (to about {-(-total * cmax // largest)}) "
                f"or max_batch, or lower the global batch to at most {largest}"
            )
        self.scale = int(np.frexp(speeds.max())[1])
        self.v: FloatArray = np.ldexp(speeds, -self.scale)
        self.n, self.total = n, total
        self.bmin, self.bmax = bmin[:, None], np.minimum(bmax, total)[:, None]
        cmax = min(cmax, int((total // (n * bmin)).max()))  # useful: c Bmin_i <= B / n_i
        self.c: IntArray = np.arange(cmin, cmax + 1, dtype=np.int64)
        self.zero: IntArray = np.zeros(n.size, dtype=np.int64)
        self.wmax = self.top(self.zero, total // n)  # non-empty: the smallest step fits

    def top(self, lo: IntArray, hi: IntArray) -> IntArray:
        """Largest element of W_i in [lo_i, hi_i] per class, -1 where none."""
        b = np.minimum(self.bmax, hi[:, None] // self.c)
        w = b * self.c
        best: IntArray = np.where((b >= self.bmin) & (w >= lo[:, None]), w, -1).max(axis=1)
        return best

    def bottom(self, lo: IntArray, hi: IntArray) -> IntArray:
        """Smallest element of W_i in [lo_i, hi_i] per class, -1 where none."""
        b = np.maximum(self.bmin, -(-lo[:, None] // self.c))
        w = b * self.c
        w = np.where((b <= self.bmax) & (w <= hi[:, None]), w, _NONE).min(axis=1)
        return np.where(w == _NONE, -1, w)

    def caps(self, t: float) -> IntArray:
        """Largest integer w <= wmax_i whose time fl(w / v_i) is <= t, per class."""
        v = self.v
        u = np.minimum(np.floor(t * v), self.wmax).astype(np.int64)
        while True:  # floor(t * v) can be one off; the division itself decides
            over = (u > 0) & (u / v > t)
            under = (u < self.wmax) & ((u + 1) / v <= t)
            if not (over.any() or under.any()):
                return u
            u = u - over + under

    def floors(self, t: float) -> IntArray:
        """Smallest integer w whose time is >= t, per class (wmax_i + 1 if none)."""
        return self.caps(float(np.nextafter(t, 0.0))) + 1

    def extreme(self, w: IntArray, largest: bool) -> int | None:
        """Key of the largest (else smallest) time w_i / v_i over the classes with w_i >= 0."""
        ok = w >= 0
        times = w[ok] / self.v[ok]
        return _key(float(times.max() if largest else times.min())) if times.size else None

    def water(self, bound: IntArray, below: bool) -> float:
        """The t with sum_i n_i min(bound_i, t v_i) = B (below), else with max for min."""
        order = np.argsort(bound / self.v)
        fixed, rate = (self.n * bound)[order], (self.n * self.v)[order]
        held, done = np.cumsum(fixed), np.cumsum(rate)  # the classes up to j in `order`
        if below:  # the classes before j sit at their bound, the rest at t v_i
            return float(np.max((self.total - held + fixed) / (done[-1] - done + rate)))
        return float(np.min((self.total - held[-1] + held) / done))  # after j at their bound

    def runs(
        self, lo: IntArray, hi: IntArray, origin: IntArray, target: int, down: bool
    ) -> tuple[list[int], Callable[[int], Runs], list[int], list[int], int]:
        """Options as offsets n_i |w - origin_i| <= target: progressions per c.

        Returns the classes with an option besides 0 (last first), a getter of their
        runs, per class the largest first or step (`need`) and offset (`far`), in units
        of the offsets' gcd.  Solid [0, base) with need <= base grows to [0, base + far).
        """
        n, c = self.n[:, None], self.c
        near = (origin - target // self.n if down else origin + target // self.n)[:, None]
        if down:
            b_hi = np.minimum(self.bmax, origin[:, None] // c)
            b_lo = np.maximum(self.bmin, -(-np.maximum(lo[:, None], near) // c))
            first = n * (origin[:, None] - c * b_hi)
        else:
            b_lo = np.maximum(self.bmin, -(-origin[:, None] // c))
            b_hi = np.minimum(self.bmax, np.minimum(hi[:, None], near) // c)
            first = n * (c * b_lo - origin[:, None])
        length = b_hi - b_lo + 1
        step = np.broadcast_to(n * c, first.shape)
        live = (length > 0) & ((first > 0) | (length > 1))
        unit = max(1, int(np.gcd.reduce(np.concatenate((first[live], step[live & (length > 1)])))))
        first, step = first // unit, np.where(length > 1, step // unit, 1)  # 1: unused
        need = np.where(live, np.maximum(first, np.where(length > 1, step, 0)), 0).max(axis=1)
        far = np.where(live, first + (length - 1) * step, 0).max(axis=1)
        rows = np.flatnonzero(live.any(axis=1))[::-1]

        def get(i: int) -> Runs:
            row = zip(first[i].tolist(), step[i].tolist(), length[i].tolist(), strict=True)
            return [run for run, ok in zip(row, live[i].tolist(), strict=True) if ok]

        return rows.tolist(), get, need.tolist(), far.tolist(), unit

    def reach(
        self, lo: IntArray, hi: IntArray, origin: IntArray, target: int, down: bool, stop: int
    ) -> tuple[int, int, int, Sets, list[int], Callable[[int], Runs]]:
        """Reachable offset sums in [0, target] (in units), classes added last first.

        Stops once target is reachable (stop=1), all of [0, target] is (2) or never (0).
        Returns the unit, the set, the set before each added class, rows and runs.
        """
        rows, get, need, far, unit = self.runs(lo, hi, origin, target, down)
        goal, off = divmod(target, unit)
        base, bits, before = 1, 0, {}  # {0}
        for i in rows if stop == 0 or not off else ():
            before[i] = (base, bits)
            if not bits and need[i] <= base:
                base += far[i]
            else:
                base, bits = _grow(base, bits, get(i), goal)
            if goal < base or (stop == 1 and bits >> (goal - base) & 1):
                break
        return unit, base, bits, before, rows, get

    def reduce(self, lo: IntArray, hi: IntArray, choose: bool = False) -> IntArray | None:
        """The exact window test: a feasible w (the tie-break one if `choose`) or None."""
        top, bottom = self.top(lo, hi), self.bottom(lo, hi)
        if (top < 0).any():
            return None
        excess = int((self.n * top).sum()) - self.total
        short = self.total - int((self.n * bottom).sum())
        if excess <= 0 or short <= 0:
            return top if excess == 0 else bottom if short == 0 else None
        down = excess <= short  # remove from the tops or add to the bottoms
        origin, target = (top, excess) if down else (bottom, short)
        stop = 1 + (choose and not down)
        unit, base, bits, before, rows, get = self.reach(lo, hi, origin, target, down, stop)
        goal, off = divmod(target, unit)
        if off or not (goal < base or bits >> (goal - base) & 1):
            return None
        if not choose:
            return top
        # Lexicographically largest w: forward, each class takes the least removal (the
        # largest addition) whose remainder the later classes can still make.
        work, left = origin.copy(), goal
        for i in reversed(rows):
            if i in before or not down:
                base, bits = before.get(i, (goal + 1, 0))  # not added: all reachable
                x = _pick(get(i), base, bits, left, smallest=down)
                work[i] += (-x if down else x) * unit // int(self.n[i])
                left -= x
                if not left:
                    break
        _check(left == 0, "the reduction walk did not end at zero")
        return work

    def solve(self) -> DDPlan:
        hi = self._min_makespan()
        work = self.reduce(self._max_earliest(hi), hi, choose=True)
        if work is None:  # pragma: no cover - guards the proof, never expected
            raise RuntimeError("dd solver bug: the optimal windows are infeasible")
        c = self.c
        fits = (work[:, None] % c == 0) & (work[:, None] // c >= self.bmin)
        fits &= work[:, None] // c <= self.bmax
        _check(bool(fits.any(axis=1).all()), "a class's work has no batch size in bounds")
        _check(int((self.n * work).sum()) == self.total, "the steps do not sum to B")
        accumulation = c[fits.argmax(axis=1)]  # the smallest count that fits
        times = np.ldexp(work / self.v, -self.scale)
        b, a, n, t = (
            tuple(x.tolist()) for x in (work // accumulation, accumulation, self.n, times)
        )
        return DDPlan(b, a, n, t, self.total, float(times.max()), float(times.min()))

    def _min_makespan(self) -> IntArray:
        """Exact windows hi_i = the largest w_i with w_i / v_i <= z* (step 1)."""
        v, wmax, zero = self.v, self.wmax, self.zero
        level = self.water(wmax, below=True)  # below it even the capacity is short of B
        least = float(np.max(self.bottom(zero, wmax) / v))  # below, some class is empty
        best = _smallest_true(
            lambda key: self.reduce(zero, self.caps(_time(key))) is not None,
            max(_key(level * (1 - 1e-9)), _key(least) - 1),
            _key(float(np.max(wmax / v))),
            _key(level * (1 + float(self.n.sum()) / self.total)) - _key(level),
            lambda key: self.extreme(self.top(zero, self.caps(_time(key))), largest=True),
            lambda key: self.extreme(self.bottom(self.caps(_time(key)) + 1, wmax), largest=False),
        )
        if best is None:
            raise self._unreachable()
        caps = self.caps(_time(best))
        tied = np.flatnonzero(caps / v == _time(best))
        return self._exact(caps, tied, True, lambda hi: self.reduce(zero, hi) is not None)

    def _max_earliest(self, hi: IntArray) -> IntArray:
        """Exact windows lo_i for the latest earliest finish within hi (step 2).

        Keys are negated, so that the latest feasible time is the smallest key.
        """
        zero, least = self.zero, self.bottom(self.zero, hi)
        level = self.water(least, below=False)  # above it the least work exceeds B
        first = _key(float(np.min(self.top(zero, hi) / self.v)))  # no later earliest finish

        def snap(key: int) -> int | None:  # the earliest time >= time(-key)
            found = self.extreme(self.bottom(self.floors(_time(-key)), hi), largest=False)
            return None if found is None else -found

        def after(key: int) -> int | None:  # the latest time < time(-key)
            below = np.minimum(hi, self.floors(_time(-key)) - 1)
            found = self.extreme(self.top(zero, below), largest=True)
            return None if found is None else -found

        best = _smallest_true(
            lambda key: self.reduce(self.floors(_time(-key)), hi) is not None,
            max(-first - 1, -_key(level * (1 + 1e-9))),
            -_key(float(np.min(least / self.v))),
            _key(level) - _key(level * (1 - float(self.n.sum()) / self.total)),
            snap,
            after,
        )
        if best is None:  # pragma: no cover - the windows hi are feasible
            raise RuntimeError("dd solver bug: no earliest finish at the optimum")
        floors = self.floors(_time(-best))
        tied = np.flatnonzero(floors / self.v == _time(-best))
        return self._exact(floors, tied, False, lambda lo: self.reduce(lo, hi) is not None)

    def _exact(self, bound: IntArray, tied: IntArray, upper: bool, feasible: Check) -> IntArray:
        """Rank exactly the distinct times that share the optimal float time."""
        index = tied.tolist()
        if len({(int(bound[i]), float(self.v[i])) for i in index}) <= 1:
            return bound
        exact = [Fraction(int(bound[i])) / Fraction(float(self.v[i])) for i in index]

        def window(limit: Fraction) -> IntArray:  # drop the tied elements beyond limit
            out = bound.copy()
            for i, value in zip(index, exact, strict=True):
                out[i] += (-1 if value > limit else 0) if upper else (value < limit)
            return out

        values = sorted(set(exact), reverse=not upper)  # the best limit first
        low, high = 0, len(values) - 1  # values[-1] admits all: the float optimum
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if feasible(window(values[middle])) else (middle + 1, high)
        return window(values[high])

    def _unreachable(self) -> InfeasibleError:
        """Explain why no choice sums to exactly B (the step bounds already hold)."""
        gcd, spread = 0, math.gcd(*self.c.tolist())
        for count, low, high in zip(self.n, self.bmin[:, 0], self.bmax[:, 0], strict=True):
            gcd = math.gcd(gcd, int(count) * spread * (1 if high > low else int(low)))
        if self.total % gcd:
            return InfeasibleError(
                f"global batch {self.total} is not reachable: every step has a multiple of "
                f"{gcd} samples (device counts x accumulation x batch sizes); use a multiple "
                f"of {gcd}, e.g. {self.total // gcd * gcd} or {(self.total // gcd + 1) * gcd}, "
                "or widen the batch and accumulation bounds"
            )
        # All removals from the largest steps (no early exit): the reachable totals.
        highest = int((self.n * self.wmax).sum())
        excess, near = highest - self.total, [highest]  # excess < 0: w <= B / n_i binds
        if excess > 0:
            limit = highest - int((self.n * self.bottom(self.zero, self.wmax)).sum())
            unit, base, bits, *_ = self.reach(self.zero, self.wmax, self.wmax, limit, True, 0)
            # Removals are unit * ([0, base) | base + bits); total = highest - removal.
            fewer, more = (excess - 1) // unit, excess // unit + 1  # around B, in units
            rest = bits >> (more - base) if more >= base else 1
            below = (bits & ((1 << max(0, fewer - base + 1)) - 1)).bit_length() - 1
            most = fewer if fewer < base else base + below if below >= 0 else base - 1
            near = [highest - unit * most]  # the largest removal under excess: above B
            if rest:  # the least removal over excess: below B
                near.insert(0, highest - unit * (more + (rest & -rest).bit_length() - 1))
        return InfeasibleError(
            f"no batch sizes and accumulation counts within the bounds sum to exactly "
            f"{self.total} samples; the nearest reachable global batches are "
            f"{' and '.join(map(str, near))}: use one of them or widen the bounds"
        )


def _smallest_true(
    feasible: Probe, bad: int, last: int, jump: int, snap: Step, after: Step
) -> int | None:
    """Smallest candidate key at which the monotone `feasible` holds, or None.

    `feasible` is false at every candidate <= `bad`; `last` is the largest candidate;
    `snap(m)` is the largest candidate <= m and `after(x)` the smallest one > x.
    Gallops up from `bad` by `jump`, 2 `jump`, ..., then bisects.
    """
    base, probe = bad, after(bad)
    while probe is not None and not feasible(probe):
        if probe >= last:
            return None
        bad = probe
        target = bad + max(bad - base, jump)
        probe = last if target >= last else snap(target)
        probe = after(bad) if probe is None or probe <= bad else probe
    if probe is None:
        return None
    good = probe
    while (nearest := after(bad)) is not None and nearest < good:
        middle = bad + (good - bad) // 2
        probe = nearest if nearest > middle else snap(middle)
        if probe is None or not bad < probe < good:  # pragma: no cover
            raise RuntimeError("dd solver bug: the bisection lost its bracket")
        if feasible(probe):
            good = probe
        else:
            bad = max(probe, middle)
    return good
