"""``--policy dd`` (AntDT-DD, eq. 4) and the hostfile's device bounds, driven
through the real Controller and Monitor with a fake clock."""

from __future__ import annotations

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import parse_hostfile
from dtlaunch.solvers.dd import DeviceClass, solve_dd
from dtlaunch.supervisor.control import Controller, host_device
from dtlaunch.supervisor.control.actions import AdjustBatchSize
from dtlaunch.supervisor.control.policies import parse_policy
from dtlaunch.wire.messages import StepReport, StepReports

HOSTS = parse_hostfile(
    "v1 class=v100 bmin=8 bmax=64\n"
    "v2 class=v100 bmin=8 bmax=64\n"
    "p1 class=p100 bmin=8 bmax=64\n"
    "p2 class=p100 bmin=8 bmax=64\n"
)
ON = {0: "v1", 1: "v2", 2: "p1", 3: "p2"}


def _controller(policy: str, hosts=HOSTS) -> Controller:
    return Controller(
        parse_policy(policy),
        interval=1.0,
        spare_hosts=[],
        host_devices={h.label: host_device(h) for h in hosts},
    )


def _feed(controller: Controller, seconds_per_record: dict[int, float], steps: range, t0=0.0):
    """Every worker runs its planned share each step at its own speed."""
    for step in steps:
        for rank, per_record in seconds_per_record.items():
            size = controller.batch_plan.get(rank, 64)
            records = size * controller.accumulation_plan.get(rank, 1)
            report = StepReport(
                step=step, batch_size=size, samples=records, compute_s=records * per_record
            )
            controller.observe(rank, StepReports.of([report]), t0 + 0.5 * step)


SPEEDS = {0: 1 / 1600, 1: 1 / 1600, 2: 1 / 1000, 3: 1 / 1000}  # V100 1.6x a P100


def test_dd_profiles_then_plans_batch_and_accumulation_per_declared_class():
    controller = _controller("dd:l_trans=5,l_per=10,profile=4")
    _feed(controller, SPEEDS, range(2))
    [wait] = controller.policy.decide(controller.monitor.snapshot(0.5, devices=None))
    assert "profiling" in wait.reason
    _feed(controller, SPEEDS, range(2, 8))
    [plan] = controller.decide(4.0, remaining_steps=None, worker_hosts=ON)
    assert isinstance(plan, AdjustBatchSize)
    expected = solve_dd(
        [DeviceClass(1000.0, 8, 64, 2), DeviceClass(1600.0, 8, 64, 2)], 256
    )  # classes in name order: p100, v100
    fast, slow = 1, 0
    assert plan.sizes == {r: expected.batch_sizes[fast if r < 2 else slow] for r in ON}
    assert plan.accumulations == {r: expected.accumulations[fast if r < 2 else slow] for r in ON}
    assert max(plan.accumulations.values()) > 1  # the fast class accumulates past bmax
    assert sum(plan.sizes[r] * plan.accumulations[r] for r in ON) == 256  # B unchanged
    assert max(plan.sizes.values()) <= 64  # never past bmax
    assert plan.inputs["classes"]["v100"]["ranks"] == [0, 1]
    assert plan.inputs["makespan_optimal_s"] < plan.inputs["makespan_current_s"]
    assert controller.accumulation_plan == plan.accumulations


def test_dd_decides_again_only_when_a_class_speed_changes():
    controller = _controller("dd:l_trans=3,l_per=6,profile=3,apply_after=1")
    _feed(controller, SPEEDS, range(8))
    [plan] = controller.decide(4.0, remaining_steps=None, worker_hosts=ON)
    assert isinstance(plan, AdjustBatchSize)
    _feed(controller, SPEEDS, range(8, 30))  # the plan in force, same speeds
    assert controller.decide(15.0, remaining_steps=None, worker_hosts=ON) == []
    slower = {**SPEEDS, 2: 1 / 500, 3: 1 / 500}  # the P100s halve their speed
    _feed(controller, slower, range(30, 50))
    [again] = controller.decide(25.0, remaining_steps=None, worker_hosts=ON)
    assert isinstance(again, AdjustBatchSize)
    assert again.sizes[2] * again.accumulations[2] < plan.sizes[2] * plan.accumulations[2]


def test_dd_infers_classes_from_speed_when_the_hostfile_declares_none():
    bare = parse_hostfile("v1\nv2\np1\np2\n")
    controller = _controller("dd:l_trans=5,l_per=10,profile=4", hosts=bare)
    _feed(controller, SPEEDS, range(8))
    [plan] = controller.decide(4.0, remaining_steps=None, worker_hosts=ON)
    assert isinstance(plan, AdjustBatchSize)
    assert plan.inputs["classes"]["speed-1"]["ranks"] == [2, 3]
    assert plan.inputs["classes"]["speed-2"]["ranks"] == [0, 1]
    # no bmax=: the batch the job started with (64) is the memory bound
    assert plan.inputs["classes"]["speed-2"]["max_batch"] == 64
    assert max(plan.sizes.values()) <= 64


def test_dd_says_why_when_no_plan_fits_the_bounds():
    tight = parse_hostfile(
        "v1 class=v bmin=60\nv2 class=v bmin=60\np1 class=p bmin=60\np2 class=p bmin=60\n"
    )
    controller = _controller("dd:l_trans=5,l_per=10,profile=4,cmax=1", hosts=tight)
    _feed(controller, SPEEDS, range(8))
    [none] = controller.policy.decide(
        controller.monitor.snapshot(4.0, devices=controller._devices())
    )
    assert controller.decide(4.0, remaining_steps=None, worker_hosts=ON) == []
    assert "within" in none.reason or "no feasible plan" in none.reason


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dd:cmin=3,cmax=2", "cmin=3 exceeds cmax=2"),
        ("dd:cmax=0", "cmax must be an integer >= 1"),
        ("dd:cmax=100", "AntDT uses up to 5"),
        ("dd:speed=3", "unknown parameter speed"),
    ],
)
def test_bad_dd_parameters_name_the_fix(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_policy(text)


def test_lb_bsp_never_plans_past_a_declared_bmax():
    hosts = parse_hostfile("v1 bmax=70\nv2 bmax=70\np1\np2\n")
    controller = _controller("lb-bsp:l_trans=5,l_per=10", hosts=hosts)
    _feed(controller, SPEEDS, range(8))
    [plan] = controller.decide(4.0, remaining_steps=None, worker_hosts=ON)
    assert isinstance(plan, AdjustBatchSize)
    assert plan.sizes[0] == plan.sizes[1] == 70  # eq. 3 alone would give the V100s ~79
    assert sum(plan.sizes.values()) == 256
    assert plan.accumulations == {}


def test_hostfile_device_bounds_are_checked_per_line_and_per_class():
    from dtlaunch.errors import HostfileError

    [h] = parse_hostfile("n1 class=v100 bmin=8 bmax=96")
    assert (h.device_class, h.min_batch, h.max_batch) == ("v100", 8, 96)
    with pytest.raises(HostfileError) as err:
        parse_hostfile("a class=v bmax=64\nb class=v bmax=32\nc bmin=9 bmax=3\nd bmax=0\n")
    text = str(err.value)
    assert "<hostfile>:2:1: class=v has bmax=32 here but bmax=64 on line 1" in text
    assert "<hostfile>:3:8: bmin=9 exceeds bmax=3" in text
    assert "<hostfile>:4:8: bmax 0 is out of range" in text


def test_dd_in_a_parameter_server_job_is_refused_with_the_alternatives(tmp_path):
    from dtlaunch.config import JobSpec

    spec = JobSpec(run_id="r", run_dir=tmp_path, script="t.py", workers=2, servers=1,
                   mode="ps", policy="dd:cmax=3")  # fmt: skip
    with pytest.raises(ConfigError, match="use --policy lb-bsp or nd"):
        spec.validate()
    JobSpec(run_id="r", run_dir=tmp_path, script="t.py", workers=2, policy="dd").validate()


def test_dd_benchmark_summary_holds_every_target_and_the_ceiling():
    from benchmarks.dd import Mix, Outcome, render_markdown, summarize

    mix = Mix(fast=4, slow=1)
    assert mix.fast_hosts[-1] == "127.0.0.5" and mix.slow_hosts == ("127.0.0.6",)
    assert mix.global_batch == 320 and mix.hostfile_lines()[-1].startswith("127.0.0.6 slots=1")

    def outcome(column, train_s, loss):
        detail = {"final_loss": loss, "weights_vs_one_process": 0.0, "plans": []}
        return Outcome(column=column, ok=True, train_s=train_s, wall_s=train_s + 20, detail=detail)

    good = summarize(
        [outcome("none", 140.0, 0.0025), outcome("lb-bsp", 120.0, 0.0025005),
         outcome("dd", 100.0, 0.0025)], 200, mix,
    )  # fmt: skip
    assert good["setup"]["ceiling_over_none"] == 1.48  # (1.6 x 4 + 1) / 5
    assert good["dd_speedup"] == {"lb-bsp": 1.2, "none": 1.4}
    assert all(good["met"].values()) and good["all_ok"]
    assert "| dd | 100.00 |" in render_markdown(good)
    bad = summarize(
        [outcome("none", 130.0, 0.0025), outcome("lb-bsp", 110.0, 0.0025),
         outcome("dd", 100.0, 0.0026)], 200, mix,
    )  # fmt: skip
    assert bad["met"] == {"lb-bsp": False, "none": False, "final_loss": False}
