"""DLRover §4.1-4.2 by hand: eq. 10-11, the idle-PS and hot-PS rules."""

from __future__ import annotations

import math

import pytest

from dtlaunch.errors import InfeasibleError
from dtlaunch.solvers.dlrover import (
    added_workers,
    hot_server_cores,
    plan_job,
    plan_workers,
    plan_workers_on_slots,
    predicted_throughput,
    servers_for,
    workers_for,
)


def test_eq_10_and_11_give_the_papers_wide_and_deep_plan():
    # Table 1, W&D sampled with one worker: ŵ = 2.5 cores, ŝ_total = 5.7; C_total = 200.
    plan = plan_workers(total_cores=200, worker_cores=2.5, server_cores_per_worker=5.7)
    assert plan.workers == 24  # 200 / 8.2 = 24.39, the paper's N_w = 24
    assert plan.model_workers == pytest.approx(200 / 8.2)
    assert plan.server_cores == pytest.approx(200 - 24 * 2.5)  # eq. 11: 140
    assert plan.bound == "model"


def test_bounds_say_which_one_decided():
    base = {"total_cores": 8.0, "worker_cores": 0.5, "server_cores_per_worker": 0.5}
    assert plan_workers(**base).workers == 8
    fed = plan_workers(**base, server_cores_given=2.0)  # the servers feed 4
    assert (fed.workers, fed.bound) == (4, "servers")
    capped = plan_workers(**base, max_workers=3)
    assert (capped.workers, capped.bound) == (3, "max_workers")
    tiny = plan_workers(total_cores=0.2, worker_cores=0.5, server_cores_per_worker=0.1)
    assert (tiny.workers, tiny.bound) == (1, "min_workers")
    # ŝ = 0: the servers did no measurable work; only the workers' cores bound.
    assert plan_workers(total_cores=4, worker_cores=1, server_cores_per_worker=0).workers == 4
    # A quotient that lands on a whole number in floating point is not cut by one.
    assert plan_workers(total_cores=0.9, worker_cores=0.2, server_cores_per_worker=0.1).workers == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"total_cores": 0, "worker_cores": 1, "server_cores_per_worker": 0},
        {"total_cores": 4, "worker_cores": math.nan, "server_cores_per_worker": 0},
        {"total_cores": 4, "worker_cores": 1, "server_cores_per_worker": -1},
        {"total_cores": 4, "worker_cores": 1, "server_cores_per_worker": 0, "max_workers": 0},
    ],
)
def test_impossible_inputs_are_refused(kwargs):
    with pytest.raises(InfeasibleError):
        plan_workers(**kwargs)


def test_idle_servers_take_more_workers_at_most_sqrt_n_at_a_time():
    # 2 workers use 0.4 server cores (ŝ = 0.2); the servers have 2 cores: 10 fed.
    assert added_workers(workers=2, server_cores_given=2.0, server_cores_used=0.4) == 1
    assert added_workers(workers=16, server_cores_given=40.0, server_cores_used=16.0) == 4
    assert added_workers(workers=9, server_cores_given=10.0, server_cores_used=9.0) == 1
    # Busy servers, or servers that did nothing measurable: none.
    assert added_workers(workers=4, server_cores_given=2.0, server_cores_used=2.0) == 0
    assert added_workers(workers=4, server_cores_given=2.0, server_cores_used=0.0) == 0


def test_a_hot_server_needs_its_share_of_the_update_work_for_all_workers():
    # The hot one does 3 of 4 used server cores; one worker needed ŝ = 0.5 in all.
    need = hot_server_cores(
        hot_used=3.0, servers_used=4.0, one_worker_cores=0.5, workers=8, max_cores=32
    )
    assert need == pytest.approx(0.75 * 0.5 * 8)
    capped = hot_server_cores(
        hot_used=3.0, servers_used=4.0, one_worker_cores=0.5, workers=800, max_cores=32
    )
    assert capped == 32


def test_predicted_throughput_stops_growing_where_the_servers_saturate():
    rate = {"one_worker_rate": 10.0, "server_cores_given": 2.0, "server_cores_per_worker": 0.5}
    assert predicted_throughput(workers=3, **rate) == 30.0
    assert predicted_throughput(workers=6, **rate) == 40.0  # 4 workers' worth fed
    assert workers_for(2.0, 0.0) is None


def test_with_the_servers_free_the_plan_adds_the_servers_the_workers_need():
    # The auto benchmark's job: 2 cores on 8 slots of 0.25 core, one worker and
    # one server running; ŵ 0.25, ŝ 0.12. Eq. 10: 2 / 0.37 = 5.4 -> 5 workers,
    # whose 0.6 cores of updates need ceil(0.6 / (0.9 * 0.25)) = 3 servers: 8 slots.
    plan = plan_job(
        total_cores=2.0, worker_cores=0.25, server_cores_per_worker=0.12, server_limit=0.25,
        workers_now=1, servers_now=1, free_slots=6,
    )  # fmt: skip
    assert (plan.workers, plan.servers, plan.bound) == (5, 3, "model")
    assert plan.model_workers == pytest.approx(2.0 / 0.37)
    assert plan.server_cores == pytest.approx(2.0 - 5 * 0.25)
    # Two slots fewer: 4 workers need ceil(0.48 / 0.225) = 3 servers (7 > 6), so
    # 3 workers and 2 servers.
    tight = plan_job(
        total_cores=2.0, worker_cores=0.25, server_cores_per_worker=0.12, server_limit=0.25,
        workers_now=1, servers_now=1, free_slots=4,
    )  # fmt: skip
    assert (tight.workers, tight.servers, tight.bound) == (3, 2, "slots")
    # Servers that did no measurable work need no more of them; never fewer than now.
    idle = plan_job(
        total_cores=2.0, worker_cores=0.25, server_cores_per_worker=0.0, server_limit=0.25,
        workers_now=2, servers_now=2, free_slots=4,
    )  # fmt: skip
    assert (idle.workers, idle.servers) == (6, 2)
    # Nothing fits beyond the minimum: the minimum, with the servers there are.
    none = plan_job(
        total_cores=2.0, worker_cores=0.25, server_cores_per_worker=0.5, server_limit=0.25,
        workers_now=1, servers_now=1, free_slots=0,
    )  # fmt: skip
    assert (none.workers, none.servers, none.bound) == (1, 1, "min_workers")


def test_servers_for_carries_the_updates_at_the_load_asked():
    assert servers_for(5, 0.12, 0.25, load=0.9, at_least=1) == 3
    assert servers_for(5, 0.12, 0.25, load=1.0, at_least=1) == 3  # 2.4 -> 3
    assert servers_for(1, 0.12, 0.25, load=0.9, at_least=2) == 2
    assert servers_for(3, 0.0, 0.25, load=0.9, at_least=1) == 1


# ------------------------------------------------- hosts of different sizes


@pytest.mark.parametrize("cores", [4.0, 8.0, 12.0, 30.0])
@pytest.mark.parametrize("given", [None, 1.0, 2.5])
def test_with_equal_shares_the_slot_plan_is_eq_10(cores, given):
    """Every slot gives ŵ: each worker is one sampled worker, and the plan is
    eq. 10 with its bounds (the servers' CPU, the cores, the slots)."""
    for running, free in ((1, 11), (3, 2), (2, 0)):
        slots = plan_workers_on_slots(
            running=[0.5] * running, free=[0.5] * free, worker_cores=0.5,
            worker_demand=math.inf, server_cores_per_worker=0.2, server_cores_given=given,
            total_cores=cores,
        )  # fmt: skip
        closed = plan_workers(
            total_cores=cores, worker_cores=0.5, server_cores_per_worker=0.2,
            server_cores_given=given, max_workers=running + free,
        )  # fmt: skip
        assert slots.workers == max(closed.workers, 1), (running, free)
        assert slots.sampled_workers == pytest.approx(slots.workers)


def test_a_big_host_s_slots_count_for_more_workers_than_a_small_one_s():
    # One sampled worker on a 1-core slot used all of it (CPU-bound). The next free
    # slots: two of a 4-core host (4 cores each), then four of a 1-core one.
    # The server's 2 cores carry 0.25 cores per sampled worker: 8 sampled workers.
    args = dict(
        running=[1.0], worker_cores=1.0, worker_demand=math.inf,
        server_cores_per_worker=0.25, server_cores_given=2.0, total_cores=40.0,
    )  # fmt: skip
    plan = plan_workers_on_slots(free=[4.0, 4.0, 1.0, 1.0, 1.0, 1.0], **args)
    # 1 + 4 = 5 sampled workers with 2 workers; + 4 = 9 > 8 fed with 3: 2 workers.
    assert (plan.workers, plan.bound) == (2, "servers")
    assert plan.sampled_workers == pytest.approx(5.0) and plan.fed == pytest.approx(8.0)
    # Eq. 10 counts workers alike: 40 / 1.25 = 32, the server feeds 8: 8 workers, which
    # on these slots would be 1 + 4 + 4 + 4 x 1 = 13 sampled workers, 1.6x what it feeds.
    assert plan_workers(total_cores=40.0, worker_cores=1.0, server_cores_per_worker=0.25,
                        server_cores_given=2.0).workers == 8  # fmt: skip
    # Small slots first: each adds one sampled worker, up to the 8 the server feeds.
    small_first = plan_workers_on_slots(free=[1.0] * 4 + [4.0, 4.0], **args)
    assert (small_first.workers, small_first.sampled_workers) == (5, pytest.approx(5.0))


def test_a_worker_that_needs_less_than_its_share_is_worth_what_it_uses():
    # The sampled worker used 0.6 of its 2 cores: a 4-core slot adds 0.6 cores of work.
    plan = plan_workers_on_slots(
        running=[2.0], free=[4.0, 4.0, 0.3], worker_cores=0.6, worker_demand=0.6,
        server_cores_per_worker=0.1, server_cores_given=None, total_cores=3.0,
    )  # fmt: skip
    # Eq. 3: 3 workers use 1.8 cores + 0.3 of servers' load = 2.1; the 0.3-core slot
    # adds half a sampled worker: 2.1 + 0.3 + 0.05 = 2.45 <= 3 (and > 2.3 below).
    assert (plan.workers, plan.bound) == (4, "slots")
    assert plan.sampled_workers == pytest.approx(3.5)
    tight = plan_workers_on_slots(
        running=[2.0], free=[4.0, 4.0, 0.3], worker_cores=0.6, worker_demand=0.6,
        server_cores_per_worker=0.1, server_cores_given=None, total_cores=2.3,
    )  # fmt: skip
    assert (tight.workers, tight.bound) == (3, "model")


def test_running_workers_that_overload_the_servers_are_planned_fewer():
    plan = plan_workers_on_slots(
        running=[4.0, 4.0, 4.0], free=[], worker_cores=4.0, worker_demand=math.inf,
        server_cores_per_worker=1.0, server_cores_given=2.0, total_cores=64.0,
    )  # fmt: skip
    assert (plan.workers, plan.bound) == (2, "servers")
    assert plan_workers_on_slots(
        running=[4.0], free=[8.0], worker_cores=4.0, worker_demand=math.inf,
        server_cores_per_worker=1.0, server_cores_given=0.5, total_cores=64.0, min_workers=1,
    ).workers == 1  # fmt: skip
    with pytest.raises(InfeasibleError, match="share"):
        plan_workers_on_slots(
            running=[-1.0], free=[], worker_cores=1.0, worker_demand=1.0,
            server_cores_per_worker=0.1, server_cores_given=None, total_cores=4.0,
        )  # fmt: skip
