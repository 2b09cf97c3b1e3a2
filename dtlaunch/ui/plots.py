"""``dtlaunch replay --plot FILE.png``: one picture of a run, after AntDT's figures.

Six panels, all on the same time axis (seconds since the run's first event)
except the fourth:

1. BPT per worker over time (AntDT Fig. 13): one line per worker, one point a step;
2. local batch size per worker over time (Fig. 12); under ``--policy rna``,
   RNA's rounds per second and each worker's share of the rounds it
   contributed a gradient to, from the group's ``rna_rounds`` reports;
3. global throughput in samples/s (Fig. 14), with a vertical marker per action
   the Controller took (ADJUST_BS, KILL_RESTART, ...), so cause and effect line up;
4. shards each worker finished beside its throughput (Fig. 16): with DDS a fast
   worker fetches more shards, and the bars show whether it did;
5. memory (RSS of its process tree) per process, each beside its limit, dashed:
   an OOM relaunch shows as a line that reaches its limit and comes back higher;
6. CPU per process, in cores (DLRover's view of what a process really uses).
   Both from the supervisor's ``resources`` samples (every 15 s).

:func:`plot_data` turns events into the numbers drawn (tests check those);
:func:`draw` draws them with matplotlib (an optional extra, Agg backend, no display).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.events import Event
from dtlaunch.ui.runlog import ActionRow, RecordedRun, StepRow, read_run

log = logging.getLogger(__name__)

FIG_SIZE_IN = (14.0, 12.0)
DPI = 100  # FIG_SIZE_IN x DPI = 1400 x 1200 pixels
MIB = 1 << 20
MIN_BIN_S = 0.5  # throughput bins: never finer than this (step noise)
BINS = 80  # about this many throughput points over the run
_ACTION_COLOURS = {
    "ADJUST_BS": "tab:blue",
    "KILL_RESTART": "tab:red",
    "ADJUST_LR": "tab:green",
    "BACKUP_WORKERS": "tab:purple",
}
_LABEL_GAP = 0.04  # action labels closer than this share of the x range are not repeated


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    xs: list[float]
    ys: list[float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Marker:
    at_s: float
    action: str
    label: str  # "KILL_RESTART worker 2"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlotData:
    bpt: dict[int, Series]  # rank -> BPT (s) per step
    batch: dict[int, Series]  # rank -> local batch size per step
    throughput: Series  # global samples/s, per time bin (x: bin centre)
    markers: list[Marker]
    shards: dict[int, int]  # rank -> shards finished
    worker_throughput: dict[int, float]  # rank -> samples/s of step time
    end_s: float
    title: str
    memory: dict[str, Series] | None = None  # proc id -> RSS (MiB) over time
    memory_limit: dict[str, Series] | None = None  # proc id -> its limit (MiB), if any
    cpu: dict[str, Series] | None = None  # proc id -> CPU (cores) over time
    rounds: Series | None = None  # --policy rna: rounds/s per report
    contribution: dict[int, Series] | None = None  # rank -> share of rounds, per report


def plot_data(events: Iterable[Event], *, title: str = "") -> PlotData:
    """The numbers the panels show (see module doc)."""
    events = list(events)
    run = read_run(events)
    bpt: dict[int, Series] = {}
    batch: dict[int, Series] = {}
    for rank in run.workers:
        rows = run.steps_of(rank)
        if rows:
            xs, ys_bpt, ys_batch = _with_breaks(rows)
            bpt[rank] = Series(xs=xs, ys=ys_bpt)
            batch[rank] = Series(xs=xs, ys=ys_batch)
    memory = {p: Series(xs=[t for t, *_ in r], ys=[rss / MIB for _, rss, _, _ in r])
              for p, r in run.resources.items()}  # fmt: skip
    limits = {p: Series(xs=[t for t, *_ in r], ys=[lim / MIB for *_, lim in r])
              for p, r in run.resources.items() if any(lim for *_, lim in r)}  # fmt: skip
    cpu = {p: Series(xs=[t for t, *_ in r], ys=[c / 100 for _, _, c, _ in r])
           for p, r in run.resources.items()}  # fmt: skip
    return PlotData(
        memory=memory,
        memory_limit=limits,
        cpu=cpu,
        bpt=bpt,
        batch=batch,
        throughput=_global_throughput(run),
        markers=[_marker(a) for a in run.actions],
        shards=run.shards_by_worker(),
        worker_throughput=run.throughput_by_worker(),
        end_s=run.end_s,
        title=title,
        **_rounds(events),
    )


def _rounds(events: list[Event]) -> dict[str, Any]:
    """RNA's rounds per second and each worker's share, one point per report."""
    reports = [e for e in events if e.kind == "rna_rounds"]
    if not reports:
        return {}
    xs: list[float] = []
    per_s: list[float] = []
    shares: dict[int, Series] = {}
    previous: float | None = None
    for event in reports:
        rounds = int(event.data.get("rounds", 0))
        span = event.mono - previous if previous is not None else 1.0
        previous = event.mono
        xs.append(event.mono)
        per_s.append(rounds / max(span, 1.0))  # reports come about a second apart
        counts = event.data.get("contributions", [])
        for rank, count in zip(event.data.get("members", []), counts, strict=False):
            series = shares.setdefault(int(rank), Series(xs=[], ys=[]))
            series.xs.append(event.mono)
            series.ys.append(count / rounds if rounds else 0.0)
    return {"rounds": Series(xs=xs, ys=per_s), "contribution": shares}


def _with_breaks(rows: list[StepRow]) -> tuple[list[float], list[float], list[float]]:
    """Time, BPT and batch size per step; a NaN point where a new attempt of the
    worker starts (its step count goes back), so no line joins two processes."""
    xs: list[float] = []
    bpts: list[float] = []
    sizes: list[float] = []
    previous = None
    for row in rows:
        if previous is not None and row.step <= previous.step:
            xs.append((previous.at_s + row.at_s) / 2)
            bpts.append(math.nan)
            sizes.append(math.nan)
        xs.append(row.at_s)
        bpts.append(row.bpt_s)
        sizes.append(float(row.batch_size))
        previous = row
    return xs, bpts, sizes


def _marker(action: ActionRow) -> Marker:
    label = action.name
    if "rank" in action.fields:
        label += f" {action.target()}"
    return Marker(at_s=action.at_s, action=action.name, label=label)


def _global_throughput(run: RecordedRun) -> Series:
    """Samples finished per second by all workers, in equal time bins."""
    if not run.steps:
        return Series(xs=[], ys=[])
    start = run.steps[0].at_s - run.steps[0].bpt_s
    stop = run.steps[-1].at_s
    width = max((stop - start) / BINS, MIN_BIN_S)
    count = max(1, int((stop - start) / width + 0.999))
    totals = [0.0] * count
    for row in run.steps:
        index = min(int((row.at_s - start) / width), count - 1)
        totals[index] += row.samples
    xs = [start + (i + 0.5) * width for i in range(count)]
    # The last bin is usually partial: scale by its real length, not the bin width.
    lengths = [width] * (count - 1) + [max(stop - (start + (count - 1) * width), 1e-9)]
    if count > 1 and lengths[-1] < width / 4:  # too short to say anything: drop it
        xs, totals, lengths = xs[:-1], totals[:-1], lengths[:-1]
    return Series(xs=xs, ys=[t / w for t, w in zip(totals, lengths, strict=True)])


def _pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend.

    Raises: ConfigError naming the extra to install when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ConfigError(
            f"replay --plot needs matplotlib ({err}); install it with "
            "pip install 'dtlaunch[plot]' (or pip install matplotlib)"
        ) from err
    return plt


def draw(data: PlotData, path: Path) -> None:
    """Write ``data`` as a PNG of FIG_SIZE_IN x DPI pixels to ``path``.

    Raises:
        ConfigError: matplotlib is not installed.
        OSError: ``path`` cannot be written.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(3, 2, figsize=FIG_SIZE_IN, dpi=DPI, layout="constrained")
    try:
        ax_bpt, ax_batch, ax_tput, ax_shards = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
        ax_mem, ax_cpu = axes[2][0], axes[2][1]
        colours = _worker_colours(plt, sorted(set(data.bpt) | set(data.shards)))
        _draw_per_worker(ax_bpt, data.bpt, colours, steps=False)
        ax_bpt.set(title="Batch processing time per worker", ylabel="BPT (s)")
        if data.rounds is not None:
            _draw_rounds(ax_batch, data, colours)
        else:
            _draw_per_worker(ax_batch, data.batch, colours, steps=True)
            ax_batch.set(title="Local batch size per worker", ylabel="batch size (samples)")
        _draw_throughput(ax_tput, data)
        _draw_shards(ax_shards, data, colours)
        _draw_resources(ax_mem, ax_cpu, data)
        x_end = max(data.end_s, 1e-3)
        for ax in (ax_bpt, ax_batch, ax_tput, ax_mem, ax_cpu):
            ax.set_xlim(0.0, x_end)
            ax.set_xlabel("time since job start (s)")
            ax.grid(alpha=0.3)
        for ax in (ax_bpt, ax_batch):
            _draw_markers(ax, data.markers, labels=False)
        _draw_markers(ax_tput, data.markers, labels=True)
        if data.title:
            fig.suptitle(data.title, fontsize=13)
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)


def _draw_resources(ax_mem: Any, ax_cpu: Any, data: PlotData) -> None:
    ax_mem.set(title="Memory per process (RSS), limit dashed", ylabel="MiB")
    ax_cpu.set(title="CPU per process", ylabel="cores")
    if not data.memory or not data.cpu:
        for ax in (ax_mem, ax_cpu):
            _no_data(ax, "no resource samples in this run's events")
        return
    for proc_id, series in sorted(data.memory.items()):
        (line,) = ax_mem.plot(series.xs, series.ys, label=proc_id, linewidth=1.2)
        limit = (data.memory_limit or {}).get(proc_id)
        if limit is not None:
            ax_mem.step(limit.xs, limit.ys, where="post", linestyle="--",
                        color=line.get_color(), linewidth=0.9)  # fmt: skip
    for proc_id, series in sorted(data.cpu.items()):
        ax_cpu.plot(series.xs, series.ys, label=proc_id, linewidth=1.2)
    if len(data.memory) <= 12:  # a legend of 1,000 processes helps nobody
        _legend_outside(ax_mem)


def _worker_colours(plt: Any, ranks: list[int]) -> dict[int, Any]:
    cmap = plt.get_cmap("tab10" if len(ranks) <= 10 else "tab20")
    return {rank: cmap(i % cmap.N) for i, rank in enumerate(ranks)}


def _draw_per_worker(
    ax: Any, series: dict[int, Series], colours: dict[int, Any], *, steps: bool
) -> None:
    if not series:
        _no_data(ax, "no step reports in this run's events")
        return
    for rank, s in sorted(series.items()):
        # A step's value holds over the time the step took, which ends at its point.
        style: dict[str, Any] = {} if steps else {"marker": ".", "ms": 3}
        ax.plot(
            s.xs,
            s.ys,
            label=f"worker {rank}",
            color=colours[rank],
            lw=1.2,
            drawstyle="steps-pre",
            **style,
        )
    ax.set_ylim(bottom=0)
    _legend_outside(ax)


def _draw_rounds(ax: Any, data: PlotData, colours: dict[int, Any]) -> None:
    """RNA: each worker's share of the rounds (left axis), rounds/s (right axis)."""
    assert data.rounds is not None
    ax.set(title="RNA rounds: each worker's share, rounds/s (black)", ylabel="share of rounds")
    for rank, series in sorted((data.contribution or {}).items()):
        ax.plot(series.xs, series.ys, label=f"worker {rank}", lw=1.2,
                color=colours.get(rank), drawstyle="steps-pre")  # fmt: skip
    ax.set_ylim(0.0, 1.05)
    rate = ax.twinx()
    rate.plot(data.rounds.xs, data.rounds.ys, color="black", lw=1.5, label="rounds/s")
    rate.set_ylabel("rounds/s")
    rate.set_ylim(bottom=0)
    _legend_outside(ax)


def _draw_throughput(ax: Any, data: PlotData) -> None:
    ax.set(title="Global throughput and the Controller's actions", ylabel="samples/s")
    if not data.throughput.xs:
        _no_data(ax, "no step reports in this run's events")
        return
    ax.plot(data.throughput.xs, data.throughput.ys, color="black", lw=1.5, label="all workers")
    # Head room above the curve for the action labels, which hang from the top.
    ax.set_ylim(bottom=0, top=max(data.throughput.ys) * 1.6 or 1.0)


def _draw_markers(ax: Any, markers: list[Marker], *, labels: bool) -> None:
    """Vertical lines at the actions; on the throughput panel, labelled, with a legend."""
    if not markers:
        if labels:
            _legend_outside(ax)
        return
    left, right = ax.get_xlim()
    gap = (right - left) * _LABEL_GAP
    last_label_at: dict[str, float] = {}
    for name in dict.fromkeys(m.action for m in markers):
        count = sum(m.action == name for m in markers)
        colour = _ACTION_COLOURS.get(name, "tab:gray")
        for i, marker in enumerate(m for m in markers if m.action == name):
            legend = f"{name} x{count}" if i == 0 and labels else None
            ax.axvline(marker.at_s, color=colour, ls="--", lw=1.0, alpha=0.7, label=legend)
    if labels:
        for marker in markers:
            previous = last_label_at.get(marker.action)
            if previous is not None and marker.at_s - previous < gap:
                continue
            last_label_at[marker.action] = marker.at_s
            ax.annotate(
                marker.label,
                xy=(marker.at_s, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(2, -4),
                textcoords="offset points",
                rotation=90,
                va="top",
                ha="left",
                fontsize=8,
                color=_ACTION_COLOURS.get(marker.action, "tab:gray"),
                bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
            )
        _legend_outside(ax)


def _draw_shards(ax: Any, data: PlotData, colours: dict[int, Any]) -> None:
    ax.set_title("Shards finished against worker throughput (DDS)")
    ranks = sorted(set(data.shards) | set(data.worker_throughput))
    if not ranks:
        _no_data(ax, "no shard or step records in this run's events")
        return
    xs = list(range(len(ranks)))
    width = 0.38
    shards = [data.shards.get(r, 0) for r in ranks]
    bars = ax.bar(
        [x - width / 2 for x in xs],
        shards,
        width,
        color=[colours.get(r, "tab:gray") for r in ranks],
        label="shards finished",
    )
    ax.bar_label(bars, fontsize=8)
    ax.set_ylabel("shards finished")
    ax.set_xticks(xs, [f"worker {r}" for r in ranks])
    ax.set_ylim(0, max(max(shards), 1) * 1.2)
    twin = ax.twinx()
    tput = [data.worker_throughput.get(r, 0.0) for r in ranks]
    tbars = twin.bar(
        [x + width / 2 for x in xs],
        tput,
        width,
        color="white",
        edgecolor="black",
        hatch="//",
        label="throughput (samples/s)",
    )
    twin.bar_label(tbars, fmt="%.0f", fontsize=8)
    twin.set_ylabel("throughput (samples/s of step time)")
    twin.set_ylim(0, max(max(tput), 1e-9) * 1.2)
    handles = [bars, tbars]
    ax.legend(handles, [str(h.get_label()) for h in handles], loc="upper left", fontsize=8,
              bbox_to_anchor=(1.12, 1.0), borderaxespad=0.0)  # fmt: skip


def _legend_outside(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0.0)


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_run(events: Iterable[Event], path: Path, *, title: str = "") -> PlotData:
    """Read ``events``, draw them to ``path``; returns what was drawn.

    Raises:
        ConfigError: matplotlib is not installed.
        OSError: ``path`` cannot be written.
    """
    data = plot_data(events, title=title)
    draw(data, path)
    log.info("wrote %s", path)
    return data
