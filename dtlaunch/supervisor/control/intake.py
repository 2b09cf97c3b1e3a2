"""Step reports of workers and servers: into the event log and the Controller.

Every report is recorded (policy or not) so that ``replay`` can plot a run and
re-decide it offline; columns keep the lines short. ``t`` is when each step
ended, in the event log's ``mono`` seconds (worker reports arrive batched).
Injected straggler delays are recorded apart (``injected``), so a benchmark can
say what it injected.
"""

from __future__ import annotations

from typing import Any

from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.control.controller import Controller
from dtlaunch.wire.messages import PsUpdate, StepReport

__all__ = ["record_server_updates", "record_worker_steps"]


def record_worker_steps(
    recorder: EventRecorder,
    controller: Controller | None,
    rank: int,
    reports: list[StepReport],
    now: float,
) -> None:
    at, ordered = recorder.elapsed(), sorted(reports, key=lambda r: r.step)
    columns: dict[str, Any] = {
        "step": [r.step for r in ordered],
        "batch_size": [r.batch_size for r in ordered],
        "compute_s": [round(r.compute_s, 6) for r in ordered],
        "comm_s": [round(r.comm_s, 6) for r in ordered],
        "samples": [r.samples for r in ordered],
        "injected_s": [round(r.injected_s, 6) for r in ordered],
        "t": [round(max(0.0, at - r.age_s), 6) for r in ordered],
    }
    if any(r.servers for r in ordered):
        # PS mode: per step, [server, bytes, seconds] of each server it exchanged with.
        columns["servers"] = [
            [[c.server, c.nbytes, round(c.comm_s, 6)] for c in r.servers] for r in ordered
        ]
    recorder.emit("reports", role="worker", rank=rank, **columns)
    injected = controller.observe(rank, reports, now) if controller is not None else 0.0
    _record_injected(recorder, "worker", rank, injected, [r.step for r in reports if r.injected_s])


def record_server_updates(
    recorder: EventRecorder,
    controller: Controller | None,
    rank: int,
    updates: list[PsUpdate],
    now: float,
    *,
    server_now: float,
) -> None:
    """A server's applied updates (AntDT §II: T_s), as polled by the supervisor:
    ``server_now`` is the server's clock when it answered, so each update's age
    (``server_now - ended_s``) places it in time here."""
    if not updates:
        return
    ordered = sorted(updates, key=lambda u: u.version)
    ages = [max(0.0, server_now - u.ended_s) if u.ended_s > 0 else 0.0 for u in ordered]
    at = recorder.elapsed()
    recorder.emit(
        "server_reports",
        role="server",
        rank=rank,
        version=[u.version for u in ordered],
        update_s=[round(u.update_s, 6) for u in ordered],
        injected_s=[round(u.injected_s, 6) for u in ordered],
        dropped=[list(u.dropped) for u in ordered],
        t=[round(max(0.0, at - age), 6) for age in ages],
    )
    injected = (
        controller.observe_server(rank, ordered, now, ages=ages)
        if controller is not None
        else sum(u.injected_s for u in ordered)
    )
    slowed = [u.version for u in ordered if u.injected_s]
    _record_injected(recorder, "server", rank, injected, slowed)


def _record_injected(
    recorder: EventRecorder, role: str, rank: int, delay_s: float, steps: list[int]
) -> None:
    if delay_s > 0:
        recorder.emit("injected", role=role, rank=rank, delay_s=round(delay_s, 4), steps=steps)
