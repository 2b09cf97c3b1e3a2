"""What a resumed supervisor learns from the event log of the run it takes over.

The event log is not the source of truth for data (the DDS WAL is); it is the
record of processes: which attempt each rank is on, the restarts and failures
so far, and how long the job had run. A torn last line is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtlaunch.events import read_events
from dtlaunch.supervisor.jobstate.nodes import FailureRecord, RestartRecord


@dataclass(slots=True, kw_only=True)
class OpenResize:
    """An allreduce group's resize (``dtlaunch scale``) that had begun and not
    ended when the supervisor stopped: a resumed one carries it on."""

    gen: int
    workers: int  # the size it resizes to
    was: int  # the size of the group until it is done
    joining: list[int]
    leaving: list[int]
    announced: bool = False  # the workers were sent the Regroup
    store: tuple[str, int] | None = None  # where the survivors' store listens, once up


@dataclass(slots=True, kw_only=True)
class History:
    attempts: dict[str, int] = field(default_factory=dict)  # proc id -> last attempt spawned
    # proc id -> host of its last spawn (a KILL_RESTART may have moved it to a spare host)
    hosts: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)  # proc id -> GPU of its last spawn
    # proc id -> (host, port) a listening process's last spawn bound (PS server, TF task)
    listen_ports: dict[str, tuple[str, int]] = field(default_factory=dict)
    # proc id -> (memory limit of its next attempt, how often an OOM raised it)
    memory_limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    restarts: list[RestartRecord] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    elapsed_s: float = 0.0  # supervised time before this supervisor took over
    first_wall: float = 0.0  # Unix time of the run's first event: JCT counts from here
    resumes: int = 0
    rna_gen: int = 0  # the newest RNA group generation any supervisor of the run opened
    # dtlaunch scale, in order: (workers from then on, {rank it added: host})
    scales: list[tuple[int, dict[int, str]]] = field(default_factory=list)
    # dtlaunch scale --servers, in order: (rank, host it was added on) or (rank, "")
    # for one drained and stopped; and the servers the job should run (None: as
    # started).
    server_changes: list[tuple[int, str]] = field(default_factory=list)
    server_target: int | None = None
    regroup_gen: int = 0  # the newest allreduce regroup generation of the run
    open_resize: OpenResize | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumePlan:
    """How a resumed supervisor takes its job over."""

    history: History  # from the event log
    adopt: set[str]  # hosts whose running agents reconnect instead of being launched
    restart_workers: str = ""  # non-empty: why every worker must restart (a WAL repair)
    # Ranks a `dtlaunch scale` removed: whatever data they held goes back.
    released_workers: tuple[int, ...] = ()
    # Ranks an open resize removes that still finish their shard: rank -> (host,
    # attempt); they keep their data and leave as the resize goes on.
    leaving: dict[int, tuple[str, int]] = field(default_factory=dict)


def load_history(events_path: Path) -> History:
    history = History()
    if not events_path.exists():
        return history
    offset = 0.0  # each supervisor's monotonic clock starts at 0
    for event in read_events(events_path):
        if not history.first_wall:
            history.first_wall = event.wall
        if event.kind == "resume":
            offset = history.elapsed_s
            history.resumes += 1
        at = round(offset + event.mono, 3)
        history.elapsed_s = max(history.elapsed_s, at)
        proc_id = f"{event.role}-{event.rank}"
        if event.kind == "scale":
            added = {int(r): str(h) for r, h in dict(event.data.get("added", {})).items()}
            history.scales.append((int(event.data["workers"]), added))
        if event.kind == "scale_servers":
            history.server_target = int(event.data["servers"])
            added = dict(event.data.get("added", {}))
            history.server_changes += [(int(r), str(h)) for r, h in sorted(added.items())]
        if event.kind == "removed" and event.role == "server":
            history.server_changes.append((event.rank, ""))
        if event.kind == "regroup":
            _regroup(history, event.data)
        if event.kind == "rna_group":
            history.rna_gen = max(history.rna_gen, int(event.data.get("gen", 0)))
        if event.kind in ("spawn", "adopted"):
            attempt = int(event.data.get("attempt", 0))
            history.attempts[proc_id] = max(history.attempts.get(proc_id, 0), attempt)
            if event.host:
                history.hosts[proc_id] = event.host
            if "memory_limit" in event.data:
                _, relaunches = history.memory_limits.get(proc_id, (0, 0))
                history.memory_limits[proc_id] = (int(event.data["memory_limit"]), relaunches)
            if "port" in event.data and event.host:
                history.listen_ports[proc_id] = (event.host, int(event.data["port"]))
            if "gpu" in event.data:
                history.gpus[proc_id] = int(event.data["gpu"])
            elif event.kind == "spawn":
                history.gpus.pop(proc_id, None)
        elif event.kind == "memory_limit":
            relaunches = int(event.data.get("relaunch", 1))
            history.memory_limits[proc_id] = (int(event.data["new"]), relaunches)
        elif event.kind == "oom_servers":  # an OOM relaunch that kept the limit
            relaunches = int(event.data.get("relaunch", 1))
            history.memory_limits[proc_id] = (int(event.data["limit"]), relaunches)
        elif event.kind == "restart":
            history.restarts.append(
                RestartRecord(
                    role=event.role,
                    rank=event.rank,
                    host=event.host,
                    reason=str(event.data.get("reason", "")),
                    at_s=at,
                    attempt=int(event.data.get("attempt", 0)),
                )
            )
        elif event.kind == "failure":
            history.failures.append(
                FailureRecord(
                    role=event.role,
                    rank=event.rank,
                    host=event.host,
                    exit_code=event.data.get("exit_code"),
                    signal=event.data.get("signal"),
                    error=str(event.data.get("error", "")),
                    reason=str(event.data.get("reason", "")),
                    retryable=bool(event.data.get("retryable", True)),
                    at_s=at,
                    attempt=int(event.data.get("attempt", 0)),
                    traceback=list(event.data.get("traceback", [])),
                )
            )
    return history


def _regroup(history: History, data: dict[str, Any]) -> None:
    """Follow the allreduce regroups: their generations, and a resize still open."""
    gen, phase = int(data.get("gen", 0)), data.get("phase")
    history.regroup_gen = max(history.regroup_gen, gen)
    if phase in ("prewarm", "begin") and "joining" in data:  # a resize begins
        history.open_resize = OpenResize(
            gen=gen,
            workers=int(data["workers"]),
            was=int(data["was"]),
            joining=[int(r) for r in data["joining"]],
            leaving=[int(r) for r in data.get("leaving", [])],
            announced=phase == "begin",
        )
        return
    resize = history.open_resize
    if resize is None or gen != resize.gen:
        return
    if phase == "begin":
        resize.announced = True
    elif phase == "store":
        addr, _, port = str(data.get("store", "")).rpartition(":")
        resize.store = (addr, int(port)) if port.isdigit() else None
    elif phase in ("done", "abandoned", "cancelled"):
        history.open_resize = None
