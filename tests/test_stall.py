"""The stall watchdog's rules, with a fake clock (the I/O-free part)."""

from __future__ import annotations

import pytest

from dtlaunch.supervisor.control.stall import StallWatch


def test_not_armed_until_the_job_shows_progress():
    watch = StallWatch(10.0)
    for t in range(0, 1000, 5):  # a script without the SDK reports nothing, ever
        assert watch.tick(float(t), progress=(0, 0)) is None


def test_a_stall_is_reported_once_after_the_bound_without_progress():
    watch = StallWatch(10.0)
    assert watch.tick(0.0, progress=(1, 0)) is None  # armed
    assert watch.tick(9.9, progress=(1, 0)) is None
    stall = watch.tick(10.0, progress=(1, 0))
    assert stall is not None and (stall.since, stall.waited_s, stall.bound_s) == (0.0, 10.0, 10.0)
    assert watch.tick(50.0, progress=(1, 0)) is None  # once per episode
    assert watch.tick(51.0, progress=(2, 0)) is None  # progress: a new episode
    assert watch.tick(60.9, progress=(2, 0)) is None
    assert watch.tick(61.0, progress=(2, 0)) is not None


def test_any_counter_moving_is_progress():
    watch = StallWatch(10.0)
    watch.tick(0.0, progress=(5, 0, 0))
    for t in range(1, 40):
        # steps stopped, but shards keep changing state: not a stall
        assert watch.tick(float(t), progress=(5, 0, t)) is None


def test_the_adaptive_bound_follows_the_slowest_step():
    watch = StallWatch(None, floor_s=120.0, factor=20.0)
    assert watch.bound(0.1) == 120.0
    assert watch.bound(30.0) == 600.0
    watch.tick(0.0, progress=(1,))
    assert watch.tick(500.0, progress=(1,), slowest_step_s=lambda: 30.0) is None
    assert watch.tick(600.0, progress=(1,), slowest_step_s=lambda: 30.0) is not None


def test_after_a_restart_a_job_that_never_moves_stalls_again():
    """So a job that can never move uses up its restarts and fails: no hang."""
    watch = StallWatch(10.0)
    watch.tick(0.0, progress=(1,))
    assert watch.tick(10.0, progress=(1,)) is not None
    watch.restarted(12.0)
    assert watch.tick(21.0, progress=(1,)) is None
    assert watch.tick(22.0, progress=(1,)) is not None


def test_zero_turns_the_watchdog_off_and_bad_bounds_are_refused():
    watch = StallWatch(0.0)
    watch.tick(0.0, progress=(1,))
    assert watch.tick(1e9, progress=(1,)) is None
    with pytest.raises(ValueError, match="finite"):
        StallWatch(float("inf"))
    with pytest.raises(ValueError, match="floor_s"):
        StallWatch(None, floor_s=0)
