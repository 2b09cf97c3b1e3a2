"""``dtlaunch status`` against a supervisor too busy to answer within --timeout
(issue 18: at 1,000 workers the command fell back to folding a 250 MB event log,
which took a minute). The log is folded meanwhile, and whichever comes first is
shown: a late live answer, or the fold. A real CURVE Router plays the supervisor."""

from __future__ import annotations

import asyncio
import time

import zmq.asyncio

from dtlaunch.config import JobSpec
from dtlaunch.events import Event, JsonlEventLog
from dtlaunch.jobclient import StatusSource
from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.wire.keys import create_run_keys, load_run_keys
from dtlaunch.wire.messages import StatusReply, StatusRequest, StatusSnapshot
from dtlaunch.wire.sockets import Router

LIVE = StatusSnapshot(run_id="r", policy="none", mode="allreduce", phase="running", source="live")


def run_dir_with_a_long_log(tmp_path, events: int) -> RunDir:
    run = RunDir.create(JobSpec(run_id="r", run_dir=tmp_path / "run", script="t.py"))
    create_run_keys(run.keys)
    log = JsonlEventLog(run.events_path)
    for i in range(events):
        data = {"compute_s": [0.09] * 10, "comm_s": [0.01] * 10, "batch_size": [32] * 10}
        log.emit(Event(kind="reports", mono=i * 1e-3, wall=0.0, role="worker", rank=i % 500,
                       data=data))  # fmt: skip
    log.close()
    return run


def fold_seconds(run: RunDir) -> float:
    from dtlaunch.ui.status_model import snapshot_from_run_dir

    began = time.monotonic()
    snapshot_from_run_dir(run)
    return time.monotonic() - began


async def busy_supervisor(run: RunDir, answer_after_s: float | None) -> tuple[str, float]:
    """Serve one status request like a supervisor whose loop is busy; returns
    what the client got and how long it took."""
    ctx = zmq.asyncio.Context()
    try:
        async with Router(ctx, load_run_keys(run.keys)) as router:
            run.write_supervisor(endpoint=router.endpoint, pid=0)

            async def serve() -> None:
                peer, msg = await router.recv()
                assert isinstance(msg, StatusRequest)
                if answer_after_s is not None:
                    await asyncio.sleep(answer_after_s)
                    await router.send(peer, StatusReply(request_id=msg.request_id, snapshot=LIVE))

            server = asyncio.ensure_future(serve())
            source = StatusSource(run, timeout=0.3)
            began = time.monotonic()
            try:
                snap, note = await asyncio.wait_for(source.current(), 60)
            finally:
                source.close()
                server.cancel()
            return f"{snap.source}: {note}", time.monotonic() - began
    finally:
        ctx.destroy(linger=0)


def test_a_late_live_answer_wins_over_folding_a_long_event_log(tmp_path):
    # A log that takes at least 1.5 s to fold on this machine, however fast it is.
    events = 20_000
    while True:
        run = run_dir_with_a_long_log(tmp_path / str(events), events)
        fold_s = fold_seconds(run)
        if fold_s >= 1.5 or events >= 640_000:
            break
        events *= 2
    # The answer comes well after --timeout (0.3 s), well before the fold ends.
    got, took = asyncio.run(busy_supervisor(run, answer_after_s=fold_s / 3))
    assert got.startswith("live: the supervisor is busy: it answered after"), (got, fold_s)
    assert took < fold_s  # it did not wait for the fold it started


def test_a_supervisor_that_never_answers_gets_the_fold(tmp_path):
    run = run_dir_with_a_long_log(tmp_path, 2_000)
    got, _ = asyncio.run(busy_supervisor(run, answer_after_s=None))
    assert got == "events: the supervisor did not answer within 0.3 s: shown from the event log"
