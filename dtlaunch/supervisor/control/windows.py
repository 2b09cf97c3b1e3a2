"""The Monitor's storage (AntDT §V-D windows): columnar step reports with prefix sums.

Why: the supervisor takes a snapshot on its event loop at every policy decision.
With 1,000 workers at 10 steps/s and a 300 s long window that is 3,000,000
reports; re-reading them all in Python took seconds and left heartbeats
unanswered. Here each worker keeps its steps in numpy columns with running
(prefix) sums, so a window's statistics cost O(1) per worker once its bounds are
found by binary search on time. What the numbers mean is the Monitor's business
(its module doc); this module only has to give the same numbers as a plain loop
over the window's reports, up to float rounding.

Per worker:

- the *full* sequence: every report's time in arrival order, and whether it
  counts (``reads_records`` workers' empty steps do not). Pruning runs on it,
  exactly as on a plain list of all reports: drop from the left while older
  than the long window;
- the *counted* steps: raw columns and prefix sums of what the window
  statistics add up, plus the rows where a regime changes, where the batch size
  changes and where time goes backwards;
- in PS mode, each step's (server, comm seconds) pairs;
- ``size_changes`` (``steptimes.SizeChanges``): the time per record measured
  at each change of the batch size, fed every counted step; it outlives the
  windows (and the compaction of the rows).

Reports normally arrive in time order per worker, so a window is one run of
rows. If they do not (the caller derives times from the worker's report ages),
that worker's windows are selected by mask and computed with numpy instead.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dtlaunch.supervisor.control.steptimes import (
    MIN_FIT_SPREAD,
    SizeChanges,
    regime_flags,
    regime_starts,
)

Floats = npt.NDArray[np.float64]

# A step reported as taking 0 s (coarse clock) would make B/T infinite.
MIN_BPT_S = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowStats:
    """One node over one time window (only nodes with >= 1 report in it)."""

    reports: int
    first_s: float  # time of the oldest report in the window
    last_s: float  # time of the newest report in the window
    mean_bpt: float  # workers: mean compute+comm; servers: mean update time
    mean_bpt_eq: float  # workers: equal-share BPT (module doc); servers: = mean_bpt
    throughput: float  # workers: v_i in samples/s (mean of B/T); servers: 0.0
    samples: int  # samples reported in the window (0 for servers)
    # Workers whose window holds steps of different batch sizes: the least-squares
    # line BPT = fixed_s + per_sample_s x B (both >= 0), else None (see step_model).
    fixed_s: float | None = None
    per_sample_s: float | None = None
    line: str | None = None  # where the line comes from: "fit", "peers" (None: no line)
    mean_batch: float = 0.0  # mean records per step (see _WorkerReport.work)
    compute_per_sample_s: float = 0.0  # mean compute_s / B (communication left out)
    # The sample standard deviation of BPT over the window's steps (0: one step):
    # how far the mean can be trusted (the Balancer's noise test).
    sd_bpt: float = 0.0

    @property
    def span_s(self) -> float:
        """Time covered by the window's reports (newest minus oldest)."""
        return self.last_s - self.first_s


Line = tuple[float | None, float | None]
_EPS = 2.0**-52


def fit_centered(work: Floats, bpt: Floats) -> Line:
    """``step_model``'s least-squares line, computed as it defines it: centred on
    the means, each sum added up left to right (as ``sum`` does).

    The line is the best one with both parts >= 0 (constrained least squares):
    where the free fit's slope is <= 0 the best is flat at the mean (a step
    that does not grow with its batch: a fixed cost, or noise larger than the
    batch's effect), where its intercept is < 0 the best runs through the
    origin. Why not "no line" there: the caller then assumed a step time
    proportional to the batch, under which a fixed-cost worker looks slower per
    sample the less it carries, and each plan shrank it further, down to a
    batch of 1 (benchmarks/rna.py's random per-step delays: nd's plans chased
    them until the job diverged on its tail of tiny batches)."""
    n = len(work)
    if n < 2 or work.max() - work.min() < MIN_FIT_SPREAD * work.max():
        return None, None
    mean_b = float(np.cumsum(work)[-1]) / n
    mean_t = float(np.cumsum(bpt)[-1]) / n
    dev = work - mean_b
    sxx = float(np.cumsum(dev * dev)[-1])
    slope = float(np.cumsum(dev * (bpt - mean_t))[-1]) / sxx
    intercept = mean_t - slope * mean_b
    if slope <= 0:
        return mean_t, 0.0
    if intercept < 0:
        return 0.0, float(np.cumsum(work * bpt)[-1]) / float(np.cumsum(work * work)[-1])
    return intercept, slope


def fit_from_sums(
    n: int, sum_b: float, sum_bb: float, sum_t: float, sum_bt: float, size_bt: float
) -> Line | None:
    """The same line from running sums (sizes are whole numbers, so ``sxx`` is
    exact), or None when their rounding could show in the 11th digit of the
    slope or the intercept (``size_bt``: the magnitude of the running sums that
    ``sum_bt`` is the difference of); then the caller centres the data."""
    mean_b, mean_t = sum_b / n, sum_t / n
    sb = round(sum_b)
    sxx = (n * round(sum_bb) - sb * sb) / n
    sxy = sum_bt - sum_b * mean_t
    error = 8 * _EPS * (size_bt + abs(sum_b * mean_t))
    slope = sxy / sxx
    intercept = mean_t - slope * mean_b
    if abs(sxy) * 1e-11 < error or abs(intercept) * 1e-11 < error / sxx * mean_b:
        return None
    if slope <= 0:
        return mean_t, 0.0
    if intercept < 0:
        return 0.0, sum_bt / sum_bb
    return intercept, slope


# Columns of WorkerSteps.rows, _COLS doubles per row: the raw step, then prefix
# sums up to and including the row (row 0 is all zeros, so a sum over rows
# [a, b) is rows[b-1] - rows[a-1]).
_C, _M, _W = 0, 1, 2  # compute_s, comm_s, work (records of the step)
_P0 = 3  # bpt, rate B/T, compute per sample, comm, work, work², work x bpt, bpt²
_SUMS = 8
_COLS = _P0 + _SUMS
_ZERO_ROW = (0.0,) * _COLS


class WorkerSteps:
    """One worker's reports (see module doc). ``reader``: empty steps do not count.

    The counted steps live in ``array('d')`` columns: appending one costs no
    numpy call; numpy reads them through ``np.frombuffer`` views that never
    outlive the method that makes them (an exported buffer cannot grow).
    """

    __slots__ = (
        "_comm",
        "_flags",
        "_full_base",
        "_full_counts",
        "_full_lo",
        "_full_t",
        "_r1",
        "_r2",
        "_runs",
        "_sums",
        "_tiny",
        "_turns",
        "lo",
        "reader",
        "rows",
        "size_changes",
        "t",
    )

    def __init__(self) -> None:
        self.reader = False
        self._full_t = array("d")  # every report's time, arrival order
        self._full_counts = bytearray()  # 1: counted (is a row of `rows`)
        self._full_lo = 0  # first unpruned report in _full_t
        self._full_base = 0  # reports deleted from the front of _full_t
        self._comm: dict[int, Series] = {}  # server -> (report, t, comm s) in PS mode
        self.size_changes = SizeChanges()  # the time per record at changes of size
        self._clear_rows()

    def _clear_rows(self) -> None:
        self.t = array("d", [0.0])  # row 0: the zero row
        self.rows = array("d", _ZERO_ROW)
        self.lo = 1  # first unpruned row
        # The last row's sums and the last two rows' (t, work, bpt), as Python
        # floats: an append reads no array.
        self._sums: tuple[float, ...] = _ZERO_ROW[_P0:]
        self._r1: tuple[float, float, float] | None = None
        self._r2: tuple[float, float, float] | None = None
        self._flags: list[int] = []  # rows where a regime starts (rising)
        self._runs: list[int] = []  # rows whose work differs from the row before
        self._turns: list[int] = []  # rows whose time is below the row before's
        self._tiny: list[int] = []  # rows whose equal-share BPT may hit MIN_BPT_S

    def _view(self) -> Floats:
        return np.frombuffer(self.rows, dtype=np.float64).reshape(-1, _COLS)

    # ----------------------------------------------------------------- input

    def add(
        self,
        t: float,
        compute_s: float,
        comm_s: float,
        work: int,
        *,
        counts: bool,
        servers: tuple[tuple[int, float], ...],
    ) -> None:
        """Append one report (``counts``: a step the window statistics use)."""
        if servers:
            index = self._full_base + len(self._full_t)
            for server, seconds in servers:
                self._comm.setdefault(server, Series()).add(index, t, seconds)
        self._full_t.append(t)
        self._full_counts.append(counts)
        if not counts:
            return
        n = len(self.t)
        bpt = max(compute_s + comm_s, MIN_BPT_S)
        cpw = compute_s / work
        if cpw + comm_s < MIN_BPT_S:
            self._tiny.append(n)
        prev, before, sums = self._r1, self._r2, self._sums
        if prev is not None:
            if not t >= prev[0]:  # NaN too: no binary search over it
                self._turns.append(n)
            if work != prev[1]:
                self._runs.append(n)
            if (
                before is not None
                and before[1] == prev[1]
                and regime_starts(before, prev, bpt / work)
            ):
                self._flags.append(n - 1)
        new_sums = (
            sums[0] + bpt,
            sums[1] + work / bpt,
            sums[2] + cpw,
            sums[3] + comm_s,
            sums[4] + work,
            sums[5] + work * work,
            sums[6] + work * bpt,
            sums[7] + bpt * bpt,
        )
        self.t.append(t)
        self.rows.extend((compute_s, comm_s, work, *new_sums))
        self._sums, self._r2, self._r1 = new_sums, prev, (t, work, bpt)
        self.size_changes.add(work, bpt)

    def become_reader(self) -> None:
        """The worker reported records: its earlier (empty) steps stop counting."""
        self.reader = True
        self._full_counts = bytearray(len(self._full_t))
        self.size_changes = SizeChanges()
        self._clear_rows()

    def prune(self, limit: float) -> None:
        """Forget reports older than ``limit``: from the left, while older (a
        report that arrived out of time order keeps the ones after it)."""
        full_t, i = self._full_t, self._full_lo
        if i >= len(full_t) or full_t[i] >= limit:
            return
        counts, end, dropped = self._full_counts, len(full_t), 0
        while i < end and full_t[i] < limit:
            dropped += counts[i]
            i += 1
        self._full_lo = i
        self.lo += dropped
        for series in self._comm.values():
            series.drop_before(self._full_base + i)
        if i * 2 > end:  # amortised: each report is moved at most once more
            del full_t[:i]
            del counts[:i]
            self._full_base += i
            self._full_lo = 0
        if self.lo > 64 and self.lo * 2 > len(self.t):
            self._rebuild()

    def _rebuild(self) -> None:
        # The unpruned rows move to the front and every derived column is
        # recomputed from them (which also keeps the prefix sums' rounding small).
        lo = self.lo
        view = self._view()
        t = np.frombuffer(self.t, dtype=np.float64)[lo:].copy()
        c, m, w = (view[lo:, k].copy() for k in (_C, _M, _W))
        del view
        self._clear_rows()
        count = len(t)
        if count == 0:
            return
        bpt = np.maximum(c + m, MIN_BPT_S)
        cpw = c / w
        rows = np.zeros((count + 1, _COLS))
        rows[1:, _C], rows[1:, _M], rows[1:, _W] = c, m, w
        for k, col in enumerate((bpt, w / bpt, cpw, m, w, w * w, w * bpt, bpt * bpt)):
            rows[1:, _P0 + k] = np.cumsum(col)
        self.t = array("d", [0.0])
        self.t.frombytes(t.tobytes())
        self.rows = array("d", rows.tobytes())
        self._flags = (1 + np.flatnonzero(regime_flags(w, bpt))).tolist()
        self._runs = (2 + np.flatnonzero(w[1:] != w[:-1])).tolist()
        self._turns = (2 + np.flatnonzero(~(t[1:] >= t[:-1]))).tolist()
        self._tiny = (1 + np.flatnonzero(cpw + m < MIN_BPT_S)).tolist()
        self._sums = tuple(rows[-1, _P0:].tolist())
        self._r1 = (float(t[-1]), float(w[-1]), float(bpt[-1]))
        if count > 1:
            self._r2 = (float(t[-2]), float(w[-2]), float(bpt[-2]))

    # ---------------------------------------------------------------- output

    def stats(self, start: float, end: float, b_ref: float, *, regimes: bool) -> WindowStats | None:
        """The counted steps with ``start <= t <= end`` (None: none), the short
        window's cut at the newest regime change when ``regimes``."""
        t, lo, n = self.t, self.lo, len(self.t)
        if lo >= n:
            return None
        turns = self._turns
        if turns and turns[-1] > lo:  # out of time order: no run of rows
            times = np.frombuffer(t, dtype=np.float64)[lo:]
            inside = lo + np.flatnonzero((times >= start) & (times <= end))
            return self._stats_of(inside, b_ref, regimes=regimes)
        a = lo if t[lo] >= start else bisect.bisect_left(t, start, lo, n)
        b = n if t[n - 1] <= end else bisect.bisect_right(t, end, a, n)
        if a >= b:
            return None
        if regimes and b - a >= 3:
            k = bisect.bisect_right(self._flags, b - 2) - 1
            if k >= 0 and self._flags[k] > a:
                a = self._flags[k]
        tiny = self._tiny
        if tiny and tiny[-1] >= a and tiny[bisect.bisect_left(tiny, a)] < b:
            return self._stats_of(np.arange(a, b), b_ref, regimes=False)
        rows, i, j = self.rows, (b - 1) * _COLS + _P0, (a - 1) * _COLS + _P0
        sums = []
        for x, y in zip(rows[i : i + _SUMS], rows[j : j + _SUMS], strict=True):
            if x > 1e3 * (x - y) and x != y:
                # The running sums dwarf the window's (an outlier step, say of
                # 0 s, before it): their difference would lose digits.
                return self._stats_of(np.arange(a, b), b_ref, regimes=False)
            sums.append(x - y)
        line: Line = (None, None)
        r0, r1 = bisect.bisect_right(self._runs, a), bisect.bisect_right(self._runs, b - 1)
        if r1 > r0:  # more than one batch size in the window
            line = self._line(a, b, sums, self._runs[r0:r1])
        eq_sum = b_ref * sums[2] + sums[3]
        return self._finish(b - a, t[a], t[b - 1], sums, eq_sum, line, b_ref)

    def _line(self, a: int, b: int, sums: list[float], runs: list[int]) -> Line:
        # step_model over rows [a, b): from the sums when they are precise enough.
        rows = self.rows
        if len(runs) <= 64:
            sizes = [rows[k * _COLS + _W] for k in (a, *runs)]  # each run's size
            b_min, b_max = min(sizes), max(sizes)
        else:
            work = self._view()[a:b, _W]
            b_min, b_max = float(work.min()), float(work.max())
            del work
        if b_max - b_min < MIN_FIT_SPREAD * b_max:
            return None, None
        size = abs(rows[(b - 1) * _COLS + _P0 + 6]) + abs(rows[(a - 1) * _COLS + _P0 + 6])
        line = None
        if rows[(b - 1) * _COLS + _P0 + 5] < 2.0**53:  # the sums of squared sizes are exact
            line = fit_from_sums(b - a, sums[4], sums[5], sums[0], sums[6], size)
        if line is None:
            view = self._view()[a:b]
            line = fit_centered(view[:, _W], np.maximum(view[:, _C] + view[:, _M], MIN_BPT_S))
        return line

    def _stats_of(
        self, rows_in: npt.NDArray[np.intp], b_ref: float, *, regimes: bool
    ) -> WindowStats | None:
        # The plain computation with numpy over the selected rows, in order.
        if len(rows_in) == 0:
            return None
        view = self._view()
        c, m, w = (view[rows_in, k] for k in (_C, _M, _W))
        bpt = np.maximum(c + m, MIN_BPT_S)
        if regimes:
            rise = np.flatnonzero(regime_flags(w, bpt))
            if len(rise):
                j = int(rise[-1])
                rows_in, c, m, w, bpt = rows_in[j:], c[j:], m[j:], w[j:], bpt[j:]
        sums = [float(x.sum()) for x in (bpt, w / bpt, c / w, m, w)]
        sums += [0.0, 0.0, float((bpt * bpt).sum())]  # (the line is fitted apart)
        eq_sum = float(np.maximum(c * b_ref / w + m, MIN_BPT_S).sum())
        first, last = self.t[int(rows_in[0])], self.t[int(rows_in[-1])]
        return self._finish(len(rows_in), first, last, sums, eq_sum, fit_centered(w, bpt), b_ref)

    def _finish(
        self,
        count: int,
        first: float,
        last: float,
        sums: list[float],
        eq_sum: float,
        line: Line,
        b_ref: float,
    ) -> WindowStats:
        s_bpt, s_rate, s_cpw, _, s_work = sums[:5]
        fixed, per_sample = line
        # The sample variance of the step times (0 with one step; never < 0 by rounding).
        var = max(0.0, (sums[7] - s_bpt * s_bpt / count) / (count - 1)) if count > 1 else 0.0
        if fixed is not None and per_sample is not None:
            mean_eq = fixed + per_sample * b_ref  # the line knows what scales with B
        else:
            mean_eq = eq_sum / count
        return WindowStats(
            reports=count,
            first_s=first,
            last_s=last,
            mean_bpt=s_bpt / count,
            mean_bpt_eq=mean_eq,
            throughput=s_rate / count,
            samples=round(s_work) if self.reader else 0,
            fixed_s=fixed,
            per_sample_s=per_sample,
            line=None if fixed is None else "fit",
            mean_batch=s_work / count,
            compute_per_sample_s=s_cpw / count,
            sd_bpt=var**0.5,
        )

    def server_comm(self, start: float, end: float, sums: dict[int, list[float]]) -> None:
        """Add this worker's comm seconds and counts per server, over its reports
        in [start, end], to ``sums`` (server -> [seconds, count])."""
        for server, series in self._comm.items():
            window = series.window(start, end)
            if window is not None:
                acc = sums.setdefault(server, [0.0, 0])
                acc[0] += window[1]
                acc[1] += window[0]


class Series:
    """(report index, t, value) triples in arrival order with prefix sums of the
    values: a server's update times, or a worker's comm times with one server."""

    __slots__ = ("_index", "_lo", "_prefix", "_t", "_turn", "_v")

    def __init__(self) -> None:
        self._index = array("q")
        self._t = array("d")
        self._v = array("d")
        self._prefix = array("d", [0.0])  # _prefix[k]: sum of _v[:k]
        self._lo = 0
        self._turn = -1  # last k with _t[k] below _t[k - 1] (or NaN)

    def add(self, index: int, t: float, value: float) -> None:
        k = len(self._t)
        if k and not t >= self._t[k - 1]:
            self._turn = k
        self._index.append(index)
        self._t.append(t)
        self._v.append(value)
        self._prefix.append(self._prefix[k] + value)

    def prune_time(self, limit: float) -> None:
        """Drop from the left while older than ``limit`` (as a list of reports would)."""
        t, lo = self._t, self._lo
        while lo < len(t) and t[lo] < limit:
            lo += 1
        self._set_lo(lo)

    def drop_before(self, index: int) -> None:
        """Drop the triples of reports before report ``index``."""
        idx, lo = self._index, self._lo
        while lo < len(idx) and idx[lo] < index:
            lo += 1
        self._set_lo(lo)

    def _set_lo(self, lo: int) -> None:
        self._lo = lo
        if lo > 32 and lo * 2 > len(self._t):  # amortised compaction
            for col in (self._index, self._t, self._v):
                del col[:lo]
            self._prefix = array("d", [0.0])
            total = 0.0
            for value in self._v:
                total += value
                self._prefix.append(total)
            self._turn -= lo
            self._lo = 0

    def __len__(self) -> int:
        return len(self._t) - self._lo

    def window(self, start: float, end: float) -> tuple[int, float, float, float] | None:
        """(count, sum, first t, last t) of the values with ``start <= t <= end``."""
        t, lo, hi = self._t, self._lo, len(self._t)
        if lo >= hi:
            return None
        if self._turn <= lo:  # in time order: one run
            a = bisect.bisect_left(t, start, lo, hi)
            b = bisect.bisect_right(t, end, a, hi)
            if a >= b:
                return None
            return b - a, self._prefix[b] - self._prefix[a], t[a], t[b - 1]
        inside = [k for k in range(lo, hi) if start <= t[k] <= end]
        if not inside:
            return None
        return len(inside), sum(self._v[k] for k in inside), t[inside[0]], t[inside[-1]]
