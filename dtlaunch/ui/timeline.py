"""A run's events as a timeline: what ``dtlaunch replay`` prints. Pure: no I/O.

Each line carries the time since the run's first event. Wall-clock time is used,
not ``mono``: every supervisor of a resumed run restarts its monotonic clock.
Routine events (agents up, spawn, running, clean exits) of many processes fold
into one line per group ("spawn worker 0..63 on 8 hosts"); anything that needs
attention (failure, restart, lost heartbeat, command, decision) gets its own line
naming host, role and rank. :class:`TimelineBuilder` works event by event so that
``replay --follow`` can print lines as the events arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from io import StringIO
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from dtlaunch.events import Event

_STYLES = {
    "start": "bold cyan",
    "resume": "bold yellow",
    "end": "bold cyan",
    "FAILURE": "bold red",
    "restart": "yellow",
    "lost": "red",
    "recovered": "green",
    "command": "magenta",
    "decision": "magenta",
    "stop": "magenta",
}
_LABEL_WIDTH = 9
_MAX_LISTED = 3  # hosts named one by one in a folded line; more become "on N hosts"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineLine:
    at_s: float  # seconds since the run's first event (wall clock)
    label: str  # short phase / kind column
    text: str


@dataclass(slots=True)
class _Fold:
    """Routine events of one kind folded into a single line."""

    at_s: float
    label: str
    template: str  # "{who}" is replaced by the ranks and hosts
    role: str
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)

    def add(self, event: Event) -> None:
        if event.rank >= 0 and event.rank not in self.ranks:
            self.ranks.append(event.rank)
        if event.host and event.host not in self.hosts:
            self.hosts.append(event.host)

    def line(self) -> TimelineLine:
        who = " ".join(p for p in (self.role, rank_ranges(self.ranks)) if p)
        where = _hosts_text(self.hosts)
        who = f"{who} {where}".strip()
        return TimelineLine(at_s=self.at_s, label=self.label, text=self.template.format(who=who))


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0..3,5"``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for rank in [*ordered, None]:
        if prev is not None and (rank is None or rank != prev + 1):
            parts.append(str(start) if start == prev else f"{start}..{prev}")
            start = None
        if start is None:
            start = rank
        prev = rank
    return ",".join(parts)


def _hosts_text(hosts: Sequence[str]) -> str:
    if not hosts:
        return ""
    if len(hosts) <= _MAX_LISTED:
        return "on " + ", ".join(hosts)
    return f"on {len(hosts)} hosts"


def _who(event: Event) -> str:
    """``worker 3 on node2``, ``agent on node2`` or ``server 0``."""
    role = event.role or ("agent" if event.host else "")
    name = f"{role} {event.rank}" if event.rank >= 0 else role
    return f"{name} on {event.host}" if event.host else name or "job"


def _extra(data: dict[str, Any], skip: Sequence[str] = ()) -> str:
    return ", ".join(f"{k}={v}" for k, v in data.items() if k not in skip)


def format_elapsed(seconds: float) -> str:
    """``+1.234s``, ``+12m03.4s``, ``+2h05m09s``: readable for short and long runs."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"+{seconds:.3f}s"
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"+{int(minutes)}m{rest:04.1f}s"
    hours, rest = divmod(int(seconds), 3600)
    return f"+{hours}h{rest // 60:02d}m{rest % 60:02d}s"


class TimelineBuilder:
    """Events in, finished lines out. Folds stay open until a notable event or
    :meth:`flush`, so that the lines keep the order in which things happened."""

    def __init__(self) -> None:
        self.origin: float | None = None  # wall time of the run's first event
        self.last_at = 0.0
        self.ended: Event | None = None  # the last job_end seen
        self.failures: list[Event] = []
        self.restarts: list[Event] = []
        self._folds: dict[tuple[Any, ...], _Fold] = {}
        self._failing_exits: dict[tuple[str, int], TimelineLine] = {}
        self._decided = ""  # reason of the last decision
        # Per-step data ("reports", "shards_done") is for plots and what-if runs,
        # not for reading line by line: it is only counted, for the summary.
        self.steps_reported: dict[int, int] = {}
        self.shards_done: dict[int, int] = {}
        self.updates_reported: dict[int, int] = {}  # server rank -> updates
        self.injected: dict[tuple[str, int], float] = {}  # (role, rank) -> seconds

    def add(self, event: Event) -> list[TimelineLine]:
        if self.origin is None:
            self.origin = event.wall
        at = event.wall - self.origin
        self.last_at = max(self.last_at, at)
        if event.kind == "job_end":
            self.ended = event
        elif event.kind == "failure":
            self.failures.append(event)
            # The failure line says all the exit line would; keep just one.
            self._failing_exits.pop((event.role, event.rank), None)
        elif event.kind == "restart":
            self.restarts.append(event)
        elif event.kind == "job_start":
            self.ended = None  # a resumed supervisor carries on
        elif event.kind == "reports":
            steps = len(event.data.get("step") or [])
            self.steps_reported[event.rank] = self.steps_reported.get(event.rank, 0) + steps
            return []
        elif event.kind == "shards_done":
            count = int(event.data.get("count", 0) or 0)
            self.shards_done[event.rank] = self.shards_done.get(event.rank, 0) + count
            return []
        elif event.kind == "server_reports":
            updates = len(event.data.get("version") or [])
            self.updates_reported[event.rank] = self.updates_reported.get(event.rank, 0) + updates
            return []
        elif event.kind == "control_schedule":  # the decision grid, for what-if runs
            return []
        elif event.kind == "injected":
            key = (event.role, event.rank)
            delay = float(event.data.get("delay_s", 0.0) or 0.0)
            self.injected[key] = self.injected.get(key, 0.0) + delay
            return []
        fold = self._fold_key(event)
        if fold is not None:
            key, label, template = fold
            if key not in self._folds:
                self._folds[key] = _Fold(at_s=at, label=label, template=template, role=event.role)
            self._folds[key].add(event)
            return []
        if event.kind == "exit":
            self._failing_exits[(event.role, event.rank)] = self._exit_line(event, at)
            return []
        return [*self.flush(), self._notable(event, at)]

    def flush(self) -> list[TimelineLine]:
        """Close every open fold; the lines come out in time order."""
        lines = [fold.line() for fold in self._folds.values()]
        lines += self._failing_exits.values()
        self._folds.clear()
        self._failing_exits.clear()
        return sorted(lines, key=lambda line: line.at_s)

    @staticmethod
    def _fold_key(event: Event) -> tuple[tuple[Any, ...], str, str] | None:
        kind, data = event.kind, event.data
        attempt = int(data.get("attempt", 0) or 0)
        retry = f" (attempt {attempt})" if attempt else ""
        if kind == "agent_launch":
            launch = int(data.get("launch", 1) or 1)
            verb = "relaunch agent" if launch > 1 else "launch agent"
            return (kind, launch > 1), "agents", verb + " {who}"
        if kind == "agent_up":
            return (kind,), "agents", "agent up {who}"
        if kind == "agent_exit" and str(data.get("detail", "")).startswith("shutdown"):
            return (kind,), "agents", "agent exited {who} (shutdown)"
        if kind in ("spawn", "running"):
            return (kind, event.role, attempt), kind, "{who}" + retry
        if kind == "adopted":
            return (kind, event.role), "resume", "adopted {who} (kept running)"
        if kind == "dds_serving":
            return (kind, event.role), "data", "DDS serving {who}"
        if kind == "exit" and data.get("verdict") == "succeeded":
            return (kind, event.role, "ok"), "exit", "{who} finished (exit 0)"
        if kind == "exit" and data.get("requested"):
            verdict = data.get("verdict", "")
            return (kind, event.role, verdict), "exit", "{who} stopped on request: " + verdict
        if kind == "restart" and str(data.get("reason", "")).startswith("group restart"):
            reason = data["reason"]
            return (kind, event.role, reason, attempt), "restart", "{who}" + retry + ": " + reason
        return None

    @staticmethod
    def _exit_line(event: Event, at: float) -> TimelineLine:
        runtime = event.data.get("runtime_s")
        after = f" after {runtime}s" if runtime is not None else ""
        verdict = event.data.get("verdict", "")
        return TimelineLine(at_s=at, label="exit", text=f"{_who(event)} exited{after}: {verdict}")

    def _notable(self, event: Event, at: float) -> TimelineLine:
        label, text = _describe(event, self._decided)
        if event.kind == "decision":
            self._decided = str(event.data.get("reason", ""))
        return TimelineLine(at_s=at, label=label, text=text)


def _describe(event: Event, decided: str = "") -> tuple[str, str]:
    """Label and text of an event that gets its own line."""
    kind, data, who = event.kind, event.data, _who(event)
    if kind == "job_start":
        hosts = data.get("hosts") or []
        where = "embedded on" if data.get("embedded") else "on"
        what = (
            f"job {data.get('run_id', '?')}: {data.get('workers', '?')} workers, "
            f"{data.get('servers', 0)} servers, {data.get('mode', '?')} mode, "
            f"{where} {_hosts_text(hosts).removeprefix('on ') or '?'}"
        )
        if data.get("resumed"):
            return "resume", "supervisor resumed " + what
        return "start", what
    if kind == "resume":
        attempts = data.get("attempts") or {}
        return "resume", f"replayed the log: {len(attempts)} processes known, their attempts kept"
    if kind == "failure":
        attempt = data.get("attempt", 0)
        retry = "retryable" if data.get("retryable") else "NOT retryable"
        text = f"{who} (attempt {attempt}): {data.get('error') or data.get('reason')} [{retry}]"
        return "FAILURE", text
    if kind == "restart":
        return "restart", f"{who} (attempt {data.get('attempt', '?')}): {data.get('reason', '')}"
    if kind == "heartbeat_lost":
        return "lost", f"heartbeat lost: {who} silent for {data.get('silent_s', '?')}s"
    if kind == "heartbeat_recovered":
        return "recovered", f"heartbeat back: {who}"
    if kind == "unresponsive":
        return "lost", f"{who} unresponsive ({data.get('state', '?')})"
    if kind == "responsive":
        return "recovered", f"{who} responsive again ({data.get('state', '?')})"
    if kind == "agent_lost":
        return "lost", f"{who} lost: {data.get('reason', '')}"
    if kind == "agent_exit":
        return "agents", f"{who} exited: {data.get('detail', '')}"
    if kind == "spawn_failed":
        return "FAILURE", f"could not start {who}: {data.get('error', '')}"
    if kind == "command":
        name = data.get("command", "?")
        rest = _extra(data, skip=("command",))
        target = f" {who}" if event.host or event.role else ""
        return "command", f"{name}{target}" + (f" ({rest})" if rest else "")
    if kind == "decision":
        if "status" in data:
            return "decision", f"{data['status']}: {data.get('reason', '')}"
        return "decision", _decision_text(data)
    if kind == "stall":
        return "STALL", _stall_text(data)
    if kind == "fenced":
        return "FENCED", (
            f"{who} attempt {data.get('attempt', '?')} (pid {data.get('pid', '?')}) still ran "
            "when its agent came back after being lost; stopped, so the rank runs once"
        )
    if kind == "stall_stacks":
        return "STALL", _stacks_text(data)
    if kind == "stop_requested":
        return "stop", f"stop requested: {data.get('reason', '')}"
    if kind == "job_end":
        reason = data.get("reason", "")
        # The decision line just above usually gave the same reason.
        said = reason and reason == decided
        return "end", f"job {data.get('status', '?')}" + ("" if said else f": {reason}")
    if kind == "dataset":
        return "data", (
            f"dataset of {data.get('dataset_size', '?')} records in shards of "
            f"{data.get('shard_size', '?')}, {data.get('epochs', 1)} epoch(s), "
            f"global batch {data.get('global_batch', 0)} (from {data.get('source', '?')})"
        )
    if kind == "dds_recovered":
        return "data", (
            f"DDS recovered from the WAL: {data.get('records', '?')} records, "
            f"{data.get('done', '?')} shards done, {data.get('doing', '?')} in progress"
        )
    if kind == "shards_released":
        return "data", f"released {data.get('count', '?')} shards of {who}: {data.get('reason')}"
    if kind == "ps_move":
        return "ps move", _ps_move_text(who, data)
    if kind == "ack_refused":
        count = len(data.get("lease_ids") or [])
        return "data", f"refused {count} ack(s) from {who} (done already or reassigned)"
    if kind == "wal_torn_tail":
        return "data", f"WAL torn tail cut off: {data.get('detail', '')}"
    rest = _extra(data)
    return kind[:_LABEL_WIDTH], f"{who}" + (f": {rest}" if rest else "")


def _decision_text(data: dict[str, Any]) -> str:
    """A decision in one readable line: the action, the policy's reason, and of its
    inputs the ones a person compares (recent BPT per worker, the batch sizes before
    and after). ``replay --json`` keeps the whole inputs dict."""
    text = f"{data.get('action') or 'no action'} ({data.get('policy', '?')})"
    if data.get("reason"):
        text += f": {data['reason']}"
    inputs = data.get("inputs")
    shown = ["policy", "action", "reason", "inputs"]
    if isinstance(inputs, dict):
        bpt = _by_rank(inputs.get("bpt_short"))
        if bpt:
            text += "; BPT " + " ".join(f"w{r} {_seconds(v)}" for r, v in bpt) + " s"
        before, after = _by_rank(inputs.get("current_sizes")), _by_rank(inputs.get("solver_sizes"))
        if before:
            text += "; batch " + ",".join(str(v) for _, v in before)
            if after and data.get("action") == "ADJUST_BS":
                text += " -> " + ",".join(str(v) for _, v in after)
                shown.append("sizes")  # the action's sizes: the batches just shown
    rest = _extra(data, skip=shown)
    return text + (f"; {rest}" if rest else "")


def _by_rank(values: object) -> list[tuple[int, Any]]:
    """``{"3": v, "0": w}`` (JSON keys are strings) as ``[(0, w), (3, v)]``."""
    if not isinstance(values, dict):
        return []
    try:
        return sorted((int(rank), value) for rank, value in values.items())
    except (TypeError, ValueError):
        return []


def _seconds(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) else str(value)


def _stall_text(data: dict[str, Any]) -> str:
    """The watchdog's diagnosis: each running process's last step and how long ago."""
    parts = []
    for proc in data.get("procs") or []:
        if not isinstance(proc, dict):
            continue
        seen = (
            f"last step {proc['last_step']} {proc.get('last_report_ago_s', '?')}s ago"
            if "last_step" in proc
            else "no step reported"
        )
        parts.append(f"{proc.get('proc', '?')}@{proc.get('host', '?')} {seen}")
    return f"{data.get('reason', 'no progress')}; " + ("; ".join(parts) or "nothing running")


def _stacks_text(data: dict[str, Any]) -> str:
    """Where each stuck process was: its innermost frame, and the log with the rest."""
    stacks = data.get("stacks")
    parts = []
    for proc, entry in sorted(stacks.items()) if isinstance(stacks, dict) else []:
        if not isinstance(entry, dict):
            continue
        frames = entry.get("frames") or ["?"]
        parts.append(f"{proc} in {frames[0]} (stacks in {entry.get('log', '?')})")
    return "stacks: " + ("; ".join(parts) or "none")


def _ps_move_text(who: str, data: dict[str, Any]) -> str:
    phase = data.get("phase")
    if phase == "begin":
        return f"{who}: fresh server on {data.get('target_host', '?')} ({data.get('to_endpoint')})"
    if phase == "moved":
        return (
            f"{who}: blocks handed over at version {data.get('version')}, the workers "
            f"paused {data.get('pause_s')}s"
        )
    if phase == "done":
        told = "every worker redirected" if data.get("all_redirected") else "redirect wait over"
        return f"{who}: old server stopped ({told})"
    return f"{who}: move {phase}: {data.get('error', '')}"


def timeline_lines(events: Iterable[Event]) -> list[TimelineLine]:
    builder = TimelineBuilder()
    lines: list[TimelineLine] = []
    for event in events:
        lines += builder.add(event)
    return lines + builder.flush()


def render_line(line: TimelineLine) -> Table:
    """One timeline line; long text wraps under its own column."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=9, justify="right", no_wrap=True, style="dim")
    grid.add_column(width=_LABEL_WIDTH, no_wrap=True)
    grid.add_column(overflow="fold")
    label = Text(line.label, style=_STYLES.get(line.label, ""))
    grid.add_row(format_elapsed(line.at_s), label, Text(line.text))
    return grid


def _proc_counts(records: Iterable[tuple[str, int]]) -> str:
    counts: dict[str, int] = {}
    for role, rank in sorted(records):
        name = f"{role} {rank}" if rank >= 0 else role
        counts[name] = counts.get(name, 0) + 1
    shown = [f"{name} x{n}" for name, n in list(counts.items())[:8]]
    return ", ".join(shown) + (", ..." if len(counts) > 8 else "")


def _per_rank(counts: dict[int, int]) -> str:
    shown = [f"{rank}: {n}" for rank, n in sorted(counts.items())[:16]]
    return ", ".join(shown) + (", ..." if len(counts) > 16 else "")


def _root_cause(failures: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    marked = [f for f in failures if f.get("root_cause")] or list(failures)
    return marked[0] if marked else None


def _summary_rows(builder: TimelineBuilder, summary: dict[str, Any] | None) -> list[list[str]]:
    if summary is None:
        end = builder.ended
        if end is None:
            status = "unknown: no job_end and no summary.json (still running, or the supervisor "
            status += "died; continue it with dtlaunch run --resume RUN_DIR)"
        else:
            status = f"{end.data.get('status', '?')} (summary.json missing): "
            status += str(end.data.get("reason", ""))
        rows = [["status", status], ["elapsed", format_elapsed(builder.last_at)]]
        restarts = [(e.role, e.rank) for e in builder.restarts]
        failures = [
            {"role": e.role, "rank": e.rank, "host": e.host, **e.data} for e in builder.failures
        ]
    else:
        reason = summary.get("reason")
        rows = [
            ["status", f"{summary.get('status', '?')}" + (f" ({reason})" if reason else "")],
            ["JCT", f"{float(summary.get('jct_s', 0.0)):.3f}s"],
            [
                "shards",
                f"{summary.get('shards_done', 0)}/{summary.get('shards_total', 0)} done, "
                f"{summary.get('records_total', 0)} records, "
                f"{summary.get('duplicate_records', 0)} duplicates",
            ],
        ]
        restarts = [(r.get("role", "?"), int(r.get("rank", -1))) for r in summary["restarts"]]
        failures = list(summary.get("failures") or [])
        actions = summary.get("actions") or {}
        rows.append(["actions", ", ".join(f"{k} x{v}" for k, v in actions.items()) or "none"])
    rows.append(
        ["restarts", f"{len(restarts)}" + (f": {_proc_counts(restarts)}" if restarts else "")]
    )
    if builder.steps_reported:
        rows.append(["steps", "reported by worker: " + _per_rank(builder.steps_reported)])
    if builder.shards_done:
        rows.append(["shards/w", "done by worker: " + _per_rank(builder.shards_done)])
    if builder.updates_reported:
        rows.append(["updates", "reported by server: " + _per_rank(builder.updates_reported)])
    if builder.injected:
        shown = [f"{r} {k}: {s:.1f}s" for (r, k), s in sorted(builder.injected.items())[:16]]
        rows.append(["injected", "straggler delay: " + ", ".join(shown)])
    root = _root_cause(failures)
    if root is None:
        rows.append(["failures", "0"])
    else:
        rank = int(root.get("rank", -1))
        who = root.get("role", "?") + (f" {rank}" if rank >= 0 else "")
        rows.append(
            [
                "failures",
                f"{len(failures)}; root cause: {who} on {root.get('host', '?')} "
                f"(attempt {root.get('attempt', 0)}): {root.get('error') or root.get('reason')}",
            ]
        )
        for tb_line in (root.get("traceback") or [])[-4:]:
            rows.append(["", f"  {tb_line}"])
    return rows


def render_summary(builder: TimelineBuilder, summary: dict[str, Any] | None) -> RenderableType:
    """The closing block; from summary.json when there is one, else from the events."""
    table = Table.grid(padding=(0, 2))
    table.add_column(width=9, justify="right", style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in _summary_rows(builder, summary):
        table.add_row(name, Text(value))
    title = Text("summary", style="bold underline")
    return Group(title, table)


def render_timeline(events: Iterable[Event], summary: dict[str, Any] | None = None) -> Group:
    """The whole replay: timeline lines, a blank line, then the summary block."""
    builder = TimelineBuilder()
    lines: list[TimelineLine] = []
    for event in events:
        lines += builder.add(event)
    lines += builder.flush()
    return Group(*(render_line(line) for line in lines), Text(""), render_summary(builder, summary))


def to_plain(renderable: RenderableType, width: int = 100) -> str:
    """Text without colour or trailing blanks, e.g. for tests and files."""
    buffer = StringIO()
    Console(file=buffer, width=width, color_system=None, highlight=False).print(renderable)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
