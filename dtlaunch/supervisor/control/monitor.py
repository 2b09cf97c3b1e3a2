"""The Monitor (AntDT §V-D): per-node sliding windows of step reports, I/O-free.

Workers report one record per training step (the SDK sends them batched every few
steps; the caller feeds each record here with the time it stands for). Servers
report their per-step update time. The Monitor keeps every node's records for the
last ``l_per`` seconds and, on ``snapshot(now)``, aggregates two windows by TIME:

- short window ``[now - l_trans, now]``: mean BPT, throughput ``v_i`` (AntDT:
  ``v_i = 1/|S| * sum B_i / T_i`` over the window's reports), used for transient
  stragglers and batch balancing;
- long window ``[now - l_per, now]``: mean BPT, used for persistent stragglers;
  for servers the mean update time; in PS mode also each server's mean
  communication time per worker step, as the workers measured it (PSLD §4.1's
  per-PS profile: a slow link or a hot server shows here).

BPT (batch processing time) of a step is ``compute_s + comm_s``. Besides the raw
mean, each window carries ``mean_bpt_eq``, the *equal-share BPT*: each report's
compute time rescaled linearly to the mean batch size of all known workers plus
its communication time (``compute_s * B_ref / B + comm_s``). With equal batch
sizes it equals the raw BPT; after an ADJUST_BS it still shows that a worker is
slow (the raw BPT of a balanced straggler looks normal because it got less work),
and it does not blame a small batch for its fixed communication cost.

Two refinements keep balancing quick and fair (see their functions):

- the short window starts at a worker's newest *regime change* (``since_regime_change``):
  right after a transient straggler's onset or end its steps are averaged with
  the new ones only, not with the old regime's;
- a worker whose window holds one batch size far from its peers', so that no line
  can be fitted (``step_model``), gets the peers' per-sample time as the slope of
  its line (``with_peer_lines``); the equal-share BPT of a worker with a line is
  the line's value at the reference batch.

Steps without a record (``samples == 0``) of a worker that otherwise reports its
records are left out: a worker waiting for a lease or out of data did no work.
A node with no report inside a window is absent from that window's dict and from
that window's global means: no data is not the same as fast or slow. Time comes in
as arguments only (no clock here), so tests drive it with a fake clock.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# A step reported as taking 0 s (coarse clock) would make B/T infinite.
MIN_BPT_S = 1e-6


@dataclass(frozen=True, slots=True)
class _WorkerReport:
    t: float
    step: int
    batch_size: int
    compute_s: float
    comm_s: float
    samples: int
    servers: tuple[tuple[int, float], ...] = ()  # (server, comm seconds) in this step

    @property
    def work(self) -> int:
        """Records the step computed: its samples when it reports them (a batch
        cut short at the end of the data is quicker, not a faster worker), else
        its batch size."""
        return self.samples if self.samples > 0 else self.batch_size


@dataclass(frozen=True, slots=True)
class _ServerReport:
    t: float
    step: int
    update_s: float


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

    @property
    def span_s(self) -> float:
        """Time covered by the window's reports (newest minus oldest)."""
        return self.last_s - self.first_s


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """What is known about a node regardless of windows."""

    rank: int
    batch_size: int  # latest reported batch size (0 for servers)
    samples_total: int  # samples reported since it (re)joined
    last_step: int
    last_report_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerDevice:
    """The device a worker runs on, as its host's hostfile line declares it."""

    host: str
    device_class: str | None = None  # class=NAME (None: not declared; dd infers it)
    min_batch: int | None = None  # bmin=: the saturation batch
    max_batch: int | None = None  # bmax=: the largest batch the device's memory holds


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorSnapshot:
    """Everything a policy may look at, frozen at ``now``.

    ``remaining_steps`` (None: unknown), ``restart_cost_s`` (None: not measured
    yet) and ``restart_pending`` (a KILL_RESTART is still settling) come from the
    caller, which knows the data set and measures restarts.
    """

    now: float
    l_trans: float
    l_per: float
    workers: dict[int, NodeInfo]
    servers: dict[int, NodeInfo]
    worker_short: dict[int, WindowStats]
    worker_long: dict[int, WindowStats]
    server_long: dict[int, WindowStats]
    mean_bpt_short: float | None  # over workers in the short window
    mean_bpt_long: float | None
    mean_bpt_eq_short: float | None
    mean_bpt_eq_long: float | None
    # fast_reference() of the equal-share BPTs: a straggler's yardstick that the
    # stragglers themselves do not inflate
    ref_bpt_eq_short: float | None
    ref_bpt_eq_long: float | None
    mean_update_long: float | None  # over servers in the long window
    server_comm_long: dict[int, float]  # server -> workers' mean comm s per step with it
    spare_capacity: int
    spare_hosts: tuple[str, ...]
    latest_step: int  # newest step any worker reported (-1: none yet)
    remaining_steps: int | None = None
    restart_cost_s: float | None = None  # a worker's KILL_RESTART, as measured
    server_restart_cost_s: float | None = None  # a server's (a live move), as measured
    restart_pending: bool = False
    # The batch plan in force (rank -> local batch size of the last ADJUST_BS), kept
    # by the Controller: workers that do not step together report old and new sizes
    # at the same moment, so the plan, not the reports, says what the split is.
    batch_plan: dict[int, int] = dataclasses.field(default_factory=dict)
    # rank -> passes per step (AntDT-DD's C_i) in the plan in force; absent: 1
    accumulation_plan: dict[int, int] = dataclasses.field(default_factory=dict)
    # rank -> the device the worker runs on now (empty when the caller knows no hosts)
    devices: dict[int, WorkerDevice] = dataclasses.field(default_factory=dict)
    # Workers placed (in ``devices``) that have not sent one step report yet: a
    # plan made before they do would split the global batch among the others only.
    awaiting_first_report: tuple[int, ...] = ()


class Monitor:
    """Sliding windows of worker and server step reports; see module doc."""

    def __init__(self, *, l_trans: float, l_per: float) -> None:
        """Raises: ValueError if the windows are not ``0 < l_trans <= l_per``."""
        if not (0 < l_trans <= l_per) or not math.isfinite(l_per):
            raise ValueError(
                f"windows must satisfy 0 < l_trans <= l_per, got l_trans={l_trans} l_per={l_per}"
            )
        self.l_trans = float(l_trans)
        self.l_per = float(l_per)
        self._workers: dict[int, deque[_WorkerReport]] = {}
        self._worker_info: dict[int, NodeInfo] = {}
        self._reads_records: set[int] = set()  # workers that report records (the DDS)
        # Ranks that ever reported, kept across worker_gone: only a rank's first
        # start is waited for, a restarted one keeps its share until it reports.
        self._ever_reported: set[int] = set()
        self._servers: dict[int, deque[_ServerReport]] = {}
        self._server_info: dict[int, NodeInfo] = {}
        self._spare_capacity = 0
        self._spare_hosts: tuple[str, ...] = ()
        self._latest_step = -1

    # ----------------------------------------------------------------- input

    def report_worker(
        self,
        rank: int,
        *,
        now: float,
        step: int,
        batch_size: int,
        compute_s: float,
        comm_s: float,
        samples: int,
        servers: tuple[tuple[int, float], ...] = (),
    ) -> None:
        """One training step of worker ``rank`` that ended at time ``now``
        (``servers``: its communication time with each parameter server).

        Raises: ValueError for a negative or non-finite time or a batch size < 1.
        """
        _check_times(rank, compute_s=compute_s, comm_s=comm_s)
        if batch_size < 1 or samples < 0:
            raise ValueError(f"worker {rank}: batch_size must be >= 1 and samples >= 0")
        if samples > 0:
            self._reads_records.add(rank)
        self._ever_reported.add(rank)
        window = self._workers.setdefault(rank, deque())
        window.append(_WorkerReport(now, step, batch_size, compute_s, comm_s, samples, servers))
        self._prune(window, now)
        old = self._worker_info.get(rank)
        self._worker_info[rank] = NodeInfo(
            rank=rank,
            batch_size=batch_size,
            samples_total=(old.samples_total if old else 0) + samples,
            last_step=max(step, old.last_step) if old else step,
            last_report_s=now,
        )
        self._latest_step = max(self._latest_step, step)

    def report_server(self, rank: int, *, now: float, step: int, update_s: float) -> None:
        """One update step of server ``rank`` that ended at time ``now``.

        Raises: ValueError for a negative or non-finite update time.
        """
        _check_times(rank, update_s=update_s)
        window = self._servers.setdefault(rank, deque())
        window.append(_ServerReport(now, step, update_s))
        self._prune(window, now)
        old = self._server_info.get(rank)
        self._server_info[rank] = NodeInfo(
            rank=rank,
            batch_size=0,
            samples_total=0,
            last_step=max(step, old.last_step) if old else step,
            last_report_s=now,
        )

    def worker_gone(self, rank: int) -> None:
        """Forget a worker (exited, killed, dropped); a restarted one starts fresh."""
        self._workers.pop(rank, None)
        self._worker_info.pop(rank, None)
        self._reads_records.discard(rank)

    def server_gone(self, rank: int) -> None:
        """Forget a server; a restarted one starts with empty windows."""
        self._servers.pop(rank, None)
        self._server_info.pop(rank, None)

    def set_spare_capacity(self, n_hosts: int, hosts: Sequence[str] = ()) -> None:
        """How many spare hosts exist now and, when known, their labels (best first).

        Raises: ValueError if ``n_hosts`` is negative.
        """
        if n_hosts < 0:
            raise ValueError(f"spare capacity must be >= 0, got {n_hosts}")
        self._spare_capacity = max(n_hosts, len(hosts))
        self._spare_hosts = tuple(hosts)

    # ---------------------------------------------------------------- output

    def snapshot(
        self,
        now: float,
        *,
        remaining_steps: int | None = None,
        restart_cost_s: float | None = None,
        server_restart_cost_s: float | None = None,
        restart_pending: bool = False,
        batch_plan: dict[int, int] | None = None,
        accumulation_plan: dict[int, int] | None = None,
        devices: dict[int, WorkerDevice] | None = None,
    ) -> MonitorSnapshot:
        """Aggregate the windows ending at ``now`` (see module doc)."""
        for w in self._workers.values():
            self._prune(w, now)
        for s in self._servers.values():
            self._prune(s, now)
        sizes = [info.batch_size for info in self._worker_info.values()]
        b_ref = sum(sizes) / len(sizes) if sizes else 1.0
        short_from, long_from = now - self.l_trans, now - self.l_per
        readers = self._reads_records
        worker_short = with_peer_lines(
            _worker_stats(self._workers, short_from, now, b_ref, readers, regimes=True), b_ref
        )
        worker_long = with_peer_lines(
            _worker_stats(self._workers, long_from, now, b_ref, readers, regimes=False), b_ref
        )
        server_long: dict[int, WindowStats] = {}
        for rank, reports in self._servers.items():
            upd = [r for r in reports if long_from <= r.t <= now]
            if upd:
                mean_update = sum(r.update_s for r in upd) / len(upd)
                server_long[rank] = WindowStats(
                    reports=len(upd),
                    first_s=upd[0].t,
                    last_s=upd[-1].t,
                    mean_bpt=mean_update,
                    mean_bpt_eq=mean_update,
                    throughput=0.0,
                    samples=0,
                )
        return MonitorSnapshot(
            now=now,
            l_trans=self.l_trans,
            l_per=self.l_per,
            workers=dict(self._worker_info),
            servers=dict(self._server_info),
            worker_short=worker_short,
            worker_long=worker_long,
            server_long=server_long,
            mean_bpt_short=_mean(s.mean_bpt for s in worker_short.values()),
            mean_bpt_long=_mean(s.mean_bpt for s in worker_long.values()),
            mean_bpt_eq_short=_mean(s.mean_bpt_eq for s in worker_short.values()),
            mean_bpt_eq_long=_mean(s.mean_bpt_eq for s in worker_long.values()),
            ref_bpt_eq_short=fast_reference(s.mean_bpt_eq for s in worker_short.values()),
            ref_bpt_eq_long=fast_reference(s.mean_bpt_eq for s in worker_long.values()),
            mean_update_long=_mean(s.mean_bpt for s in server_long.values()),
            server_comm_long=_server_comm(self._workers, long_from, now),
            spare_capacity=self._spare_capacity,
            spare_hosts=self._spare_hosts,
            latest_step=self._latest_step,
            remaining_steps=remaining_steps,
            restart_cost_s=restart_cost_s,
            server_restart_cost_s=server_restart_cost_s,
            restart_pending=restart_pending,
            batch_plan=dict(batch_plan or {}),
            accumulation_plan=dict(accumulation_plan or {}),
            devices=dict(devices or {}),
            awaiting_first_report=tuple(
                sorted(r for r in devices or {} if r not in self._ever_reported)
            ),
        )

    def _prune(self, window: deque[_WorkerReport] | deque[_ServerReport], now: float) -> None:
        # Reports arrive in time order per node (batched, never reordered), so
        # everything older than the long window leaves from the left.
        limit = now - self.l_per
        while window and window[0].t < limit:
            window.popleft()


def _worker_stats(
    windows: dict[int, deque[_WorkerReport]],
    start: float,
    end: float,
    b_ref: float,
    reads_records: set[int],
    *,
    regimes: bool,
) -> dict[int, WindowStats]:
    out: dict[int, WindowStats] = {}
    for rank, reports in windows.items():
        inside = [r for r in reports if start <= r.t <= end]
        if rank in reads_records:
            # A worker that reads through the DDS and took no record in a step
            # (waiting for a lease, or out of data at the end) did no work in it:
            # its near-zero time says nothing about its speed, and as B/T it
            # would look many times faster than everyone. (Known from any of its
            # reports, not the window's: a window of only empty steps stays empty.)
            inside = [r for r in inside if r.samples > 0]
        if not inside:
            continue
        if regimes:
            inside = since_regime_change(inside)
        bpts = [_bpt(r) for r in inside]
        eq = [max(r.compute_s * b_ref / r.work + r.comm_s, MIN_BPT_S) for r in inside]
        rates = [r.work / t for r, t in zip(inside, bpts, strict=True)]
        fixed, per_sample = step_model([r.work for r in inside], bpts)
        mean_batch = sum(r.work for r in inside) / len(inside)
        if fixed is not None and per_sample is not None:
            eq = [fixed + per_sample * b_ref]  # the line knows what scales with B
        out[rank] = WindowStats(
            reports=len(inside),
            first_s=inside[0].t,
            last_s=inside[-1].t,
            mean_bpt=sum(bpts) / len(bpts),
            mean_bpt_eq=sum(eq) / len(eq),
            throughput=sum(rates) / len(rates),
            samples=sum(r.samples for r in inside),
            fixed_s=fixed,
            per_sample_s=per_sample,
            line=None if fixed is None else "fit",
            mean_batch=mean_batch,
            compute_per_sample_s=sum(r.compute_s / r.work for r in inside) / len(inside),
        )
    return out


def _bpt(r: _WorkerReport) -> float:
    return max(r.compute_s + r.comm_s, MIN_BPT_S)


# A step time that jumps by more than this between two steps of one batch size,
# and whose next step stays on the new side, starts a new regime. Step-time noise
# on a shared machine is a few per cent; a straggler's onset is tens.
REGIME_JUMP = 0.15


def since_regime_change(reports: Sequence[_WorkerReport]) -> list[_WorkerReport]:
    """The reports from the newest change of regime on (all of them if none).

    Why: a short window that straddles a transient straggler's onset averages
    the fast steps before it with the slow ones after, so the first plan
    under-reacts and balancing takes several rounds (each a few steps late);
    at the episode's end the same delay keeps the recovered worker's batch
    small. A change is a BPT jump by more than ``REGIME_JUMP`` between two
    consecutive steps of the same batch size, confirmed by the step after it,
    compared per sample because a plan may already have changed its batch. One
    slow step alone (a GC pause) is not a regime. A change between two batch
    sizes is left alone: that is what ``step_model`` fits a line through.
    """
    for j in range(len(reports) - 2, 0, -1):
        before, first, after = reports[j - 1], reports[j], reports[j + 1]
        if before.work != first.work:
            continue
        old, new = _bpt(before), _bpt(first)
        up, down = new > old * (1 + REGIME_JUMP), new * (1 + REGIME_JUMP) < old
        per_old = old / before.work
        per_after = _bpt(after) / after.work
        half = 1 + REGIME_JUMP / 2
        if (up and per_after > per_old * half) or (down and per_after * half < per_old):
            return list(reports[j:])
    return list(reports)


def with_peer_lines(stats: dict[int, WindowStats], b_ref: float) -> dict[int, WindowStats]:
    """``stats`` with a line for each worker whose batch is far from ``b_ref``
    but whose window could not fit one: its slope is the median per-sample time
    of the other workers, its intercept what is left of its mean BPT.

    Why: with one batch size seen, eq. 3 takes a step's time as proportional
    to its batch. Extrapolated far from that batch the guess fails badly for a
    fixed per-step cost: a replacement that inherits a shrunk straggler's batch
    of 2 and sleeps 0.12 s a step looks 16x slow per sample, so it would keep
    batch 2 for good (no second size, no fitted line) and, rescaled to the
    equal share, would look like a persistent straggler. Peers on like hardware
    spend about the same time per sample; a wrong guess shows at the next plan,
    whose second batch size gives the fitted line. A peer without a line of
    its own counts with its compute time per sample (its communication is a
    per-step cost). No line when that would need a negative intercept (the
    worker is quicker per sample than its peers).
    """
    slopes = {
        r: st.per_sample_s if st.per_sample_s is not None else st.compute_per_sample_s
        for r, st in stats.items()
    }
    out = dict(stats)
    for rank, st in stats.items():
        far = abs(st.mean_batch - b_ref) > MIN_FIT_SPREAD * max(st.mean_batch, b_ref)
        peers = sorted(v for r, v in slopes.items() if r != rank)
        if st.line is not None or not far or not peers:
            continue
        slope = statistics.median(peers)
        fixed = st.mean_bpt - slope * st.mean_batch
        if fixed <= 0:
            continue
        out[rank] = dataclasses.replace(
            st, fixed_s=fixed, per_sample_s=slope, line="peers", mean_bpt_eq=fixed + slope * b_ref
        )
    return out


# A fit needs batch sizes at least this far apart (relative to the largest):
# closer ones leave the slope to the step-time noise.
MIN_FIT_SPREAD = 0.1


def step_model(sizes: Sequence[int], bpts: Sequence[float]) -> tuple[float | None, float | None]:
    """``(fixed_s, per_sample_s)`` of the least-squares line ``BPT = a + b x B``.

    Why: ``v_i = B/T`` assumes a step's time grows in proportion to its batch.
    A straggler that loses a fixed time per step (a sleep, a slow sync, a daemon
    waking each step) does not speed up in proportion when its batch shrinks, so
    a plan from ``v_i`` alone under-shrinks it and needs several rounds. Once an
    ADJUST_BS has applied, its window holds two batch sizes and the line tells
    the two parts apart. (None, None) when the sizes are too close together or
    the line is not physical (negative slope or intercept).
    """
    if len(sizes) < 2 or max(sizes) - min(sizes) < MIN_FIT_SPREAD * max(sizes):
        return None, None
    mean_b = sum(sizes) / len(sizes)
    mean_t = sum(bpts) / len(bpts)
    sxx = sum((b - mean_b) ** 2 for b in sizes)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in zip(sizes, bpts, strict=True)) / sxx
    intercept = mean_t - slope * mean_b
    if slope <= 0 or intercept < 0:
        return None, None
    return intercept, slope


def _server_comm(
    windows: dict[int, deque[_WorkerReport]], start: float, end: float
) -> dict[int, float]:
    sums: dict[int, list[float]] = {}
    for reports in windows.values():
        for r in reports:
            if start <= r.t <= end:
                for server, seconds in r.servers:
                    sums.setdefault(server, []).append(seconds)
    return {server: sum(v) / len(v) for server, v in sorted(sums.items())}


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def fast_reference(step_times: Iterable[float]) -> float | None:
    """The mean of the fastest quarter (at least one) of ``step_times``: what a
    healthy node takes. Unlike the mean it stays put when many nodes are slow
    (two slow workers of four lift the mean of four 1.5x-slower ones by 25 %)."""
    ordered = sorted(step_times)
    if not ordered:
        return None
    fastest = ordered[: math.ceil(len(ordered) / 4)]
    return sum(fastest) / len(fastest)


def _check_times(rank: int, **times: float) -> None:
    for name, value in times.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"node {rank}: {name} must be a finite number >= 0, got {value}")
