"""``dtlaunch replay RUN_DIR --policy NAME[:k=v,...]``: re-decide a run offline.

The recorded step reports are fed to a fresh Controller running the given policy,
with the recorded times as its clock: each batch of reports at the moment it
reached the supervisor (with its steps' ages, as the supervisor fed them), the
work left (``shards_done`` events) as the supervisor knew it, workers forgotten
when they ended, and a decision due every control interval of the run, checked on
the supervisor's tick (half a heartbeat interval). The actions it would have
taken are listed beside those the run really took.

What this cannot tell: the reports are what happened under the recorded actions,
so the effect of a different action (a batch size it would have set, a restart
it would have made) is not simulated. It answers "when would this policy, with
these lambda and windows, have acted on what the Monitor saw?"

In PS mode the placement maps the run followed are replayed at the times they
came into force (``ps_placement`` events), with each step's exchanges with the
servers, so ``psld`` fits what the run's servers did, and each server's applied
updates (``server_reports``), so ``nd`` judges the servers as it did live. A
reassignment or a server move the what-if policy asks for is listed, not
carried out: its map and its servers stay the run's. The end-of-data plan of
``lb-bsp`` and ``nd`` (once every shard is handed out) is not re-decided: the run
log does not record the leases each worker held then.

A what-if of the run's own policy changes only what it names: ``nd:lambda=2.0``
over a run under ``nd:l_trans=3,l_per=8`` is ``nd:l_trans=3,l_per=8,lambda=2.0``,
so one knob can be tuned at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dtlaunch.errors import ConfigError
from dtlaunch.events import Event
from dtlaunch.supervisor.control.actions import Action, action_fields
from dtlaunch.supervisor.control.controller import Controller
from dtlaunch.supervisor.control.monitor import PsLayout, WorkerDevice
from dtlaunch.supervisor.control.policies import BUILTIN_POLICIES, parse_policy
from dtlaunch.ui.runlog import ActionRow, RecordedRun, StepRow, read_run
from dtlaunch.ui.timeline import format_elapsed
from dtlaunch.wire.messages import PsUpdate, ServerComm, StepReports

_REASON_CHARS = 140  # a table cell's reason is cut here; --json has it whole


@dataclass(frozen=True, slots=True, kw_only=True)
class DecidedAction:
    at_s: float  # seconds since the run's first event
    action: str
    target: str
    reason: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    policy: str  # what-if policy as run (the run's own parameters kept unless named)
    recorded_policy: str  # the run's --policy
    control_interval_s: float
    would: list[DecidedAction]  # the what-if policy's actions
    actual: list[DecidedAction]  # the run's recorded actions
    decisions: int  # how many times the what-if policy was asked
    skipped_reports: int  # step reports the Monitor refused (malformed)

    def counts(self, which: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.would if which == "would" else self.actual:
            out[a.action] = out.get(a.action, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "recorded_policy": self.recorded_policy,
            "control_interval_s": self.control_interval_s,
            "decisions": self.decisions,
            "skipped_reports": self.skipped_reports,
            "would": [asdict(a) for a in self.would],
            "actual": [asdict(a) for a in self.actual],
            "counts": {"would": self.counts("would"), "actual": self.counts("actual")},
        }


def initial_remaining_steps(dataset: dict[str, Any]) -> int | None:
    """Steps of the whole data set at the global batch, as the DDS counts them
    before any shard is done (None without a data set or a global batch)."""
    try:
        size, shard = int(dataset.get("dataset_size", 0)), int(dataset.get("shard_size", 0))
        epochs, batch = int(dataset.get("epochs", 1)), int(dataset.get("global_batch", 0))
    except (TypeError, ValueError):
        return None
    if size <= 0 or shard <= 0 or batch <= 0:
        return None
    return math.ceil(size / shard) * max(epochs, 1) * shard // batch


def inherit_params(policy_text: str, recorded_policy: str) -> str:
    """``policy_text`` with the recorded policy's parameters it does not name, when
    both are the same policy (the same name or module:Class); else it unchanged."""

    def split(text: str) -> tuple[str, list[tuple[str, str]]]:
        head, _, rest = text.strip().partition(":")
        if head not in BUILTIN_POLICIES:  # module:Class[:params]
            cls, _, rest = rest.partition(":")
            head = f"{head}:{cls}"
        pairs = [item.partition("=") for item in rest.split(",") if item.strip()]
        return head, [(k.strip(), v.strip()) for k, _, v in pairs]

    name, given = split(policy_text)
    recorded_name, recorded = split(recorded_policy) if recorded_policy else ("", [])
    if name != recorded_name:
        return policy_text
    named = {k for k, _ in given}
    merged = [(k, v) for k, v in recorded if k not in named] + given
    return name + (":" + ",".join(f"{k}={v}" for k, v in merged) if merged else "")


def _from_recorded(row: ActionRow) -> DecidedAction:
    return DecidedAction(
        at_s=row.at_s, action=row.name, target=row.target(), reason=row.reason, fields=row.fields
    )


def _from_action(action: Action, at: float) -> DecidedAction:
    fields = {k: v for k, v in action_fields(action).items() if k != "inputs"}
    row = ActionRow(
        at_s=at, name=str(fields.pop("action")), reason=str(fields.pop("reason", "")), fields=fields
    )
    return _from_recorded(row)


def _batches(steps: list[StepRow]) -> list[tuple[float, int, list[StepRow]]]:
    """Steps grouped back into the messages that carried them: (arrival, rank, rows)."""
    groups: dict[tuple[float, int], list[StepRow]] = {}
    for row in steps:
        groups.setdefault((row.arrived_s, row.rank), []).append(row)
    return sorted(((at, rank, rows) for (at, rank), rows in groups.items()), key=lambda g: g[0])


def what_if(
    events: Iterable[Event],
    policy_text: str,
    *,
    control_interval: float,
    tick_s: float,
    recorded_policy: str = "",
    spare_hosts: list[str] | None = None,
    initial_remaining: int | None = None,
    host_devices: Mapping[str, WorkerDevice] | None = None,
) -> WhatIf:
    """Re-run ``policy_text`` over a run's recorded reports (see module doc).

    Raises:
        ConfigError: ``policy_text`` is not a valid policy.
        ValueError: ``control_interval`` or ``tick_s`` is not a positive number.
    """
    if not (control_interval > 0 and tick_s > 0):
        raise ValueError(f"control interval and tick must be > 0, got {control_interval}, {tick_s}")
    run = read_run(events)
    recorded_policy = recorded_policy or run.policy
    policy_text = inherit_params(policy_text, recorded_policy)
    policy = parse_policy(policy_text)
    if policy.name == "auto":
        raise ConfigError(
            "replay --policy auto cannot re-decide a run: auto plans from every "
            "process's CPU use at each decision, which the event log keeps only as a "
            "sample every 15 s; each plan auto made is a decision event with its "
            "inputs and predicted throughput (dtlaunch replay RUN_DIR lists them)"
        )
    controller = Controller(
        policy,
        interval=control_interval,
        spare_hosts=spare_hosts or [],
        host_devices=host_devices,
    )
    would, decisions, skipped = _simulate(run, controller, tick_s, initial_remaining)
    return WhatIf(
        policy=policy_text,
        recorded_policy=recorded_policy,
        control_interval_s=control_interval,
        would=would,
        actual=[_from_recorded(a) for a in run.actions],
        decisions=decisions,
        skipped_reports=skipped,
    )


def tick_times(run: RecordedRun, tick_s: float) -> list[float]:
    """When the run's control loop ticked: on each supervisor's recorded grid
    (``control_schedule``: its time + k x its tick, until the next supervisor's),
    before any (a run recorded without one) every ``tick_s`` from the first event."""
    grids = sorted(run.control_grids)
    ends = [at for at, _ in grids[1:]] + [run.end_s] * bool(grids)
    first = grids[0][0] if grids else run.end_s
    out = [k * tick_s for k in range(1, int(first / tick_s) + 1) if k * tick_s < first]
    for (anchor, tick), until in zip(grids, ends, strict=True):
        out += [anchor + k * tick for k in range(1, int((until - anchor) / tick) + 1)]
    return [at for at in out if at <= run.end_s]


def _simulate(
    run: RecordedRun, controller: Controller, tick_s: float, remaining: int | None
) -> tuple[list[DecidedAction], int, int]:
    # Everything that happens, in time order; at one instant observations come
    # before the tick (0 < 1), as a message handled just before a tick would.
    timeline: list[tuple[float, int, Any]] = []
    for at, rank, rows in _batches(run.steps):
        timeline.append((at, 0, ("reports", rank, rows)))
    for at, rank in run.worker_ends:
        timeline.append((at, 0, ("gone", rank, None)))
    for shard in run.shards:
        timeline.append((shard.at_s, 0, ("remaining", shard.remaining_steps, None)))
    for at, rank, host in run.worker_spawns:
        timeline.append((at, 0, ("host", rank, host)))
    for row in run.server_updates:
        timeline.append((row.arrived_s, 0, ("server", row.rank, row)))
    for at, version, servers, sizes, owner in run.placements:
        layout = PsLayout(version=version, servers=servers, block_bytes=sizes, owner=owner)
        timeline.append((at, 0, ("placement", 0, layout)))
    for at, pause_s in run.reassign_costs:
        timeline.append((at, 0, ("reassigned", 0, pause_s)))
    start = run.first_running_s if run.first_running_s is not None else 0.0
    timeline += [(at, 1, None) for at in tick_times(run, tick_s) if at >= start]
    timeline.sort(key=lambda item: (item[0], item[1]))
    would: list[DecidedAction] = []
    decisions = skipped = 0
    hosts: dict[int, str] = {}  # rank -> where it runs at this point of the timeline
    for at, order, item in timeline:
        if order == 1:
            if controller.due(at):
                decisions += 1
            decided = controller.decide(at, remaining_steps=remaining, worker_hosts=hosts or None)
            for action in decided:
                would.append(_from_action(action, at))
            controller.reassignment_over()  # listed, not carried out (module doc)
            continue
        what, key, rows = item
        if what == "reports":
            reports = StepReports(
                step=[r.step for r in rows],
                batch_size=[r.batch_size for r in rows],
                compute_s=[r.compute_s for r in rows],
                comm_s=[r.comm_s for r in rows],
                samples=[r.samples for r in rows],
                age_s=[max(0.0, at - r.at_s) for r in rows],
                injected_s=[r.injected_s for r in rows],
                servers=(
                    [
                        [ServerComm(server=j, nbytes=b, comm_s=t) for j, b, t in r.servers]
                        for r in rows
                    ]
                    if any(r.servers for r in rows)
                    else []
                ),
            )
            try:
                controller.observe(key, reports, at)
            except ValueError:
                skipped += len(reports)
        elif what == "server":
            updates = [
                PsUpdate(version=v, step=v, update_s=u, samples=0, applied=[])
                for v, u in zip(rows.version, rows.update_s, strict=True)
            ]
            ages = [max(0.0, at - ended) for ended in rows.ended_s]
            controller.observe_server(key, updates, at, ages=ages)
        elif what == "gone":
            controller.worker_gone(key)
        elif what == "host":
            hosts[key] = rows
        elif what == "placement":
            controller.placement_changed(rows)
        elif what == "reassigned":  # the run's measured pause: the next one's price
            controller.reassignment_over(rows)
        elif key is not None:
            remaining = key
    return would, decisions, skipped


def _cell(action: DecidedAction | None) -> Text:
    if action is None:
        return Text("")
    text = Text(action.action, style="bold")
    if action.target:
        text.append(f" {action.target}")
    if action.reason:
        reason = action.reason
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 3] + "..."
        text.append(f"\n{reason}", style="dim")
    return text


def paired_rows(
    result: WhatIf,
) -> list[tuple[float, DecidedAction | None, DecidedAction | None]]:
    """(time, recorded, what-if) rows in time order. A recorded and a what-if
    action of the same kind less than half a control interval apart share a row."""
    tolerance = result.control_interval_s / 2
    open_recorded = list(result.actual)
    rows: list[tuple[float, DecidedAction | None, DecidedAction | None]] = []
    for mine in result.would:
        match = next(
            (
                a
                for a in open_recorded
                if a.action == mine.action and abs(a.at_s - mine.at_s) <= tolerance
            ),
            None,
        )
        if match is not None:
            open_recorded.remove(match)
        rows.append((min(mine.at_s, match.at_s) if match else mine.at_s, match, mine))
    rows += [(a.at_s, a, None) for a in open_recorded]
    return sorted(rows, key=lambda row: row[0])


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())) or "no action"


def render_what_if(result: WhatIf) -> RenderableType:
    """The side-by-side table and a one-line tally per side."""
    recorded = result.recorded_policy or "?"
    table = Table(
        title=f"what-if: {result.policy} over the run recorded with {recorded}",
        title_justify="left",
        show_lines=True,
    )
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column(f"taken ({recorded})", ratio=1, overflow="fold")
    table.add_column(f"would take ({result.policy})", ratio=1, overflow="fold")
    for at, taken, would in paired_rows(result):
        table.add_row(format_elapsed(at), _cell(taken), _cell(would))
    if not result.would and not result.actual:
        table.add_row("", Text("no action", style="dim"), Text("no action", style="dim"))
    tally = Text()
    tally.append("taken: ", style="bold")
    tally.append(_counts_text(result.counts("actual")))
    tally.append("   would take: ", style="bold")
    tally.append(_counts_text(result.counts("would")))
    tally.append(
        f"   ({result.decisions} decisions every {result.control_interval_s:g} s)", style="dim"
    )
    caveat = Text(
        "(the reports are what happened under the actions taken; "
        "the effects of other actions are not simulated)",
        style="dim",
    )
    parts: list[RenderableType] = [table, tally, caveat]
    if result.skipped_reports:
        parts.append(
            Text(f"{result.skipped_reports} malformed step reports skipped", style="yellow")
        )
    return Group(*parts)
