"""The event log: JSON lines that survive a supervisor killed mid-write."""

from __future__ import annotations

from dtlaunch.events import EventRecorder, JsonlEventLog, read_events


def test_a_torn_last_line_does_not_swallow_the_next_event(tmp_path):
    path = tmp_path / "events.jsonl"
    log = JsonlEventLog(path)
    EventRecorder([log]).emit("job_start", run_id="r")
    log.close()
    with path.open("a") as handle:
        handle.write('{"kind": "spawn", "mono": 1.0, "wa')  # killed mid-write
    log = JsonlEventLog(path)
    EventRecorder([log]).emit("resume", attempts={})
    log.close()
    assert [e.kind for e in read_events(path)] == ["job_start", "resume"]


def test_events_round_trip_with_their_fields(tmp_path):
    path = tmp_path / "events.jsonl"
    log = JsonlEventLog(path)
    recorder = EventRecorder([log])
    recorder.emit("exit", host="h1", role="worker", rank=3, exit_code=1, signal=None)
    log.close()
    (event,) = read_events(path)
    assert (event.kind, event.host, event.role, event.rank) == ("exit", "h1", "worker", 3)
    assert event.data == {"exit_code": 1, "signal": None}
    assert event.wall > 0
