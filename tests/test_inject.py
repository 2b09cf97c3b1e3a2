"""--inject specs: parsing, errors, and the delay math of AntDT §VII-A-4."""

from __future__ import annotations

import random

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.inject import injected_delay, parse_injection, parse_injections


def delay(specs, *, role="worker", rank=0, host="h0", now=0.0, compute=1.0, seed=7):
    return injected_delay(
        specs if isinstance(specs, (list, tuple)) else [specs],
        role=role,
        rank=rank,
        host=host,
        now=now,
        step_compute_s=compute,
        rng=random.Random(seed),
    )


def test_design_examples_parse():
    p = parse_injection("persistent:role=worker,ranks=3,delay=4.0")
    assert (p.kind, p.role, p.ranks, p.hosts, p.delay) == ("persistent", "worker", {3}, None, 4.0)
    t = parse_injection(
        "transient:role=worker,prob=0.3,period=30,duration=15,sleep=1.5,intensity=0.8"
    )
    assert (t.prob, t.period, t.duration, t.sleep, t.intensity) == (0.3, 30, 15, 1.5, 0.8)
    assert t.ranks is None and t.hosts is None
    s = parse_injection("slowdown:role=server,ranks=1,factor=10")
    assert (s.kind, s.role, s.ranks, s.factor) == ("slowdown", "server", {1}, 10.0)
    assert s.text == "slowdown:role=server,ranks=1,factor=10"


def test_rank_ranges_and_host_lists():
    p = parse_injection("persistent:ranks=1,3-5,delay=2,hosts=node1,node2")
    assert p.role == "worker"  # default role
    assert p.ranks == {1, 3, 4, 5}
    assert p.hosts == {"node1", "node2"}
    specs = parse_injections(["persistent:ranks=0,delay=1;slowdown:factor=2", "persistent:delay=3"])
    assert [s.kind for s in specs] == ["persistent", "slowdown", "persistent"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sluggish:delay=1",
            "unknown kind 'sluggish'; valid kinds: persistent, transient, slowdown",
        ),
        (
            "persistent:delay=1,speed=2",
            "unknown key 'speed'; valid keys: role, ranks, hosts, after, until, delay",
        ),
        ("persistent:role=worker", "persistent needs delay"),
        ("transient:period=30,sleep=1", "transient needs duration"),
        ("persistent:delay=1,ranks=x", "bad rank 'x'; write ranks like 3 or 1,3-5"),
        ("persistent:delay=1,ranks=5-3", "bad rank '5-3'"),
        ("persistent:delay=abc", "delay must be a number, got 'abc'"),
        ("persistent:delay=-1", "delay must be seconds >= 0"),
        ("persistent:delay=1,role=chief", "role must be one of worker, server"),
        ("persistent:delay=1,delay=2", "key 'delay' given twice"),
        ("persistent:delay=1,,ranks=2", "empty item"),
        ("persistent:4", "'4' is not key=value"),
        (
            "transient:prob=1.2,period=30,duration=15,sleep=1",
            "prob must be a probability in [0, 1]",
        ),
        ("transient:period=30,duration=45,sleep=1", "duration must be seconds in [0, period]"),
        ("transient:period=0,duration=0,sleep=1", "period must be seconds > 0"),
        ("transient:period=30,duration=5,sleep=1,intensity=2", "intensity must be in [0, 1]"),
        ("slowdown:factor=0.5", "factor must be >= 1"),
        ("persistent:delay=1,after=-2", "after must be seconds >= 0 since the job started"),
        ("persistent:delay=1,after=20,until=10", "until must be seconds since the job started"),
        ("slowdown:factor=", "key 'factor' has no value"),
        ("slowdown:factor=2,link=100M", "link= slows a parameter server's transfers"),
        ("slowdown:role=server,factor=2,link=fast", "link must be the bytes a second"),
        ("slowdown:role=server,factor=2,link=0", "link must be the bytes a second"),
    ],
)
def test_bad_specs_name_the_problem(text, message):
    with pytest.raises(ConfigError) as err:
        parse_injection(text)
    assert message in str(err.value)


def test_persistent_and_slowdown_math_and_binding():
    per = parse_injection("persistent:role=worker,ranks=3,delay=4.0")
    assert delay(per, rank=3) == 4.0
    assert delay(per, rank=2) == 0.0
    assert delay(per, role="server", rank=3) == 0.0
    slow = parse_injection("slowdown:role=server,ranks=1,factor=10")
    assert delay(slow, role="server", rank=1, compute=0.2) == pytest.approx(9 * 0.2)
    by_host = parse_injection("persistent:hosts=busy,delay=2")
    assert delay(by_host, rank=5, host="busy") == 2.0
    assert delay(by_host, rank=5, host="other") == 0.0  # a restart elsewhere escapes it
    both = parse_injection("persistent:ranks=1,hosts=busy,delay=2")
    assert delay(both, rank=1, host="busy") == 2.0
    assert delay(both, rank=1, host="other") == 0.0
    assert delay([per, slow, by_host], rank=3, host="busy") == 6.0  # specs add up


def test_after_and_until_bound_a_spec_in_job_time():
    appears = parse_injection("persistent:hosts=busy,delay=0.3,after=20")
    assert delay(appears, host="busy", now=19.9) == 0.0
    assert delay(appears, host="busy", now=20.0) == 0.3
    recovers = parse_injection("slowdown:factor=3,until=40")
    assert delay(recovers, now=39.0, compute=0.1) == pytest.approx(0.2)
    assert delay(recovers, now=40.0, compute=0.1) == 0.0
    episode = parse_injection("transient:period=30,duration=30,sleep=1,after=30,until=60")
    assert [delay(episode, now=n) for n in (10.0, 35.0, 65.0)] == [0.0, 1.0, 0.0]


def test_transient_is_on_for_duration_each_period():
    t = parse_injection("transient:prob=1,period=30,duration=15,sleep=1.5,intensity=0.8")
    for now in (0.0, 14.9, 30.0, 44.0, 900.5):
        assert delay(t, now=now) == pytest.approx(1.2)  # SleepDuration x Intensity
    for now in (15.0, 29.9, 45.0, 915.0):
        assert delay(t, now=now) == 0.0
    never = parse_injection("transient:prob=0,period=30,duration=15,sleep=1.5")
    assert all(delay(never, now=n) == 0.0 for n in range(0, 300, 7))


def test_transient_coin_is_fixed_per_window_and_seed():
    t = parse_injection("transient:prob=0.3,period=30,duration=15,sleep=1.5,intensity=0.8")
    rng = random.Random(42)
    state = rng.getstate()
    on = {}
    for rank in range(200):
        for window in range(5):
            values = {
                injected_delay(
                    [t],
                    role="worker",
                    rank=rank,
                    host="h",
                    now=window * 30 + dt,
                    step_compute_s=1.0,
                    rng=rng,
                )
                for dt in (0.0, 3.3, 14.9)
            }
            assert len(values) == 1  # every call in a window agrees
            on[rank, window] = values.pop() > 0
    assert rng.getstate() == state  # the rng is read, never advanced
    share = sum(on.values()) / len(on)
    assert 0.25 < share < 0.35  # about prob = 0.3 of (node, window) pairs
    # A fresh Random with the same seed (another process) decides the same.
    again = {
        (r, w): delay(t, rank=r, host="h", now=w * 30 + 1, seed=42) > 0
        for r in range(200)
        for w in range(5)
    }
    assert again == on
    other_seed = {
        (r, w): delay(t, rank=r, host="h", now=w * 30 + 1, seed=43) > 0
        for r in range(200)
        for w in range(5)
    }
    assert other_seed != on


def test_host_bound_transient_hits_all_processes_on_the_host_together():
    t = parse_injection("transient:hosts=busy,prob=0.5,period=10,duration=5,sleep=1")
    for window in range(40):
        now = window * 10 + 1
        first = delay(t, rank=0, host="busy", now=now, seed=1)
        assert all(delay(t, rank=r, host="busy", now=now, seed=1) == first for r in (1, 2, 3))


def test_a_server_straggler_holds_each_update_and_reports_it():
    from dtlaunch.ps.slowdown import ServerSlowdown
    from dtlaunch.wire.messages import PsUpdate

    specs = parse_injections(
        ["persistent:role=server,hosts=h1,delay=0.05", "persistent:role=worker,delay=9"]
    )
    update = PsUpdate(version=3, step=2, update_s=0.01, samples=8, applied=[0, 1])
    got, delay = ServerSlowdown(specs, rank=0, host="h1").apply(update)
    assert delay == pytest.approx(0.05)
    assert got.injected_s == pytest.approx(0.05) and got.update_s == pytest.approx(0.06)
    elsewhere = ServerSlowdown(specs, rank=0, host="h2")  # another host: not contended
    assert elsewhere.apply(update) == (update, 0.0)
    workers_only = ServerSlowdown(specs[1:], rank=0, host="h1")  # worker specs never apply
    assert not workers_only and workers_only.apply(update) == (update, 0.0)


def test_a_slow_link_delays_each_transfer_after_the_ones_before_it():
    from dtlaunch.ps.slowdown import ServerSlowdown

    [spec] = parse_injections(["slowdown:role=server,ranks=1,factor=5,link=1M"])
    assert spec.link == 1 << 20
    link = ServerSlowdown((spec,), rank=1, host="h")
    # 4 x 256 KiB / 1 MiB/s = 1 s more for the first, and the second waits for it.
    first = link.transfer_delay(256 << 10)
    second = link.transfer_delay(256 << 10)
    assert first == pytest.approx(1.0, abs=0.01)
    assert second == pytest.approx(2.0, abs=0.02)
    assert ServerSlowdown((spec,), rank=0, host="h").transfer_delay(256 << 10) == 0.0
    updates_only = parse_injections(["slowdown:role=server,factor=5"])
    assert ServerSlowdown(updates_only, rank=1, host="h").transfer_delay(1 << 30) == 0.0
