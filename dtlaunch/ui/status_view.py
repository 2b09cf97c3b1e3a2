"""The ``dtlaunch status`` screen: one ``StatusSnapshot`` as rich renderables.

Layout, top to bottom: a header (run, policy, mode, phase, elapsed), a progress
line (shards bar, ETA, global throughput), a table with one row per worker or
server (straggler rows marked ``*`` and in red, so the mark survives plain
text), the stragglers with their reasons, and the last actions with why.

Given a ``height`` the screen fits it: nodes beyond the room left are folded
into one "... more" row (stragglers and troubled nodes are kept), and the
sections shrink before the table does. Every line is cut at ``width``.
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dtlaunch.wire.messages import ActionStatus, NodeStatus, StatusSnapshot

SPARK_CHARS = "▁▂▃▄▅▆▇█"
MIN_SPARK = 6
MAX_SPARK = 40
MAX_STRAGGLER_LINES = 4
MIN_ACTION_LINES = 3
MAX_ACTION_LINES = 8
TABLE_CHROME = 2  # header row and the rule under it
FIXED_COLUMNS = 72  # every column but the sparkline, with their gaps, at width < 100
# Use against limit (mem/limit, cpu/limit) needs this much more room; below
# LIMITS_FROM columns they stay away (``status --json`` always has them).
LIMIT_COLUMNS = 20
LIMITS_FROM = 120
_STATE_STYLE = {
    "running": "green",
    "succeeded": "green",
    "failed": "bold red",
    "unresponsive": "bold yellow",
    "stopping": "yellow",
    "pending": "dim",
    "starting": "cyan",
}
_CALM_STATES = ("running", "succeeded", "pending", "starting")


def render_status(
    snap: StatusSnapshot, *, note: str = "", width: int = 80, height: int | None = None
) -> RenderableType:
    """The whole screen; with ``height``, at most that many lines."""
    header = [_title(snap), _progress(snap, width)]
    if snap.ps_map_version:
        header.append(_ps_map_line(snap))
    if snap.rna_rounds_per_s:
        header.append(_rounds_line(snap))
    if snap.plan and snap.source == "live":
        header.append(_plan_line(snap))
    if note:
        header.append(Text(note, style="yellow", no_wrap=True, overflow="ellipsis"))
    stragglers = [n for n in snap.nodes if n.straggler]
    straggler_lines = min(len(stragglers), MAX_STRAGGLER_LINES)
    action_lines = min(len(snap.actions), MAX_ACTION_LINES)
    node_rows = len(snap.nodes)
    if height is not None:
        action_lines = min(action_lines, MIN_ACTION_LINES)
        room = height - len(header) - TABLE_CHROME
        room -= (straggler_lines + 1) if straggler_lines else 0
        room -= (action_lines + 1) if action_lines else 0
        node_rows = max(1, min(node_rows, room))
        spare = room - node_rows
        extra = min(spare, len(snap.actions) - action_lines, MAX_ACTION_LINES - action_lines)
        action_lines += max(0, extra)
    cut = height is not None  # a fixed screen cuts long reasons; a printout wraps them
    parts: list[RenderableType] = [*header, _table(snap, width, node_rows)]
    if straggler_lines:
        parts.append(Text("Stragglers", style="bold red"))
        parts.append(_straggler_lines(stragglers[:straggler_lines], cut))
    if action_lines:
        parts.append(Text("Last actions", style="bold"))
        parts.append(_action_lines(snap.actions[-action_lines:], cut))
    return Group(*parts)


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    total = round(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def format_bpt(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.2f}s"


def format_rate(per_s: float) -> str:
    if per_s <= 0:
        return "-"
    if per_s < 10:
        return f"{per_s:.1f}"
    if per_s < 100_000:
        return f"{per_s:.0f}"
    return f"{per_s / 1000:.0f}k"


def sparkline(values: list[float], width: int, top: float) -> str:
    """The last ``width`` values as block characters scaled to ``top``."""
    if top <= 0:
        return ""
    shown = values[-width:]
    last = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[min(last, max(0, round(v / top * last)))] for v in shown)


# ---------------------------------------------------------------- sections


def _title(snap: StatusSnapshot) -> Text:
    phase = snap.status or snap.phase
    style = {"succeeded": "bold green", "failed": "bold red", "stopped": "yellow"}.get(
        phase, "bold cyan"
    )
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("dtlaunch ", style="bold")
    text.append(snap.run_id or "?")
    text.append("  ")
    text.append(phase, style=style)
    text.append("  elapsed ", style="dim")
    text.append(format_duration(snap.elapsed_s))
    text.append("  mode ", style="dim")
    text.append(snap.mode or "?")
    text.append("  policy ", style="dim")
    text.append(snap.policy or "none")  # last: a long policy text is what gets cut
    return text


def _plan_line(snap: StatusSnapshot) -> Text:
    """The policy's latest reading: what it did, or why it holds (one line)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("plan ", style="dim")
    text.append(snap.plan)
    return text


def _progress(snap: StatusSnapshot, width: int) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    tail = f"  {format_rate(snap.throughput)} samples/s"
    if snap.shards_total <= 0:
        text.append("shards ", style="dim")
        text.append("- (no data sharding)")
        text.append(tail)
        return text
    share = snap.shards_done / snap.shards_total
    counts = f" {snap.shards_done}/{snap.shards_total} {share:.0%}"
    eta = "  ETA " + (format_duration(snap.eta_s) if snap.eta_s is not None else "?")
    if snap.source != "live":
        eta = ""
    bar_width = max(10, min(40, width - len("shards ") - len(counts) - len(eta) - len(tail)))
    filled = round(share * bar_width)
    text.append("shards ", style="dim")
    text.append("█" * filled, style="green")
    text.append("░" * (bar_width - filled), style="dim")
    text.append(counts)
    text.append(eta, style="bold")
    text.append(tail)
    return text


def _table(snap: StatusSnapshot, width: int, rows: int) -> Table:
    host_width = 12 if width < 100 else 24
    # Only in jobs that set limits (--memory-limit, mem=, cpus=), in a wide terminal.
    limited = width >= LIMITS_FROM and any(n.memory_limit or n.cpu_limit for n in snap.nodes)
    fixed = FIXED_COLUMNS + (host_width - 12) + (LIMIT_COLUMNS if limited else 0)
    spark_width = max(MIN_SPARK, min(MAX_SPARK, width - fixed))
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
        padding=(0, 1),
        header_style="bold",
    )
    table.add_column("node", no_wrap=True, min_width=9)
    table.add_column("host", no_wrap=True, max_width=host_width, overflow="ellipsis")
    table.add_column("state", no_wrap=True, max_width=9, overflow="ellipsis")
    table.add_column("batch", justify="right", no_wrap=True)
    table.add_column("BPT", justify="right", no_wrap=True, min_width=6)
    table.add_column("recent", no_wrap=True, width=spark_width)
    table.add_column("smp/s", justify="right", no_wrap=True)
    table.add_column("shards", justify="right", no_wrap=True)
    table.add_column("rst", justify="right", no_wrap=True)
    if limited:
        table.add_column("mem/limit", justify="right", no_wrap=True)
        table.add_column("cpu/limit", justify="right", no_wrap=True)
    shown = _pick_nodes(snap.nodes, rows)
    top = max((v for n in snap.nodes for v in n.recent_bpt_s), default=0.0)
    for node in shown:
        mark = "*" if node.straggler else " "
        table.add_row(
            f"{mark}{node.role}-{node.rank}",
            node.host or "-",
            Text(node.proc_state, style=_STATE_STYLE.get(node.proc_state, "")),
            str(node.batch_size) if node.batch_size else "-",
            format_bpt(node.bpt_s),
            Text(sparkline(node.recent_bpt_s, spark_width, top), style="cyan"),
            format_rate(node.throughput),
            str(node.shards_done) if node.role == "worker" else "-",
            str(node.restarts),
            *((_memory_cell(node), _cpu_cell(node)) if limited else ()),
            style="bold red" if node.straggler else None,
        )
    hidden = len(snap.nodes) - len(shown)
    if hidden > 0:
        blank = [""] * (9 if limited else 7)
        table.add_row(Text(f" +{hidden}", style="dim"), Text("more", style="dim"), *blank)
    return table


def _ps_map_line(snap: StatusSnapshot) -> Text:
    """Each parameter server's share of the model's bytes and its fitted speed."""
    servers = [n for n in snap.nodes if n.role == "server"]
    total = sum(n.ps_bytes for n in servers)
    text = Text(f"ps map v{snap.ps_map_version}:", style="dim", no_wrap=True, overflow="ellipsis")
    for node in servers:
        share = f"{100 * node.ps_bytes / total:.0f}%" if total else "-"
        speed = f" {_short_size(int(node.ps_speed))}B/s" if node.ps_speed else ""
        text.append(f"  server-{node.rank} ")
        text.append(f"{share}{speed}", style="bold")
    return text


def _rounds_line(snap: StatusSnapshot) -> Text:
    """RNA: rounds per second, and the share of them each worker contributed to
    (of its own group's, in brackets, under hierarchical RNA)."""
    groups = snap.rna_groups
    where = f" in {len(groups)} groups" if groups else ""
    text = Text(
        f"rna {snap.rna_rounds_per_s:.1f} rounds/s{where}, contributed:",
        style="dim",
        no_wrap=True,
        overflow="ellipsis",
    )
    workers = {node.rank: node for node in snap.nodes if node.role == "worker"}
    for group in groups or [sorted(workers)]:
        text.append("  [" if groups else "")
        for i, rank in enumerate(r for r in group if r in workers):
            text.append(f"{'' if groups and i == 0 else '  '}w{rank} ")
            text.append(f"{100 * workers[rank].rna_share:.0f}%", style="bold")
        text.append("]" if groups else "")
    return text


def _short_size(size: int) -> str:
    """``1.5G``, ``512M``: four characters or so for a table cell."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{size >> 10}K"


def _memory_cell(node: NodeStatus) -> Text:
    used = _short_size(node.memory_bytes) if node.memory_bytes else "-"
    if not node.memory_limit:
        return Text(used)
    near = node.memory_bytes >= 0.9 * node.memory_limit  # the next allocation may be its last
    return Text(f"{used}/{_short_size(node.memory_limit)}", style="yellow" if near else "")


def _cpu_cell(node: NodeStatus) -> str:
    used = f"{node.cpu_percent / 100:.1f}" if node.cpu_percent else "-"
    return f"{used}/{node.cpu_limit:g}" if node.cpu_limit else used


def _pick_nodes(nodes: list[NodeStatus], rows: int) -> list[NodeStatus]:
    """At most ``rows`` rows (one for "... more" if needed): when they do not all
    fit, the troubled nodes (stragglers, not running) first, then the slowest;
    with 1,000 workers the rows worth a look are those, not ranks 0 to 20."""
    if len(nodes) <= rows:
        return nodes
    room = max(0, rows - 1)
    urgent = [n for n in nodes if n.straggler or n.proc_state not in _CALM_STATES]
    calm = [n for n in nodes if not (n.straggler or n.proc_state not in _CALM_STATES)]
    slowest_first = sorted(calm, key=lambda n: -n.bpt_s)  # stable: rank order on ties
    return (urgent + slowest_first)[:room]


def _two_columns(cut: bool) -> Table:
    """Label and text; a wrapped text keeps to its column (a hanging indent)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=cut, overflow="ellipsis")
    return grid


def _straggler_lines(nodes: list[NodeStatus], cut: bool) -> Table:
    grid = _two_columns(cut)
    for node in nodes:
        label = Text(f"  {node.role} {node.rank}", style="bold red")
        label.append(f" ({node.host or '?'}):", style="red")
        grid.add_row(label, node.straggler)
    return grid


def _action_lines(actions: list[ActionStatus], cut: bool) -> Table:
    grid = _two_columns(cut)
    for action in actions:
        text = Text()
        text.append(action.action, style="bold magenta" if action.action != "END" else "bold")
        if action.target:
            text.append(f" {action.target}")
        if action.reason:
            text.append(": ", style="dim")
            text.append(action.reason)
        grid.add_row(Text(f"  {format_duration(action.at_s):>6}", style="dim"), text)
    return grid
