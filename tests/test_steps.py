"""StepTimer: what a step report holds and when reports are sent."""

from __future__ import annotations

import time

from dtlaunch.runtime.steps import REPORT_EVERY_STEPS, StepTimer


def _step(timer: StepTimer, step: int, records: int = 4):
    timer.batch_taken(records)
    return timer.end_step(step, batch_size=records)


def test_reports_are_sent_after_the_report_interval_or_every_few_steps():
    slow = StepTimer(role="worker", rank=0, host="h", report_every_s=3600.0)
    sent = [_step(slow, i) for i in range(1, 2 * REPORT_EVERY_STEPS + 1)]
    sizes = [len(batch) for batch in sent]
    assert sizes == [0] * (REPORT_EVERY_STEPS - 1) + [REPORT_EVERY_STEPS] + [0] * (
        REPORT_EVERY_STEPS - 1
    ) + [REPORT_EVERY_STEPS]
    assert [r.report.step for r in sent[REPORT_EVERY_STEPS - 1]] == list(
        range(1, REPORT_EVERY_STEPS + 1)
    )

    quick = StepTimer(role="worker", rank=0, host="h", report_every_s=0.05)
    assert _step(quick, 1) == []  # just started: not yet due
    time.sleep(0.06)
    due = _step(quick, 2)
    assert [r.report.step for r in due] == [1, 2]
    assert all(r.report.samples == 4 and r.report.batch_size == 4 for r in due)
