"""Monitor: time windows, throughput, equal-share BPT, absences (fake clock)."""

from __future__ import annotations

import pytest

from dtlaunch.supervisor.control.monitor import Monitor


def feed(mon, rank, *, start, end, every=1.0, compute=1.0, comm=0.0, batch=32, step0=0):
    t, step = start, step0
    while t <= end + 1e-9:
        mon.report_worker(
            rank, now=t, step=step, batch_size=batch, compute_s=compute, comm_s=comm, samples=batch
        )
        t += every
        step += 1
    return step


def test_windows_are_by_time_and_absent_workers_are_left_out():
    mon = Monitor(l_trans=60, l_per=300)
    feed(mon, 0, start=0, end=200)  # reports at t = 0..200
    feed(mon, 1, start=0, end=100, compute=3.0)  # silent after t = 100
    snap = mon.snapshot(200)
    assert snap.worker_short[0].reports == 61  # t in [140, 200]
    assert snap.worker_long[0].reports == 201
    assert 1 not in snap.worker_short  # no report in the short window
    assert snap.worker_long[1].reports == 101
    # Global means only over the workers present in that window.
    assert snap.mean_bpt_short == pytest.approx(1.0)
    assert snap.mean_bpt_long == pytest.approx(2.0)
    assert snap.worker_short[0].span_s == pytest.approx(60)
    # Later, the long window slides past worker 1's last report entirely.
    feed(mon, 0, start=201, end=420, step0=201)
    snap = mon.snapshot(420)
    assert 1 not in snap.worker_long
    assert 1 in snap.workers  # still known (not gone), just no data in the windows
    assert snap.worker_long[0].first_s == pytest.approx(120)


def test_throughput_is_mean_of_per_step_rates():
    mon = Monitor(l_trans=60, l_per=300)
    mon.report_worker(0, now=1, step=0, batch_size=32, compute_s=0.8, comm_s=0.2, samples=32)
    mon.report_worker(0, now=2, step=1, batch_size=32, compute_s=1.5, comm_s=0.5, samples=32)
    st = mon.snapshot(2).worker_short[0]
    # AntDT: v_i = 1/|S| sum B_i / T_i = (32/1 + 32/2) / 2 = 24, not 64 / 3.
    assert st.throughput == pytest.approx(24.0)
    assert st.mean_bpt == pytest.approx(1.5)
    assert st.samples == 64


def test_equal_share_bpt_rescales_compute_not_comm():
    mon = Monitor(l_trans=60, l_per=300)
    mon.report_worker(0, now=1, step=0, batch_size=48, compute_s=3.0, comm_s=0.5, samples=48)
    mon.report_worker(1, now=1, step=0, batch_size=16, compute_s=1.0, comm_s=0.5, samples=16)
    snap = mon.snapshot(1)
    # Reference batch = mean current batch = 32.
    assert snap.worker_short[0].mean_bpt == pytest.approx(3.5)
    assert snap.worker_short[1].mean_bpt == pytest.approx(1.5)
    assert snap.worker_short[0].mean_bpt_eq == pytest.approx(3.0 * 32 / 48 + 0.5)
    assert snap.worker_short[1].mean_bpt_eq == pytest.approx(1.0 * 32 / 16 + 0.5)
    assert snap.mean_bpt_eq_short == pytest.approx(2.5)


def test_servers_latest_step_spares_and_caller_fields():
    mon = Monitor(l_trans=10, l_per=50)
    for t in range(0, 60):
        mon.report_server(0, now=t, step=t, update_s=0.1)
        mon.report_server(1, now=t, step=t, update_s=0.5 if t >= 30 else 0.1)
    mon.report_worker(2, now=59, step=77, batch_size=8, compute_s=1, comm_s=0, samples=8)
    mon.set_spare_capacity(2, ["spare-a", "spare-b"])
    snap = mon.snapshot(59, remaining_steps=500, restart_cost_s=12.5, restart_pending=True)
    # Long window [9, 59]: server 1 slow for 30 of its 51 reports.
    assert snap.server_long[1].mean_bpt == pytest.approx((21 * 0.1 + 30 * 0.5) / 51)
    assert snap.server_long[0].mean_bpt == pytest.approx(0.1)
    assert snap.mean_update_long == pytest.approx((0.1 + snap.server_long[1].mean_bpt) / 2)
    assert snap.latest_step == 77
    assert snap.spare_capacity == 2
    assert snap.spare_hosts == ("spare-a", "spare-b")
    assert (snap.remaining_steps, snap.restart_cost_s, snap.restart_pending) == (500, 12.5, True)


def test_worker_gone_forgets_history():
    mon = Monitor(l_trans=60, l_per=300)
    feed(mon, 0, start=0, end=10, batch=16)
    mon.worker_gone(0)
    snap = mon.snapshot(10)
    assert 0 not in snap.workers and 0 not in snap.worker_long
    mon.report_worker(0, now=11, step=11, batch_size=16, compute_s=1, comm_s=0, samples=16)
    snap = mon.snapshot(11)
    assert snap.worker_long[0].reports == 1
    assert snap.workers[0].samples_total == 16


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="l_trans <= l_per"):
        Monitor(l_trans=100, l_per=50)
    mon = Monitor(l_trans=1, l_per=2)
    with pytest.raises(ValueError, match="compute_s"):
        mon.report_worker(0, now=0, step=0, batch_size=1, compute_s=-1, comm_s=0, samples=1)
    with pytest.raises(ValueError, match="batch_size"):
        mon.report_worker(0, now=0, step=0, batch_size=0, compute_s=1, comm_s=0, samples=1)
    with pytest.raises(ValueError, match="update_s"):
        mon.report_server(0, now=0, step=0, update_s=float("nan"))
    with pytest.raises(ValueError, match="spare"):
        mon.set_spare_capacity(-1)


def test_zero_time_step_does_not_divide_by_zero():
    mon = Monitor(l_trans=1, l_per=2)
    mon.report_worker(0, now=0, step=0, batch_size=4, compute_s=0.0, comm_s=0.0, samples=4)
    st = mon.snapshot(0).worker_short[0]
    assert st.throughput > 0 and st.mean_bpt > 0


def test_the_controller_offers_only_free_spare_hosts_to_the_policy():
    from dtlaunch.supervisor.control.controller import Controller
    from dtlaunch.supervisor.control.policies import parse_policy
    from dtlaunch.wire.messages import StepReport, StepReports

    policy = parse_policy("nd:l_trans=2,l_per=4,min_reports=2,restart_cost=0")
    controller = Controller(policy, interval=1.0, spare_hosts=["s1", "s2"])
    for i in range(40):
        for rank in range(3):
            compute = 0.4 if rank == 2 else 0.1
            report = StepReport(step=i, batch_size=10, samples=10, compute_s=compute)
            controller.observe(rank, StepReports.of([report]), 0.1 * i)
    # s1 now runs a process: only s2 is offered, and the kill goes there.
    [kill] = controller.decide(4.0, remaining_steps=100, free_spare_hosts=["s2"])
    assert (kill.rank, kill.target_host) == (2, "s2")
    assert controller.monitor.snapshot(4.0).spare_hosts == ("s2",)


def test_each_servers_comm_time_is_averaged_over_the_workers_steps():
    mon = Monitor(l_trans=2.0, l_per=4.0)
    for t in range(5):
        for rank in range(2):
            mon.report_worker(rank, now=float(t), step=t, batch_size=8, compute_s=0.1,
                              comm_s=0.05, samples=8, servers=((0, 0.01), (1, 0.04)))  # fmt: skip
    snap = mon.snapshot(4.0)
    assert snap.server_comm_long == {0: pytest.approx(0.01), 1: pytest.approx(0.04)}
    assert Monitor(l_trans=1.0, l_per=2.0).snapshot(0.0).server_comm_long == {}


def test_a_window_with_two_batch_sizes_fits_the_fixed_and_per_sample_time():
    from dtlaunch.supervisor.control.monitor import step_model

    # 0.12 s lost every step plus 1/120 s per sample, with a little noise.
    sizes = [32, 32, 28, 28, 28]
    noise = [0.001, -0.001, 0.0, 0.001, -0.001]
    bpts = [0.12 + b / 120 + e for b, e in zip(sizes, noise, strict=True)]
    fixed, per_sample = step_model(sizes, bpts)
    assert fixed == pytest.approx(0.12, abs=0.01)
    assert per_sample == pytest.approx(1 / 120, rel=0.05)
    # One batch size or sizes too close: no fit.
    assert step_model([32, 32, 32], [0.3, 0.31, 0.29]) == (None, None)
    assert step_model([32, 31], [0.3, 0.29]) == (None, None)
    # A free fit that is not physical gives the best line with both parts >= 0:
    # slower with less work (noise over a fixed cost) is flat at the mean ...
    assert step_model([32, 20], [0.2, 0.3]) == pytest.approx((0.25, 0.0))
    # ... and steeper than proportional runs through the origin.
    fixed, per_sample = step_model([32, 16], [0.4, 0.1])
    assert fixed == 0.0 and per_sample == pytest.approx((32 * 0.4 + 16 * 0.1) / (32**2 + 16**2))
    mon = Monitor(l_trans=10, l_per=10)
    for t, (b, bpt) in enumerate(zip(sizes, bpts, strict=True)):
        mon.report_worker(0, now=t, step=t, batch_size=b, compute_s=bpt, comm_s=0.0, samples=b)
        mon.report_worker(1, now=t, step=t, batch_size=32, compute_s=0.27, comm_s=0.0, samples=32)
    snap = mon.snapshot(5)
    assert snap.worker_short[0].fixed_s == pytest.approx(0.12, abs=0.01)
    assert snap.worker_short[1].fixed_s is None and snap.worker_short[1].per_sample_s is None


def test_steps_without_records_say_nothing_about_speed():
    """At the end of the data a worker joins the BSP step with an empty batch in
    a few milliseconds: as B/T it would look 100x faster than the others."""
    mon = Monitor(l_trans=10, l_per=10)
    for t in range(5):
        mon.report_worker(0, now=t, step=t, batch_size=32, compute_s=0.27, comm_s=0.0, samples=32)
        empty = t >= 3  # worker 1's last two steps hold no record
        mon.report_worker(1, now=t, step=t, batch_size=32, compute_s=0.001 if empty else 0.27,
                          comm_s=0.0, samples=0 if empty else 32)  # fmt: skip
        # A worker that never reports records (its own data loader) is measured as is.
        mon.report_worker(2, now=t, step=t, batch_size=32, compute_s=0.27, comm_s=0.0, samples=0)
    snap = mon.snapshot(5)
    assert snap.worker_short[1].reports == 3
    assert snap.worker_short[1].throughput == pytest.approx(snap.worker_short[0].throughput)
    assert snap.worker_short[2].reports == 5
    assert snap.worker_short[2].throughput == pytest.approx(32 / 0.27)
    # Out of data for a whole window: worker 1 is absent, not 270x faster.
    for t in range(5, 30):
        mon.report_worker(1, now=t, step=t, batch_size=32, compute_s=0.001, comm_s=0.0, samples=0)
    assert 1 not in mon.snapshot(29).worker_short


def _steps(mon: Monitor, rank: int, t0: int, rows: list[tuple[int, float]]) -> int:
    """Report ``(batch, bpt)`` rows for ``rank``, one step a second from ``t0``."""
    for i, (b, bpt) in enumerate(rows):
        mon.report_worker(rank, now=t0 + i, step=t0 + i, batch_size=b, compute_s=bpt,
                          comm_s=0.0, samples=b)  # fmt: skip
    return t0 + len(rows)


def test_the_short_window_starts_at_a_confirmed_regime_change():
    """A straggler's onset: 6 fast steps then 2 slow ones. The short window keeps
    only the slow ones (the plan sees the worker as it is now), the long window
    keeps all; one slow step alone, steps alternating, or a jump that came with
    a new batch size are no new regime."""
    mon = Monitor(l_trans=20, l_per=20)
    _steps(mon, 0, 0, [(32, 0.27)] * 6 + [(32, 0.39)] * 2)
    snap = mon.snapshot(7)
    assert snap.worker_short[0].reports == 2
    assert snap.worker_short[0].mean_bpt == pytest.approx(0.39)
    assert snap.worker_long[0].reports == 8
    # Unconfirmed: the newest step alone is slow.
    mon = Monitor(l_trans=20, l_per=20)
    _steps(mon, 0, 0, [(32, 0.27)] * 6 + [(32, 0.39)])
    assert mon.snapshot(6).worker_short[0].reports == 7
    # A spike: one slow step, then fast again. Its end is a confirmed change, so
    # the window holds the fast steps since: the spike itself is left out.
    mon = Monitor(l_trans=20, l_per=20)
    _steps(mon, 0, 0, [(32, 0.27)] * 3 + [(32, 0.39)] + [(32, 0.27)] * 3)
    assert mon.snapshot(6).worker_short[0].mean_bpt == pytest.approx(0.27)
    # Every other step slow (noise with a rhythm): no change is confirmed.
    mon = Monitor(l_trans=20, l_per=20)
    _steps(mon, 0, 0, [(32, 0.27), (32, 0.33)] * 4)
    assert mon.snapshot(7).worker_short[0].reports == 8
    # A plan shrank the batch: the line is fitted through both sizes, none dropped.
    mon = Monitor(l_trans=20, l_per=20)
    _steps(mon, 0, 0, [(32, 0.39)] * 3 + [(16, 0.25)] * 3)
    st = mon.snapshot(5).worker_short[0]
    assert st.reports == 6 and st.line == "fit"
    # Confirmed by a step whose batch a plan had already changed (per sample).
    mon = Monitor(l_trans=20, l_per=20)
    _steps(mon, 0, 0, [(32, 0.27)] * 4 + [(32, 0.39), (24, 0.32), (24, 0.32)])
    assert mon.snapshot(6).worker_short[0].reports == 3
    # The end of an episode: quick again from the confirmed change on.
    mon = Monitor(l_trans=20, l_per=20)
    _steps(mon, 0, 0, [(24, 0.32)] * 4 + [(24, 0.2)] * 2)
    assert mon.snapshot(5).worker_short[0].mean_bpt == pytest.approx(0.2)


def test_a_worker_far_from_its_peers_batch_gets_their_per_sample_time():
    """A replacement inherited a shrunk straggler's batch of 2 and sleeps 0.12 s a
    step; 7 peers take 36 records at 1/120 s each. With one batch size seen, B/T
    alone calls it 16x slow per sample; the peers' slope gives its line, and its
    equal-share BPT is the line at the reference batch, not 2 -> 32 scaled up."""
    mon = Monitor(l_trans=10, l_per=10)
    for rank in range(7):
        _steps(mon, rank, 0, [(36, 36 / 120)] * 5)
    _steps(mon, 7, 0, [(2, 0.12 + 2 / 120)] * 5)
    snap = mon.snapshot(4)
    st = snap.worker_short[7]
    assert st.line == "peers"
    assert st.per_sample_s == pytest.approx(1 / 120)
    assert st.fixed_s == pytest.approx(0.12)
    b_ref = (7 * 36 + 2) / 8
    assert st.mean_bpt_eq == pytest.approx(0.12 + b_ref / 120)
    assert snap.worker_long[7].line == "peers"
    # Peers at the reference batch keep no line; nor does a worker quicker per
    # sample than its peers (its intercept would be negative).
    assert all(snap.worker_short[r].line is None for r in range(7))
    mon = Monitor(l_trans=10, l_per=10)
    _steps(mon, 0, 0, [(40, 40 / 120)] * 3)
    _steps(mon, 1, 0, [(8, 8 / 200)] * 3)
    assert mon.snapshot(2).worker_short[1].line is None


def test_changes_of_batch_size_measure_the_time_per_record():
    """A step of 50 ms plus 0.1 ms a record: compute / B calls it 3.3 ms a record
    at 16, the changes of size (16 -> 8, 16 -> 24) measure 0.1 ms. A step
    whose fixed cost is all there is measures 0 (never below)."""
    mon = Monitor(l_trans=100, l_per=100)
    assert mon.size_change_slope() is None  # no change yet
    for rank, new in enumerate([8, 24, 8]):
        _steps(mon, rank, 0, [(16, 0.05 + 0.0001 * 16)] * 5 + [(new, 0.05 + 0.0001 * new)] * 9)
    measured = mon.size_change_slope()
    assert measured is not None and measured.seconds_per_record == pytest.approx(0.0001)
    # weight: 8² / (1/5 + 1/8) for each change of 8 records
    assert measured.weight == pytest.approx(3 * 64 / (1 / 5 + 1 / 8))
    snap = mon.snapshot(13)
    assert snap.measured_slope == measured
    assert snap.worker_short[0].compute_per_sample_s == pytest.approx((0.05 + 0.0008) / 8, rel=0.2)
    flat = Monitor(l_trans=100, l_per=100)
    for rank, (new, bpt) in enumerate([(24, 0.099), (8, 0.101), (24, 0.1)]):
        _steps(flat, rank, 0, [(16, 0.1)] * 3 + [(new, bpt)] * 3)  # noise: slopes <= 0
    measured = flat.size_change_slope()
    assert measured is not None and measured.seconds_per_record == 0.0


def test_a_size_change_is_measured_from_its_regime_on_and_by_its_precision():
    """A straggler's onset (a fixed 0.12 s) 3 steps before its plan shrinks it
    16 -> 8: the steps before the onset do not count, or the plan would seem to
    save nothing. The median weighs each change by its precision: two changes
    of 3 records that measured nonsense do not outvote one of 8."""
    mon = Monitor(l_trans=100, l_per=100)
    rows = [(16, 16 / 100)] * 6 + [(16, 0.12 + 16 / 100)] * 3 + [(8, 0.12 + 8 / 100)] * 8
    _steps(mon, 0, 0, rows)
    _steps(mon, 1, 0, [(20, 0.2)] * 8 + [(23, 0.3)] * 8)  # +3 records, +100 ms
    _steps(mon, 2, 0, [(20, 0.3)] * 8 + [(17, 0.2)] * 8)  # -3 records, -100 ms
    [change] = mon._workers[0].size_changes.done
    assert change.slope == pytest.approx(0.01)
    measured = mon.size_change_slope()
    assert measured is not None and measured.seconds_per_record == pytest.approx(0.01)
    # A change too small to tell from the noise (< 10 % of the batch) is no measurement.
    small = Monitor(l_trans=100, l_per=100)
    _steps(small, 0, 0, [(32, 0.3)] * 4 + [(31, 0.4)] * 8)
    assert not small._workers[0].size_changes.measured()


def test_a_change_is_measured_before_its_last_steps_and_outlives_the_windows():
    """A decision two steps after a plan applied already sees its change (first
    measurement), and the measurement stays once the windows hold one size."""
    mon = Monitor(l_trans=5, l_per=5)
    for rank in range(3):
        _steps(mon, rank, 0, [(16, 0.05 + 0.001 * 16)] * 4 + [(8, 0.05 + 0.001 * 8)] * 2)
    measured = mon.size_change_slope()
    assert measured is not None and measured.seconds_per_record == pytest.approx(0.001)
    for rank in range(3):
        _steps(mon, rank, 6, [(8, 0.05 + 0.001 * 8)] * 30)
    snap = mon.snapshot(35)
    assert snap.worker_short[0].line is None  # one size in every window now
    assert snap.measured_slope is not None
    assert snap.measured_slope.seconds_per_record == pytest.approx(0.001)


def test_a_batch_cut_short_by_the_end_of_the_data_is_not_a_faster_worker():
    """At the end of the data a worker's batch of 32 holds 8 records and takes a
    quarter of the time: per record it is as fast as before, not 4x faster."""
    mon = Monitor(l_trans=10, l_per=10)
    for t in range(3):
        mon.report_worker(0, now=t, step=t, batch_size=32, compute_s=0.32, comm_s=0.0, samples=32)
    mon.report_worker(0, now=3, step=3, batch_size=32, compute_s=0.08, comm_s=0.0, samples=8)
    st = mon.snapshot(3).worker_short[0]
    assert st.throughput == pytest.approx(100.0)
    assert st.mean_batch == pytest.approx((3 * 32 + 8) / 4)


def test_steps_fed_as_columns_leave_the_monitor_as_one_at_a_time_does():
    """Controller.observe feeds a worker's ten steps a message as columns
    (report_steps); the windows, profiles and snapshot must be exactly those of
    feeding the same steps one by one, idle steps and server exchanges included."""
    import random

    from dtlaunch.supervisor.control.controller import Controller
    from dtlaunch.supervisor.control.policies import parse_policy
    from dtlaunch.wire.messages import ServerComm, StepReport, StepReports

    rng = random.Random(7)
    one_by_one = Controller(parse_policy("nd"), interval=1.0, spare_hosts=["s"])
    columns = Controller(parse_policy("nd"), interval=1.0, spare_hosts=["s"])
    now = 0.0
    for message in range(60):
        now += 1.0
        for rank in range(4):
            reports = []
            for k in range(rng.randint(0, 12)):
                step = message * 20 + k
                idle = message < 3 and rank == 1  # a reader waiting for its first lease
                reports.append(
                    StepReport(
                        step=step,
                        batch_size=rng.choice([0, 16, 32]),
                        compute_s=round(rng.uniform(0.0, 0.2) * (3 if rank == 3 else 1), 6),
                        comm_s=round(rng.uniform(0.0, 0.02), 6),
                        samples=0 if idle else rng.choice([0, 16, 32, 32]),
                        age_s=round(0.1 * (12 - k), 6),
                        servers=[
                            ServerComm(server=j, nbytes=rng.choice([0, 4096]), comm_s=0.001)
                            for j in range(rank % 3)
                        ],
                    )
                )
            rng.shuffle(reports)  # out of step order: both must order them
            msg = StepReports.of(reports)
            columns.observe(rank, msg, now)
            for report in sorted(msg.rows(), key=lambda r: r.step):
                one_by_one.monitor.report_worker(
                    rank,
                    now=max(0.0, now - report.age_s),
                    step=report.step,
                    batch_size=max(1, report.batch_size),
                    compute_s=report.compute_s,
                    comm_s=report.comm_s,
                    samples=report.samples,
                    server_samples=tuple((c.server, c.nbytes, c.comm_s) for c in report.servers),
                )
        if message % 10 == 9:
            assert columns.monitor.snapshot(now) == one_by_one.monitor.snapshot(now), message
    assert columns.monitor.snapshot(now).worker_long  # it did see steps


def test_step_columns_keep_step_order_and_round_seconds_to_a_microsecond():
    from dtlaunch.wire.messages import ServerComm, StepReport, StepReports

    rows = [
        StepReport(step=3, batch_size=8, compute_s=0.1234567891, samples=8, age_s=0.25),
        StepReport(
            step=1, batch_size=8, compute_s=0.5, comm_s=1e-9, age_s=0.5,
            servers=[ServerComm(server=0, nbytes=10, comm_s=0.00012345678)],
        ),
    ]  # fmt: skip
    msg = StepReports.of(rows)
    assert msg.step == [1, 3] and msg.compute_s == [0.5, 0.123457] and msg.comm_s == [0.0, 0.0]
    assert msg.servers[0][0].comm_s == 0.000123 and msg.servers[1] == []
    assert [r.step for r in msg.rows()] == [1, 3] and msg.in_step_order() is msg
    unordered = StepReports(
        step=[3, 1], batch_size=[8, 4], compute_s=[0.1, 0.2], comm_s=[0.0, 0.0],
        samples=[8, 4], age_s=[0.0, 0.1], injected_s=[0.0, 0.0],
    )  # fmt: skip
    ordered = unordered.in_step_order()
    assert ordered.step == [1, 3] and ordered.batch_size == [4, 8] and ordered.age_s == [0.1, 0.0]
    with pytest.raises(ValueError, match="unequal length"):
        StepReports(
            step=[1], batch_size=[], compute_s=[0.1], comm_s=[0.0], samples=[1], age_s=[0.0],
            injected_s=[0.0],
        )  # fmt: skip


def test_the_status_reads_the_last_decisions_view_while_it_is_recent():
    """Controller.recent_view: the status's stragglers come from the view the
    policy decided on while it is at most a control interval old (a fresh view of
    1,000 workers costs ~20 ms of the supervisor's loop per answer), else fresh."""
    from dtlaunch.supervisor.control.controller import Controller
    from dtlaunch.supervisor.control.policies import parse_policy
    from dtlaunch.wire.messages import StepReport, StepReports

    controller = Controller(parse_policy("nd"), interval=10.0, spare_hosts=[])
    for step in range(50):
        for rank in range(3):
            report = StepReport(step=step, batch_size=8, samples=8, compute_s=0.1 * (1 + rank))
            controller.observe(rank, StepReports.of([report]), 0.2 * step)
    before = controller.recent_view(5.0)  # no decision yet: a fresh view
    assert before.now == 5.0
    controller.decide(10.0, remaining_steps=100)
    decided = controller.recent_view(10.0)
    assert decided.now == 10.0
    assert controller.recent_view(19.5) is decided  # within one interval: the same view
    fresh = controller.recent_view(20.5)
    assert fresh is not decided and fresh.now == 20.5
    assert controller.recent_view(9.0).now == 9.0  # a time before the decision: fresh
