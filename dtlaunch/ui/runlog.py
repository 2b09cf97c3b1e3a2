"""A recorded run as tables of numbers: what ``replay --plot`` and ``--policy`` read.

Pure: events in, a :class:`RecordedRun` out. Every time is seconds since the run's
first event on the wall clock, as in the timeline, because a resumed supervisor
restarts its monotonic clock; within one supervisor ``wall - mono`` is constant,
so an event's ``mono``-based times (a report's ``t``) convert exactly.

The events used (see the supervisor and the DDS service for their fields):
``reports`` (columns of a worker's step reports), ``decision`` with an ``action``,
``shards_done`` (shards a worker finished, with the remaining steps), worker
``exit`` (the Monitor forgets a worker that ends), ``control_schedule`` (the
grid a supervisor's control loop ticks on) and ``server_reports`` (each
server's applied updates, for nd's server judgement).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dtlaunch.events import Event, resource_samples

_REPORT_COLUMNS = ("step", "batch_size", "compute_s", "comm_s", "samples", "injected_s", "t")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    """One training step of one worker."""

    at_s: float  # when the step ended
    arrived_s: float  # when its report reached the supervisor (reports come batched)
    rank: int
    step: int
    batch_size: int
    compute_s: float
    comm_s: float
    samples: int
    injected_s: float
    # PS mode: (server, bytes, seconds) of the step's exchanges with each server
    servers: tuple[tuple[int, int, float], ...] = ()

    @property
    def bpt_s(self) -> float:
        """Batch processing time: compute plus communication (AntDT §II)."""
        return self.compute_s + self.comm_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRow:
    """A decision the Controller took (not ``NONE``)."""

    at_s: float
    name: str  # ADJUST_BS, KILL_RESTART, ...
    reason: str
    fields: dict[str, Any]  # the decision event's data without ``inputs``

    def target(self) -> str:
        """Short description of what the action changes."""
        if "rank" in self.fields:
            where = self.fields.get("target_host")
            onto = f" onto {where}" if where else ""
            return f"{self.fields.get('role', 'worker')} {self.fields['rank']}{onto}"
        if "sizes" in self.fields:
            sizes = self.fields["sizes"]
            listed = " ".join(f"{r}:{b}" for r, b in sorted(sizes.items(), key=_rank_key))
            return f"sizes {listed} @step {self.fields.get('apply_at_step', '?')}"
        if "factors" in self.fields:
            return f"lr factors @step {self.fields.get('apply_at_step', '?')}"
        if "count" in self.fields:
            return f"{self.fields['count']} backup worker(s)"
        return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardsRow:
    at_s: float
    rank: int
    count: int
    remaining_steps: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerUpdatesRow:
    """One ``server_reports`` event: what the supervisor learnt of a server at once."""

    arrived_s: float  # when the supervisor took them
    rank: int
    ended_s: tuple[float, ...]  # when each update ended
    version: tuple[int, ...]
    update_s: tuple[float, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRun:
    steps: list[StepRow]  # ordered by time
    actions: list[ActionRow]
    shards: list[ShardsRow]
    worker_ends: list[tuple[float, int]]  # (time, rank) of every worker exit
    first_running_s: float | None  # when the first worker ran (the Controller starts then)
    end_s: float  # time of the last event
    policy: str  # from the decisions ("" when none was taken)
    malformed: int = 0  # reports and server_reports events whose columns did not fit together
    workers: list[int] = field(default_factory=list)
    # (time, rank, host) of every worker spawn, in time order: where each runs when
    worker_spawns: list[tuple[float, int, str]] = field(default_factory=list)
    # proc id -> (time, RSS bytes, CPU %, memory limit) from the "resources" samples
    resources: dict[str, list[tuple[float, int, float, int]]] = field(default_factory=dict)
    # PS mode: every placement map the job followed (the first worker's, then each
    # reassignment's), as (time, version, servers, block bytes, owner per block)
    placements: list[tuple[float, int, int, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list
    )
    # (time, pause s) of every reassignment carried out: what the next one costs
    reassign_costs: list[tuple[float, float]] = field(default_factory=list)
    # (time, tick) of each supervisor's decision grid: it ticks at time + k x tick
    control_grids: list[tuple[float, float]] = field(default_factory=list)
    server_updates: list[ServerUpdatesRow] = field(default_factory=list)  # in time order

    @property
    def worker_hosts(self) -> dict[int, str]:
        """rank -> the host of its last spawn."""
        return {rank: host for _, rank, host in self.worker_spawns}

    def steps_of(self, rank: int) -> list[StepRow]:
        return [s for s in self.steps if s.rank == rank]

    def shards_by_worker(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for row in self.shards:
            out[row.rank] = out.get(row.rank, 0) + row.count
        return out

    def throughput_by_worker(self) -> dict[int, float]:
        """Samples per second of step time, per worker, over the whole run."""
        out: dict[int, float] = {}
        for rank in self.workers:
            rows = self.steps_of(rank)
            busy = sum(r.bpt_s for r in rows)
            if busy > 0:
                out[rank] = sum(r.samples for r in rows) / busy
        return out


def _rank_key(item: tuple[Any, Any]) -> int:
    try:
        return int(item[0])
    except (TypeError, ValueError):
        return 0


def _step_rows(event: Event, offset: float, arrived: float) -> list[StepRow] | None:
    """The rows of one ``reports`` event; None when its columns are malformed."""
    data = event.data
    columns = [data.get(name) for name in _REPORT_COLUMNS]
    if not all(isinstance(c, list) for c in columns):
        return None
    lengths = {len(c) for c in columns if isinstance(c, list)}
    if len(lengths) != 1:
        return None
    rows: list[StepRow] = []
    servers = data.get("servers")
    if not (isinstance(servers, list) and len(servers) == len(columns[0] or [])):
        servers = [[] for _ in columns[0] or []]
    try:
        for (step, batch, compute, comm, samples, injected, t), exchanges in zip(
            zip(*columns, strict=True), servers, strict=True
        ):
            row = StepRow(
                at_s=float(t) + offset,
                arrived_s=arrived,
                rank=event.rank,
                step=int(step),
                batch_size=int(batch),
                compute_s=float(compute),
                comm_s=float(comm),
                samples=int(samples),
                injected_s=float(injected),
                servers=tuple((int(j), int(b), float(sec)) for j, b, sec in exchanges),
            )
            if not all(math.isfinite(v) for v in (row.at_s, row.compute_s, row.comm_s)):
                return None
            rows.append(row)
    except (TypeError, ValueError):
        return None
    return rows


def read_run(events: Iterable[Event]) -> RecordedRun:
    """Collect the numbers of a run's events (see module doc)."""
    origin: float | None = None
    steps: list[StepRow] = []
    actions: list[ActionRow] = []
    shards: list[ShardsRow] = []
    ends: list[tuple[float, int]] = []
    first_running: float | None = None
    spawns: list[tuple[float, int, str]] = []
    policy = ""
    malformed = 0
    end = 0.0
    resources: dict[str, list[tuple[float, int, float, int]]] = {}
    placements: list[tuple[float, int, int, tuple[int, ...], tuple[int, ...]]] = []
    grids: list[tuple[float, float]] = []
    server_updates: list[ServerUpdatesRow] = []
    reassign_costs: list[tuple[float, float]] = []
    for event in events:
        if origin is None:
            origin = event.wall
        at = event.wall - origin
        end = max(end, at)
        if event.kind == "reports":
            rows = _step_rows(event, event.wall - event.mono - origin, at)
            if rows is None:
                malformed += 1
            else:
                steps += rows
        elif event.kind == "decision" and "action" in event.data:
            fields = {k: v for k, v in event.data.items() if k != "inputs"}
            if event.rank >= 0:  # a node action's role and rank are the event's own
                fields.update(role=event.role, rank=event.rank)
            policy = policy or str(fields.get("policy", ""))
            actions.append(
                ActionRow(
                    at_s=at,
                    name=str(fields.pop("action")),
                    reason=str(fields.pop("reason", "")),
                    fields=fields,
                )
            )
        elif event.kind == "shards_done":
            remaining = event.data.get("remaining_steps")
            shards.append(
                ShardsRow(
                    at_s=at,
                    rank=event.rank,
                    count=int(event.data.get("count", 0) or 0),
                    remaining_steps=int(remaining) if remaining is not None else None,
                )
            )
        elif event.kind == "exit" and event.role == "worker":
            ends.append((at, event.rank))
        elif event.kind == "resources":
            for proc_id, rss, cpu, limit in resource_samples(event):
                resources.setdefault(proc_id, []).append((at, rss, cpu, limit))
        elif event.kind == "running" and event.role == "worker" and first_running is None:
            first_running = at
        elif event.kind == "control_schedule":
            tick = event.data.get("tick_s")
            if isinstance(tick, int | float) and math.isfinite(tick) and tick > 0:
                grids.append((at, float(tick)))
        elif event.kind == "server_reports":
            row = _server_updates(event, event.wall - event.mono - origin, at)
            if row is None:
                malformed += 1
            else:
                server_updates.append(row)
        elif event.kind == "ps_placement":
            placement = _placement(event)
            if placement is not None:
                placements.append((at, *placement))
        elif event.kind in ("ps_reassign", "ps_scale") and event.data.get("phase") == "done":
            pause = event.data.get("pause_s")
            if isinstance(pause, int | float) and math.isfinite(pause) and pause >= 0:
                reassign_costs.append((at, float(pause)))
        if event.kind in ("spawn", "adopted") and event.role == "worker" and event.host:
            spawns.append((at, event.rank, event.host))
    steps.sort(key=lambda r: r.at_s)
    workers = sorted({s.rank for s in steps} | {s.rank for s in shards})
    return RecordedRun(
        steps=steps,
        actions=actions,
        shards=shards,
        worker_ends=ends,
        first_running_s=first_running,
        end_s=end,
        policy=policy,
        malformed=malformed,
        workers=workers,
        worker_spawns=spawns,
        resources=resources,
        placements=placements,
        reassign_costs=reassign_costs,
        control_grids=grids,
        server_updates=server_updates,
    )


def _server_updates(event: Event, offset: float, arrived: float) -> ServerUpdatesRow | None:
    """The updates of one ``server_reports`` event; None when malformed."""
    ended, version, update = (event.data.get(k) for k in ("t", "version", "update_s"))
    if not (isinstance(ended, list) and isinstance(version, list) and isinstance(update, list)):
        return None
    if not len(ended) == len(version) == len(update):
        return None
    try:
        row = ServerUpdatesRow(
            arrived_s=arrived,
            rank=event.rank,
            ended_s=tuple(float(t) + offset for t in ended),
            version=tuple(map(int, version)),
            update_s=tuple(map(float, update)),
        )
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and v >= 0 for v in row.update_s + row.ended_s):
        return None
    return row


def _placement(event: Event) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
    """(version, servers, block bytes, owners) of a ``ps_placement`` event (None:
    a run recorded before the events carried the blocks, or malformed)."""
    sizes, owner = event.data.get("block_bytes"), event.data.get("owner")
    if not isinstance(sizes, list) or not isinstance(owner, list) or len(sizes) != len(owner):
        return None
    try:
        version, servers = int(event.data.get("version", 0)), int(event.data.get("servers", 0))
        owners = tuple(map(int, owner))
        if any(not 0 <= j < servers for j in owners):
            return None
        return version, servers, tuple(map(int, sizes)), owners
    except (TypeError, ValueError):
        return None
