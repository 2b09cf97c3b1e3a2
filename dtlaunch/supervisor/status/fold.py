"""Job events folded into what ``dtlaunch status`` shows; I/O-free.

``StatusFold`` is an event sink: the supervisor hands it every event as it emits
it, and ``dtlaunch status`` replays ``events.jsonl`` of an ended job through it,
so the live view and the after-the-fact view come from the same rules. What it
keeps is bounded (a few dozen BPT points per node, the last actions), so a
week-long job costs the supervisor no more memory than a minute-long one.

Step data comes from the ``reports`` events (one per batch of step reports a worker
sends, about once a second): one sparkline point each. In PS mode their per-server
exchanges give each server's fitted speed (PSLD's ``Pred``), ``ps_placement`` events
the bytes each server holds.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dtlaunch.errors import InfeasibleError
from dtlaunch.events import Event, resource_samples
from dtlaunch.solvers.psld import fit_server
from dtlaunch.supervisor.control.monitor import fast_reference
from dtlaunch.supervisor.status.nodetrack import (
    SPARK_POINTS,
    NodeTrack,
    Resources,
    report_point,
    server_point,
)
from dtlaunch.supervisor.status.rounds import RoundRates
from dtlaunch.wire.messages import ActionStatus, NodeStatus, StatusSnapshot

ACTIONS_KEPT = 20
ETA_WINDOW_S = 60.0  # shard completion rate over this much recent time
STALE_S = 10.0  # live: a worker silent this long counts as not running
THROUGHPUT_WINDOW_S = 10.0  # live global throughput: samples trained over this much time
# Sparkline floats per snapshot: 40 points a node up to 250 nodes, 10 at 1,000
# (a screen shows a few dozen rows; the snapshot is built, sent and parsed whole).
FLOAT_BUDGET = 10_000
DEFAULT_LAMBDA = 1.5  # as the built-in policies (policies.base.DEFAULT_LAMBDA)
EXCHANGES_KEPT = 64  # per server: (bytes held, seconds) of the newest worker steps

NodeKey = tuple[str, int]  # (role, rank)


class StatusFold:
    """Folds events into nodes, progress and the last actions; see module doc."""

    def __init__(self, *, run_id: str = "", policy: str = "", mode: str = "") -> None:
        self.run_id = run_id
        self.policy = policy
        self.mode = mode
        self.phase = "starting"
        self.status = ""
        self.now = 0.0  # the newest event's time (event-log seconds)
        self.shards_done = 0
        self.shards_total = 0
        self.samples_total = 0
        self.nodes: dict[NodeKey, NodeTrack] = {}
        self.actions: deque[ActionStatus] = deque(maxlen=ACTIONS_KEPT)
        self._done_history: deque[tuple[float, int]] = deque()
        self._samples_history: deque[tuple[float, int]] = deque()  # (step end, samples)
        self._samples_recent = 0  # the sum of the history's samples
        self._first_report_t: float | None = None
        self.ps_map_version = 0
        self.rna_groups: list[list[int]] = []  # hierarchical RNA's groups ([]: one group)
        self._ps_bytes: dict[int, int] = {}  # server -> bytes of its blocks in the map
        self._exchanges: dict[int, deque[tuple[float, float]]] = {}
        self.rounds = RoundRates()  # --policy rna

    # ------------------------------------------------------------- input

    def emit(self, event: Event) -> None:
        """Take one event (the ``EventSink`` protocol)."""
        self.now = max(self.now, event.mono)
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, event)

    def emit_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.emit(event)

    def node(self, role: str, rank: int) -> NodeTrack:
        key = (role, rank)
        track = self.nodes.get(key)
        if track is None:
            track = self.nodes[key] = NodeTrack(role=role, rank=rank)
        return track

    def _proc(self, event: Event, state: str | None = None) -> NodeTrack | None:
        if event.role not in ("worker", "server") or event.rank < 0:
            return None
        track = self.node(event.role, event.rank)
        if event.host:
            track.host = event.host
        if state is not None:
            track.state = state
        return track

    def _job_start(self, event: Event) -> None:
        data = event.data
        self.run_id = str(data.get("run_id", self.run_id))
        self.mode = str(data.get("mode", self.mode))
        self.phase = "running"
        for role, count in (("worker", data.get("workers")), ("server", data.get("servers"))):
            for rank in range(count if isinstance(count, int) else 0):
                self.node(role, rank)

    def _running(self, event: Event) -> None:
        if (track := self._proc(event, "running")) is not None:
            track.since = event.mono

    def _exit(self, event: Event) -> None:
        data = event.data
        track = self.nodes.get((event.role, event.rank))
        if data.get("removed") or (data.get("retired") and track is not None and track.removed):
            # A scale-down's worker, or a server a scale-in drained: no longer the job's.
            self.nodes.pop((event.role, event.rank), None)
        elif data.get("retired"):
            return  # a replaced process: its successor's row is the rank's
        elif data.get("exit_code") == 0:
            self._proc(event, "succeeded")
        else:
            self._proc(event, "stopped" if data.get("requested") else "failed")

    def _removed(self, event: Event) -> None:
        if (track := self._proc(event, "stopping")) is not None:
            track.removed = True

    def _restart(self, event: Event) -> None:
        track = self._proc(event, "pending")
        if track is not None:
            track.restarts += 1

    def _reports(self, event: Event) -> None:
        track = self._proc(event)
        point = report_point(event.data, event.mono)
        if track is None or point is None:
            return
        track.points.append(point)
        sizes = event.data.get("batch_size")
        if isinstance(sizes, list) and sizes and isinstance(sizes[-1], int):
            track.batch_size = sizes[-1]
        self.samples_total += point.samples
        exchanges = event.data.get("servers")
        if isinstance(exchanges, list):
            self._note_exchanges(exchanges)
        if track.role == "worker":
            if self._first_report_t is None:
                self._first_report_t = point.t
            self._samples_history.append((point.t, point.samples))
            self._samples_recent += point.samples
            self._forget_samples_before(point.t - THROUGHPUT_WINDOW_S, inclusive=False)

    def _note_exchanges(self, steps: list[Any]) -> None:
        """Each step's [server, bytes, seconds]: the bytes went both ways (pull and
        push), so a sample is (bytes held, seconds), as the psld policy fits it."""
        for step in steps:
            for exchange in step if isinstance(step, list) else ():
                try:
                    server, nbytes, seconds = (
                        int(exchange[0]),
                        float(exchange[1]),
                        float(exchange[2]),
                    )
                except (TypeError, ValueError, IndexError):
                    continue
                kept = self._exchanges.get(server)
                if kept is None:
                    kept = self._exchanges[server] = deque(maxlen=EXCHANGES_KEPT)
                kept.append((nbytes / 2, seconds))

    def _placement(self, event: Event) -> None:
        version, loads = event.data.get("version"), event.data.get("bytes_per_server")
        if isinstance(version, int) and isinstance(loads, list):
            self.ps_map_version = version
            self._ps_bytes = {j: int(b) for j, b in enumerate(loads) if isinstance(b, int)}

    def _partition(self, event: Event) -> None:
        groups = event.data.get("groups")
        if "refused" not in event.data and isinstance(groups, list):
            self.rna_groups = [list(g) for g in groups] if len(groups) > 1 else []

    def server_speed(self, server: int) -> float:
        """Bytes/s of ``server`` at its load, from the fit of its recent exchanges
        (0.0: not enough of them, or no load known)."""
        kept, load = self._exchanges.get(server), self._ps_bytes.get(server, 0)
        if not kept or len(kept) < 2 or load <= 0:
            return 0.0
        try:
            speed = fit_server([b for b, _ in kept], [t for _, t in kept]).speed(load)
        except InfeasibleError:
            return 0.0
        return speed if speed < float("inf") else 0.0

    def _resources(self, event: Event) -> None:
        """A sample of every running process's RSS, CPU and memory limit."""
        for proc_id, rss, cpu, limit in resource_samples(event):
            role, _, rank = proc_id.rpartition("-")
            if role in ("worker", "server") and rank.isdigit():
                self.node(role, int(rank)).resources = Resources(
                    memory_bytes=rss, memory_limit=limit, cpu_percent=cpu, cpu_limit=0.0
                )

    def _server_reports(self, event: Event) -> None:
        """A server's update times (T_s) stand in for its BPT."""
        track = self._proc(event)
        point = server_point(event.data, event.mono)
        if track is not None and point is not None:
            track.points.append(point)

    def _shards_done(self, event: Event) -> None:
        track = self._proc(event)
        count = event.data.get("count", 0)
        if track is not None and isinstance(count, int):
            track.shards_done += count
        self._progress(event)

    def _progress(self, event: Event) -> None:
        done, total = event.data.get("done"), event.data.get("total")
        if isinstance(done, int) and isinstance(total, int):
            self.shards_done, self.shards_total = done, total
            self._done_history.append((event.mono, done))
            while self._done_history and self._done_history[0][0] < event.mono - ETA_WINDOW_S:
                self._done_history.popleft()

    def _decision(self, event: Event) -> None:
        data = event.data
        if event.rank >= 0:
            # A node action's role and rank are the event's own (KILL_RESTART).
            data = {**data, "role": event.role, "rank": event.rank}
        action = data.get("action")
        if not isinstance(action, str):
            # The job's own decision to end (JobState), not a policy's.
            status = str(data.get("status", ""))
            self.actions.append(
                ActionStatus(
                    at_s=event.mono, action="END", target=status, reason=str(data.get("reason", ""))
                )
            )
            return
        self.actions.append(
            ActionStatus(
                at_s=event.mono,
                action=action,
                target=action_target(data),
                reason=str(data.get("reason", "")),
            )
        )
        self._note_action(action, data, event.mono)

    def _note_action(self, action: str, data: Mapping[str, Any], at: float) -> None:
        """Remember, per node, the latest action that singled it out."""
        if action == "KILL_RESTART" and isinstance(data.get("rank"), int):
            track = self.node(str(data.get("role", "worker")), data["rank"])
            # The row's host turns to the new one as soon as it spawns; say where from.
            target = data.get("target_host") or track.host
            move = f" from {track.host} onto {target}" if target != track.host else ""
            track.action_note = f"KILL_RESTART at {at:.0f} s{move}"
        elif action == "ADJUST_BS" and isinstance(data.get("sizes"), dict):
            inputs = data.get("inputs")
            current = inputs.get("current_sizes") if isinstance(inputs, dict) else None
            current = current if isinstance(current, dict) else {}
            for rank_text, size in data["sizes"].items():
                before = current.get(rank_text, current.get(str(rank_text)))
                if isinstance(before, int) and isinstance(size, int) and size < before:
                    track = self.node("worker", int(rank_text))
                    track.action_note = f"ADJUST_BS at {at:.0f} s: batch {before} -> {size}"

    def _stall(self, event: Event) -> None:
        """The stall watchdog fired: shown among the actions, with whom it restarts."""
        procs = event.data.get("procs") or []
        stuck = ", ".join(str(p.get("proc", "?")) for p in procs if isinstance(p, dict))
        self.actions.append(
            ActionStatus(
                at_s=event.mono,
                action="STALL",
                target=stuck or "-",
                reason=str(event.data.get("reason", "")),
            )
        )

    def _stall_stacks(self, event: Event) -> None:
        """Where the stuck processes were: the innermost frame joins the STALL line."""
        stacks = event.data.get("stacks")
        where = [
            f"{proc} in {entry['frames'][0]}"
            for proc, entry in sorted(stacks.items() if isinstance(stacks, dict) else [])
            if isinstance(entry, dict) and entry.get("frames")
        ]
        for index in range(len(self.actions) - 1, -1, -1):
            action = self.actions[index]
            if action.action == "STALL" and where:
                reason = f"{action.reason}; {'; '.join(where)}"
                self.actions[index] = dataclasses.replace(action, reason=reason)
                break

    def _job_end(self, event: Event) -> None:
        self.phase = "done"
        self.status = str(event.data.get("status", ""))

    def _stopping(self, event: Event) -> None:
        if self.phase != "done":
            self.phase = "stopping"

    # ------------------------------------------------------------ output

    def eta(self, now: float) -> float | None:
        """Seconds until every shard is DONE at the recent rate (None: unknown)."""
        if self.shards_total <= 0:
            return None
        remaining = self.shards_total - self.shards_done
        if remaining <= 0:
            return 0.0
        # The history is in time order: drop what fell out of the window rather
        # than scan it (a thousand acks a second keep 60,000 entries).
        history = self._done_history
        while history and history[0][0] < now - ETA_WINDOW_S:
            history.popleft()
        if len(history) < 2:
            return None
        (t0, d0), (t1, d1) = history[0], history[-1]
        span = max(now, t1) - t0
        if d1 <= d0 or span <= 0:
            return None
        return remaining / ((d1 - d0) / span)

    def throughput(self, now: float, *, live: bool) -> float:
        """Samples/s the job trains: over the last THROUGHPUT_WINDOW_S while it runs
        (wall time, so BSP waits count, unlike the per-worker rates), the mean over
        the job once it has ended."""
        if not live:
            return self.samples_total / now if now > 0 else 0.0
        if self._first_report_t is None:
            return 0.0
        span = min(THROUGHPUT_WINDOW_S, now - self._first_report_t)
        self._forget_samples_before(now - THROUGHPUT_WINDOW_S, inclusive=True)
        return self._samples_recent / span if span > 0 else 0.0

    def _forget_samples_before(self, limit: float, *, inclusive: bool) -> None:
        # From the left, while older: a running sum instead of a walk over the
        # 10,000 entries a 1,000-worker job leaves in the window at every answer.
        history = self._samples_history
        while history and (history[0][0] <= limit if inclusive else history[0][0] < limit):
            self._samples_recent -= history.popleft()[1]

    def ratio_stragglers(self, lam: float, *, running_only: bool) -> dict[NodeKey, str]:
        """Workers whose recent equal-share BPT is >= ``lam`` x the fastest
        quarter's (``monitor.fast_reference``, nd's yardstick)."""
        tracks = [
            t
            for t in self.nodes.values()
            if t.role == "worker" and t.recent() and (t.state == "running" or not running_only)
        ]
        if len(tracks) < 2:
            return {}
        batch_ref = sum(max(1, t.batch_size) for t in tracks) / len(tracks)
        eq = {(t.role, t.rank): t.bpt_eq(batch_ref) for t in tracks}
        ref = fast_reference(eq.values())
        if ref is None or ref <= 0:
            return {}
        return {
            key: f"{value / ref:.1f}x the fastest BPT of its last steps (lambda {lam:g})"
            for key, value in eq.items()
            if value >= lam * ref
        }

    def snapshot(
        self,
        *,
        now: float,
        source: str,
        stragglers: Mapping[NodeKey, str],
        states: Mapping[NodeKey, tuple[str, str, int]] | None = None,
        shards: tuple[int, int] | None = None,
        phase: str | None = None,
        resources: Mapping[NodeKey, Resources] | None = None,
    ) -> StatusSnapshot:
        """The snapshot at ``now`` (event-log seconds).

        ``states`` ((role, rank) -> (host, state, restarts)), ``shards`` (done,
        total) and ``phase`` override what the events say: a live supervisor knows
        them first-hand; so does ``resources``, each process's use and limits.
        """
        live = source == "live"
        for key in states or {}:
            self.node(*key)
        keys = sorted(self.nodes, key=lambda k: (k[0] != "worker", k[1]))
        points = max(4, min(SPARK_POINTS, FLOAT_BUDGET // max(1, len(keys))))
        if resources is None:  # from the log: each node's latest sample
            resources = {k: t.resources for k, t in self.nodes.items() if t.resources}
        nodes = [
            self._node_status(key, points, stragglers, states, now, live, resources.get(key))
            for key in keys
        ]
        done, total = shards if shards is not None else (self.shards_done, self.shards_total)
        return StatusSnapshot(
            run_id=self.run_id,
            policy=self.policy,
            mode=self.mode,
            phase=phase or self.phase,
            source=source,
            status=self.status,
            elapsed_s=max(0.0, now),
            shards_done=done,
            shards_total=total,
            throughput=self.throughput(now, live=live),
            eta_s=self.eta(now) if live else None,
            nodes=nodes,
            actions=list(self.actions),
            ps_map_version=self.ps_map_version,
            rna_rounds_per_s=round(self.rounds.per_second(now), 2),
            rna_groups=[list(g) for g in self.rna_groups],
        )

    def _node_status(
        self,
        key: NodeKey,
        points: int,
        stragglers: Mapping[NodeKey, str],
        states: Mapping[NodeKey, tuple[str, str, int]] | None,
        now: float,
        live: bool,
        use: Resources | None,
    ) -> NodeStatus:
        track = self.nodes[key]
        host, state, restarts = (states or {}).get(key, (track.host, track.state, track.restarts))
        bpt, throughput, injected = track.recent_means()
        reason = stragglers.get(key, "")
        if reason:
            if injected > 0:
                reason += f"; injected {injected:.3g} s/step"
            if track.action_note:
                reason += f"; {track.action_note}"
        fresh = not live or (track.points and now - track.points[-1].t <= STALE_S)
        return NodeStatus(
            role=track.role,
            rank=track.rank,
            host=host,
            proc_state=state,
            restarts=restarts,
            batch_size=track.batch_size,
            bpt_s=bpt,
            recent_bpt_s=[round(p.bpt, 6) for p in list(track.points)[-points:]],
            throughput=throughput if fresh else 0.0,
            shards_done=track.shards_done,
            straggler=reason,
            ps_bytes=self._ps_bytes.get(track.rank, 0) if track.role == "server" else 0,
            ps_speed=self.server_speed(track.rank) if track.role == "server" else 0.0,
            rna_share=self.rounds.shares().get(track.rank, 0.0) if track.role == "worker" else 0.0,
            **(use._asdict() if use is not None else {}),
        )


def action_target(data: Mapping[str, Any]) -> str:
    """Whom a decision touches, in a few characters."""
    action = data.get("action")
    if action == "KILL_RESTART":
        where = f" on {data['target_host']}" if data.get("target_host") else ""
        return f"{data.get('role', 'worker')} {data.get('rank', '?')}{where}"
    for name, prefix, fmt in (("sizes", "w", "{}={}"), ("factors", "w", "{}x{:.3g}")):
        values = data.get(name)
        if isinstance(values, dict):
            pairs = sorted(values.items(), key=lambda kv: int(kv[0]))
            return " ".join(prefix + fmt.format(k, v) for k, v in pairs)
    skip = {"policy", "action", "reason", "inputs", "apply_at_step"}
    return " ".join(f"{k}={v}" for k, v in data.items() if k not in skip)


def lambda_of(policy: str) -> float:
    """The ``lambda=`` parameter of a ``--policy`` text, else the built-ins' default."""
    _, _, params = policy.partition(":")
    for pair in params.split(","):
        key, _, value = pair.partition("=")
        if key.strip() == "lambda":
            try:
                return float(value)
            except ValueError:
                break
    return DEFAULT_LAMBDA


_HANDLERS: dict[str, Callable[[StatusFold, Event], object]] = {
    "job_start": StatusFold._job_start,
    "spawn": lambda fold, e: fold._proc(e, "starting"),
    "running": StatusFold._running,
    "adopted": StatusFold._running,
    "responsive": lambda fold, e: fold._proc(e, "running"),
    "unresponsive": lambda fold, e: fold._proc(e, "unresponsive"),
    "kill_restart": lambda fold, e: fold._proc(e, "stopping"),
    "added": lambda fold, e: fold._proc(e, "pending"),
    "removed": StatusFold._removed,
    "exit": StatusFold._exit,
    "failure": lambda fold, e: fold._proc(e, "failed"),
    "spawn_failed": lambda fold, e: fold._proc(e, "failed"),
    "restart": StatusFold._restart,
    "reports": StatusFold._reports,
    "resources": StatusFold._resources,
    "server_reports": StatusFold._server_reports,
    "shards_done": StatusFold._shards_done,
    "dds_recovered": StatusFold._progress,
    "decision": StatusFold._decision,
    "ps_placement": StatusFold._placement,
    "rna_rounds": lambda fold, e: fold.rounds.add(e.mono, e.data),
    "rna_partition": StatusFold._partition,
    "stall": StatusFold._stall,
    "stall_stacks": StatusFold._stall_stacks,
    "stop_requested": StatusFold._stopping,
    "job_end": StatusFold._job_end,
}
