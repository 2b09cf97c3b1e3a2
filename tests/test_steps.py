"""StepTimer: what a step report holds and when reports are sent."""

from __future__ import annotations

import time

import pytest

from dtlaunch.runtime.steps import StepTimer


def _step(timer: StepTimer, step: int, records: int = 4):
    timer.batch_taken(records)
    return timer.end_step(step, batch_size=records)


def test_every_step_ends_with_its_report_for_the_link():
    timer = StepTimer(role="worker", rank=0, host="h")
    reports = [_step(timer, i) for i in range(1, 4)]
    assert [t.report.step for t in reports] == [1, 2, 3]
    assert all(t.report.samples == 4 and t.report.batch_size == 4 for t in reports)
    assert reports[0].ended <= reports[1].ended <= reports[2].ended <= time.monotonic()


def test_a_step_report_carries_each_parameter_servers_exchanges():
    timer = StepTimer(role="worker", rank=0, host="h")
    timer.batch_taken(8)
    timer.record_server(1, 1000, 0.002)
    timer.record_server(0, 500, 0.001)
    timer.record_server(1, 3000, 0.003)  # a pull and a push: summed
    first = timer.end_step(1, batch_size=8)
    servers = [(c.server, c.nbytes, c.comm_s) for c in first.report.servers]
    assert servers == [(0, 500, 0.001), (1, 4000, pytest.approx(0.005))]
    timer.batch_taken(8)
    second = timer.end_step(2, batch_size=8)
    assert second.report.servers == []  # per step, not cumulative
