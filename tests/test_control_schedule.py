"""When the Controller decides: the control loop's tick grid and the decision
schedule counted in grid time, with a fake clock (no event loop, no sleeps)."""

from __future__ import annotations

import pytest

from dtlaunch.supervisor.control.controller import Controller, TickGrid
from dtlaunch.supervisor.control.policies import parse_policy


def test_ticks_stay_on_the_grid_whatever_each_tick_took() -> None:
    grid = TickGrid(100.0, 0.5)
    now, served = 100.0, []
    for work_s in (0.03, 0.2, 0.0, 0.45, 0.01):
        now += grid.wait_s(now) + 0.004  # woken 4 ms late
        served.append(grid.arrived(now))
        now += work_s  # the tick's work: the next sleep is shorter by it
    assert served == pytest.approx([100.5, 101.0, 101.5, 102.0, 102.5])


def test_a_tick_missed_while_the_loop_was_blocked_is_skipped_not_caught_up() -> None:
    grid = TickGrid(0.0, 0.5)
    assert grid.arrived(grid.wait_s(0.0)) == 0.5
    # Blocked 1.3 s after that tick: the 1.0 and 1.5 ticks are gone; the wake-up
    # serves 1.5, and the next sleep aims at 2.0.
    assert grid.arrived(1.8) == 1.5
    assert grid.wait_s(1.8) == pytest.approx(0.2)
    # Woken a hair early (clock resolution): still the next tick, never one served.
    assert grid.arrived(1.9999999) == 2.0
    with pytest.raises(ValueError, match="tick must be > 0"):
        TickGrid(0.0, 0.0)


def test_a_decision_every_interval_counts_in_grid_time_not_in_lateness() -> None:
    # Interval = tick: a tick less late than the previous deciding one is still
    # due. Counted on the wake-up times, the 0.003 s tick would be skipped.
    controller = Controller(parse_policy("lb-bsp"), interval=0.5, spare_hosts=[])
    lateness = [0.040, 0.003, 0.020, 0.001]
    due = []
    for k, late in enumerate(lateness, start=1):
        scheduled = k * 0.5
        due.append(controller.due(scheduled + late, scheduled=scheduled))
        controller.decide(scheduled + late, scheduled=scheduled, remaining_steps=None)
    assert due == [True] * 4
    # Without the grid time, the same wake-ups skip every tick less late than the last.
    bare = Controller(parse_policy("lb-bsp"), interval=0.5, spare_hosts=[])
    skipped = []
    for k, late in enumerate(lateness, start=1):
        skipped.append(bare.due(k * 0.5 + late))
        bare.decide(k * 0.5 + late, remaining_steps=None)
    assert skipped == [True, False, True, False]
    # A longer interval: every second tick.
    every_other = Controller(parse_policy("lb-bsp"), interval=1.0, spare_hosts=[])
    decided = []
    for k in range(1, 7):
        scheduled = k * 0.5
        decided.append(every_other.due(scheduled + 0.01, scheduled=scheduled))
        every_other.decide(scheduled + 0.01, scheduled=scheduled, remaining_steps=None)
    assert decided == [True, False, True, False, True, False]
