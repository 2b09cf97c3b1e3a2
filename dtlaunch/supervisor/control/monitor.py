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

PSLD's per-server profile (§4.1): every worker step's exchanges with each server,
as ``(bytes, seconds)`` pairs (the server's service time as the worker measured
it, the BSP barrier left out), the newest ``PROFILE_SAMPLES`` per server within
the long window (``server_profile``). With the job's block layout (``PsLayout``,
given by the caller) a policy can fit ``Pred(s) = alpha * s + beta`` per server.

Steps without a record (``samples == 0``) of a worker that otherwise reports its
records are left out: a worker waiting for a lease or out of data did no work.
A node with no report inside a window is absent from that window's dict and from
that window's global means: no data is not the same as fast or slow. Time comes in
as arguments only (no clock here), so tests drive it with a fake clock.

The reports live in columns with running sums (``windows.py``), so a snapshot
costs about the same at 1,000 workers x 3,000 reports as the plain loops over
every report did at a few workers: it runs on the supervisor's event loop.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dtlaunch.supervisor.control.resources import JobResources, ProcessUse
from dtlaunch.supervisor.control.snapshot import (
    DataEnd,
    MeasuredSlope,
    MonitorSnapshot,
    NodeInfo,
    PsLayout,
    ServerProfile,
    WorkerDevice,
)
from dtlaunch.supervisor.control.steptimes import MIN_FIT_SPREAD, REGIME_JUMP, regime_flags
from dtlaunch.supervisor.control.windows import (
    MIN_BPT_S,
    Series,
    WindowStats,
    WorkerSteps,
    fit_centered,
)

__all__ = [
    "MIN_BPT_S",
    "MIN_FIT_SPREAD",
    "REGIME_JUMP",
    "DataEnd",
    "JobResources",
    "Monitor",
    "MonitorSnapshot",
    "NodeInfo",
    "ProcessUse",
    "PsLayout",
    "ServerProfile",
    "WindowStats",
    "WorkerDevice",
    "fast_reference",
    "since_regime_change",
    "step_model",
    "with_peer_lines",
]


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


PROFILE_SAMPLES = 512  # per server: enough for a fit, bounded at any job size
# size_change_slope's fewest measurements: one alone may fall on a regime change.
MIN_CHANGES = 3


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
        self._workers: dict[int, WorkerSteps] = {}
        # rank -> [batch_size, samples_total, last_step, last_report_s]; its NodeInfo
        # is made when a snapshot needs it (a report costs no object).
        self._worker_state: dict[int, list[float]] = {}
        self._worker_info: dict[int, NodeInfo] = {}
        # Ranks that ever reported, kept across worker_gone: only a rank's first
        # start is waited for, a restarted one keeps its share until it reports.
        self._ever_reported: set[int] = set()
        self._servers: dict[int, Series] = {}
        self._server_info: dict[int, NodeInfo] = {}
        self._profiles: dict[int, deque[tuple[float, int, float]]] = {}  # (t, bytes, s)
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
        server_samples: tuple[tuple[int, int, float], ...] = (),
    ) -> None:
        """One training step of worker ``rank`` that ended at time ``now``
        (``servers``: its communication time with each parameter server;
        ``server_samples``: the same as ``(server, bytes, seconds)``, which also
        feeds the servers' profiles; give one or the other).

        Raises: ValueError for a negative or non-finite time or a batch size < 1.
        """
        self.report_steps(
            rank,
            ends=(now,),
            steps=(step,),
            batch_sizes=(batch_size,),
            compute_s=(compute_s,),
            comm_s=(comm_s,),
            samples=(samples,),
            servers=(servers,) if servers else (),
            server_samples=(server_samples,) if server_samples else (),
        )

    def report_steps(
        self,
        rank: int,
        *,
        ends: Sequence[float],
        steps: Sequence[int],
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        comm_s: Sequence[float],
        samples: Sequence[int],
        servers: Sequence[tuple[tuple[int, float], ...]] = (),
        server_samples: Sequence[tuple[tuple[int, int, float], ...]] = (),
    ) -> None:
        """Training steps of worker ``rank`` in step order, one entry of each column
        per step (``report_worker``'s arguments as columns; ``ends``: when each
        ended). Columns, because a worker reports ten steps at a time and at 1,000
        workers the per-call work of one step at a time was a tenth of the
        supervisor (issue 18). ``servers``/``server_samples``: empty, or one entry
        per step. Nothing is taken when any step is invalid.

        Raises: ValueError for a negative or non-finite time or a batch size < 1.
        """
        inf = math.inf
        if not all(0 <= t < inf for t in compute_s) or not all(0 <= t < inf for t in comm_s):
            for compute, comm in zip(compute_s, comm_s, strict=True):
                _check_times(rank, compute_s=compute, comm_s=comm)
        if (batch_sizes and min(batch_sizes) < 1) or (samples and min(samples) < 0):
            raise ValueError(f"worker {rank}: batch_size must be >= 1 and samples >= 0")
        if not steps:
            return
        window = self._workers.get(rank)
        state = self._worker_state.get(rank)
        if window is None or state is None:
            window = self._workers[rank] = WorkerSteps()
            state = self._worker_state[rank] = [batch_sizes[0], 0, steps[0], ends[0]]
            self._ever_reported.add(rank)
        if not window.reader and max(samples) > 0:
            # A worker that reads through the DDS and took no record in a step
            # (waiting for a lease, or out of data at the end) did no work in it:
            # its near-zero time says nothing about its speed, and as B/T it
            # would look many times faster than everyone. (Known from any of its
            # reports, not the window's: a window of only empty steps stays empty.)
            window.become_reader()
        if server_samples:
            servers = [tuple((server, sec) for server, _, sec in comms) for comms in server_samples]
            for now, comms in zip(ends, server_samples, strict=True):
                for server, nbytes, seconds in comms:
                    if nbytes <= 0:  # a server holding no block: nothing to learn per byte
                        continue
                    profile = self._profiles.get(server)
                    if profile is None:
                        profile = self._profiles[server] = deque(maxlen=PROFILE_SAMPLES)
                    profile.append((now, nbytes, seconds))
        reader, add, prune, l_per = window.reader, window.add, window.prune, self.l_per
        no_servers: tuple[tuple[int, float], ...] = ()
        for i, now in enumerate(ends):
            taken = samples[i]
            add(
                now,
                compute_s[i],
                comm_s[i],
                taken if taken > 0 else batch_sizes[i],
                counts=taken > 0 or not reader,
                servers=servers[i] if servers else no_servers,
            )
            prune(now - l_per)
        state[0] = batch_sizes[-1]
        state[1] += sum(samples)
        last_step = max(steps)
        if last_step > state[2]:
            state[2] = last_step
        state[3] = ends[-1]
        self._worker_info.pop(rank, None)
        if last_step > self._latest_step:
            self._latest_step = last_step

    def report_server(self, rank: int, *, now: float, step: int, update_s: float) -> None:
        """One update step of server ``rank`` that ended at time ``now``.

        Raises: ValueError for a negative or non-finite update time.
        """
        _check_times(rank, update_s=update_s)
        window = self._servers.setdefault(rank, Series())
        window.add(0, now, update_s)
        window.prune_time(now - self.l_per)
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
        self._worker_state.pop(rank, None)
        self._worker_info.pop(rank, None)

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

    def size_change_slope(self) -> MeasuredSlope | None:
        """The time per record the workers' changes of batch size measured, or
        None before ``MIN_CHANGES`` of them: the median of each worker's newest
        measurements weighted by their precision (``steptimes.SizeChange``),
        never below 0. Each is the mean step after a change against the mean
        step before it: unlike a worker's compute time per record, it does not
        count a fixed per-step cost as time per record. Weighted, because a
        change of three records under 15 ms of step noise says little, one of
        twelve much more; a median, so that a change a straggler's onset fell
        on (undetected) does not carry the rest."""
        changes = sorted(c for w in self._workers.values() for c in w.size_changes.measured())
        if len(changes) < MIN_CHANGES:
            return None
        total = sum(c.weight for c in changes)
        acc, median = 0.0, changes[-1].slope
        for change in changes:
            acc += change.weight
            if acc >= total / 2:
                median = change.slope
                break
        return MeasuredSlope(seconds_per_record=max(0.0, median), weight=total)

    def snapshot(
        self,
        now: float,
        *,
        remaining_steps: int | None = None,
        data_end: DataEnd | None = None,
        restart_cost_s: float | None = None,
        server_restart_cost_s: float | None = None,
        restart_pending: bool = False,
        batch_plan: dict[int, int] | None = None,
        accumulation_plan: dict[int, int] | None = None,
        devices: dict[int, WorkerDevice] | None = None,
        ps_layout: PsLayout | None = None,
        reassign_pending: bool = False,
        reassign_cost_s: float | None = None,
        resources: JobResources | None = None,
    ) -> MonitorSnapshot:
        """Aggregate the windows ending at ``now`` (see module doc)."""
        short_from, long_from = now - self.l_trans, now - self.l_per
        for w in self._workers.values():
            w.prune(long_from)
        for s in self._servers.values():
            s.prune_time(long_from)
        workers = self._node_infos()
        b_ref = sum(i.batch_size for i in workers.values()) / len(workers) if workers else 1.0
        worker_short: dict[int, WindowStats] = {}
        worker_long: dict[int, WindowStats] = {}
        comm: dict[int, list[float]] = {}
        for rank, steps in self._workers.items():
            short = steps.stats(short_from, now, b_ref, regimes=True)
            if short is not None:
                worker_short[rank] = short
            long = steps.stats(long_from, now, b_ref, regimes=False)
            if long is not None:
                worker_long[rank] = long
            steps.server_comm(long_from, now, comm)
        measured = self.size_change_slope()
        slope = measured.seconds_per_record if measured is not None else None
        worker_short = with_peer_lines(worker_short, b_ref, slope)
        worker_long = with_peer_lines(worker_long, b_ref, slope)
        server_long: dict[int, WindowStats] = {}
        for rank, series in self._servers.items():
            upd = series.window(long_from, now)
            if upd is not None:
                count, total, first, last = upd
                server_long[rank] = WindowStats(
                    reports=count,
                    first_s=first,
                    last_s=last,
                    mean_bpt=total / count,
                    mean_bpt_eq=total / count,
                    throughput=0.0,
                    samples=0,
                )
        return MonitorSnapshot(
            now=now,
            l_trans=self.l_trans,
            l_per=self.l_per,
            workers=workers,
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
            server_comm_long={srv: acc[0] / acc[1] for srv, acc in sorted(comm.items())},
            spare_capacity=self._spare_capacity,
            spare_hosts=self._spare_hosts,
            latest_step=self._latest_step,
            remaining_steps=remaining_steps,
            data_end=data_end,
            measured_slope=measured,
            restart_cost_s=restart_cost_s,
            server_restart_cost_s=server_restart_cost_s,
            restart_pending=restart_pending,
            batch_plan=dict(batch_plan or {}),
            accumulation_plan=dict(accumulation_plan or {}),
            devices=dict(devices or {}),
            awaiting_first_report=tuple(
                sorted(r for r in devices or {} if r not in self._ever_reported)
            ),
            server_profile=self._server_profiles(long_from),
            ps_layout=ps_layout,
            reassign_pending=reassign_pending,
            reassign_cost_s=reassign_cost_s,
            resources=resources,
        )

    def _server_profiles(self, since: float) -> dict[int, ServerProfile]:
        out: dict[int, ServerProfile] = {}
        for server, samples in sorted(self._profiles.items()):
            while samples and samples[0][0] < since:
                samples.popleft()
            if samples:
                out[server] = ServerProfile(
                    nbytes=tuple(b for _, b, _ in samples),
                    seconds=tuple(t for _, _, t in samples),
                )
        return out

    def _node_infos(self) -> dict[int, NodeInfo]:
        # In the order the workers first reported, as a dict filled per report would be.
        infos = self._worker_info
        out: dict[int, NodeInfo] = {}
        for rank, (batch, total, last_step, last_s) in self._worker_state.items():
            info = infos.get(rank)
            if info is None:
                info = infos[rank] = NodeInfo(
                    rank=rank,
                    batch_size=int(batch),
                    samples_total=int(total),
                    last_step=int(last_step),
                    last_report_s=last_s,
                )
            out[rank] = info
        return out


def _bpt(r: _WorkerReport) -> float:
    return max(r.compute_s + r.comm_s, MIN_BPT_S)


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
    (The Monitor applies the same rule, ``steptimes.regime_flags``, to its columns.)
    """
    work = np.array([r.work for r in reports], dtype=float)
    flags = np.flatnonzero(regime_flags(work, np.array([_bpt(r) for r in reports], dtype=float)))
    return list(reports[int(flags[-1]) :]) if len(flags) else list(reports)


def with_peer_lines(
    stats: dict[int, WindowStats], b_ref: float, measured_slope: float | None = None
) -> dict[int, WindowStats]:
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
    its own counts with ``measured_slope``, the time per record the job's
    changes of batch size measured (``Monitor.size_change_slope``), or before
    any with its compute time per sample (its communication is a per-step
    cost). Why not the compute per sample whenever a peer has no line: a
    step whose compute is mostly a fixed cost (a small model, a delay per
    step) is far from proportional to its batch; a straggler by a fixed cost
    then got a slope tens of times too steep, and each plan shrank it further,
    down to a batch of 1 (benchmarks/rna.py scenario b). No line when that
    would need a negative intercept (the worker is quicker per sample than its
    peers).
    """
    slopes = {
        r: st.per_sample_s
        if st.per_sample_s is not None
        else measured_slope
        if measured_slope is not None
        else st.compute_per_sample_s
        for r, st in stats.items()
    }
    ordered = sorted(slopes.values())  # once: each worker's peers are all but one of them
    out = dict(stats)
    for rank, st in stats.items():
        far = abs(st.mean_batch - b_ref) > MIN_FIT_SPREAD * max(st.mean_batch, b_ref)
        if st.line is not None or not far or len(ordered) < 2:
            continue
        slope = _median_without(ordered, slopes[rank])
        fixed = st.mean_bpt - slope * st.mean_batch
        if fixed <= 0:
            continue
        out[rank] = dataclasses.replace(
            st, fixed_s=fixed, per_sample_s=slope, line="peers", mean_bpt_eq=fixed + slope * b_ref
        )
    return out


def _median_without(ordered: list[float], value: float) -> float:
    """``statistics.median`` of sorted ``ordered`` with one copy of ``value`` left out."""
    skip = bisect.bisect_left(ordered, value)
    m = len(ordered) - 1

    def at(k: int) -> float:  # k-th of the remaining values
        return ordered[k if k < skip else k + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def step_model(sizes: Sequence[int], bpts: Sequence[float]) -> tuple[float | None, float | None]:
    """``(fixed_s, per_sample_s)`` of the least-squares line ``BPT = a + b x B``.

    Why: ``v_i = B/T`` assumes a step's time grows in proportion to its batch.
    A straggler that loses a fixed time per step (a sleep, a slow sync, a daemon
    waking each step) does not speed up in proportion when its batch shrinks, so
    a plan from ``v_i`` alone under-shrinks it and needs several rounds. Once an
    ADJUST_BS has applied, its window holds two batch sizes and the line tells
    the two parts apart. (None, None) when the sizes are too close together;
    where the free fit is not physical (a negative slope or intercept), the best
    line with both parts >= 0 (``windows.fit_centered``). (The Monitor fits the
    same line from its running sums, ``windows.fit_from_sums``.)
    """
    return fit_centered(np.array(sizes, dtype=float), np.array(bpts, dtype=float))


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
