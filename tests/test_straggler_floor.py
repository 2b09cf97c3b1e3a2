"""benchmarks/stragglers.py's oracle floor: what no policy can beat, beside the ideal."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.stragglers import QUICK, oracle_floor, transient_pattern
from benchmarks.stragglers_report import render_markdown, table_rows


def test_without_transient_stragglers_the_floor_is_the_ideal():
    calm = dataclasses.replace(QUICK, transient_prob=0.0)
    assert oracle_floor(calm, 0.8, 13.4, start_s=12.0) == pytest.approx(13.4)


def test_the_floor_adds_each_disturbed_host_s_delay_shared_by_the_eight_workers():
    # A start-up past the last disturbed half-period of window 0: step by step,
    # the oracle loses d/8 per disturbed host (d = 0.15 s x intensity).
    ideal = 13.4
    floor = oracle_floor(QUICK, 0.8, ideal, start_s=0.0)
    pattern = transient_pattern(QUICK, 0.8, 10)
    step, t, lost = ideal / QUICK.steps, 0.0, 0.0
    hosts = [h for h in pattern if h not in ("127.0.0.5", "127.0.0.11")]  # spare .10 taken
    best = []
    for spare_hosts in (hosts, [h if h != "127.0.0.10" else "127.0.0.11" for h in hosts]):
        t, lost = 0.0, 0.0
        for _ in range(QUICK.steps):
            window = int(t // QUICK.period_s)
            on = t - window * QUICK.period_s < QUICK.duration_s
            k = sum(pattern[h][window] for h in spare_hosts) if on else 0
            t += step + k * 0.12 / 8
            lost += k * 0.12 / 8
        best.append(ideal + lost)
    assert floor == pytest.approx(min(best))
    assert ideal < floor < ideal * 1.2


def test_the_floor_grows_with_the_intensity_and_the_table_shows_it():
    floors = [oracle_floor(QUICK, si, 13.4, start_s=12.0) for si in (0.1, 0.5, 0.8)]
    assert 13.4 < floors[0] < floors[1] < floors[2]
    results = {
        "mode": "quick",
        "date": "now",
        "cpus": 2,
        "jct_s": {
            "0.8": {"none": 29.9, "torchrun": 28.5, "lb-bsp": 38.0, "nd": 17.8, "ideal": 13.4}
        },
        "speedup_nd_over_none": {"0.8": 1.68},
        "nd_over_ideal": {"0.8": 1.328},
        "floor_s": {"0.8": round(floors[2], 2)},
        "floor_over_ideal": {"0.8": round(floors[2] / 13.4, 3)},
        "none_over_floor": {"0.8": round(29.9 / floors[2], 3)},
        "targets": {},
        "scenario": {"nd": "nd", "lb_bsp": "lb-bsp", "control_interval_s": 0.25},
    }
    header, row = table_rows(results)
    assert header[6] == "floor" and row[6] == f"{floors[2]:.1f}"
    assert header[-2:] == ["floor / ideal", "none / floor"]
    assert "floor: an oracle's training time" in render_markdown(results)
