"""StepTimer: what a step report holds and when reports are sent."""

from __future__ import annotations

import time

import pytest

from dtlaunch.runtime.steps import REPORT_MAX_STEPS, StepTimer


def _step(timer: StepTimer, step: int, records: int = 4):
    timer.batch_taken(records)
    return timer.end_step(step, batch_size=records)


def test_reports_are_sent_after_the_report_interval_or_when_a_message_is_full():
    slow = StepTimer(role="worker", rank=0, host="h", report_every_s=3600.0)
    sent = [_step(slow, i) for i in range(1, 2 * REPORT_MAX_STEPS + 1)]
    sizes = [len(batch) for batch in sent]
    assert sizes == [0] * (REPORT_MAX_STEPS - 1) + [REPORT_MAX_STEPS] + [0] * (
        REPORT_MAX_STEPS - 1
    ) + [REPORT_MAX_STEPS]
    assert [r.report.step for r in sent[REPORT_MAX_STEPS - 1]] == list(
        range(1, REPORT_MAX_STEPS + 1)
    )

    quick = StepTimer(role="worker", rank=0, host="h", report_every_s=0.05)
    assert _step(quick, 1) == []  # just started: not yet due
    time.sleep(0.06)
    due = _step(quick, 2)
    assert [r.report.step for r in due] == [1, 2]
    assert all(r.report.samples == 4 and r.report.batch_size == 4 for r in due)


def test_a_step_report_carries_each_parameter_servers_exchanges():
    timer = StepTimer(role="worker", rank=0, host="h", report_every_s=0.0)
    timer.batch_taken(8)
    timer.record_server(1, 1000, 0.002)
    timer.record_server(0, 500, 0.001)
    timer.record_server(1, 3000, 0.003)  # a pull and a push: summed
    [first] = timer.end_step(1, batch_size=8)
    servers = [(c.server, c.nbytes, c.comm_s) for c in first.report.servers]
    assert servers == [(0, 500, 0.001), (1, 4000, pytest.approx(0.005))]
    timer.batch_taken(8)
    [second] = timer.end_step(2, batch_size=8)
    assert second.report.servers == []  # per step, not cumulative
