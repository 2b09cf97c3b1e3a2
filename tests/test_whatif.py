"""``dtlaunch replay --policy``: a policy re-run over recorded step reports.

Synthetic events with a known straggler check the fake clock, the decision
schedule, the remaining-work and worker-gone inputs exactly; a real run checks
that the recorded policy re-decides what it decided, and another lambda does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.events import Event, read_events
from dtlaunch.solvers.batch import solve_batch_sizes
from dtlaunch.ui.runlog import read_run
from dtlaunch.ui.timeline import to_plain
from dtlaunch.ui.whatif import (
    inherit_params,
    initial_remaining_steps,
    paired_rows,
    render_what_if,
    tick_times,
    what_if,
)
from tests.elastic_run import POLICY as RECORDED
from tests.elastic_run import ElasticRun
from tests.jobs import events, run

FAST_S, SLOW_S, SLOW_FROM = 0.1, 0.5, 10.0


def _ev(kind: str, at: float, role: str = "", rank: int = -1, **data: Any) -> Event:
    return Event(kind=kind, mono=at, wall=1000.0 + at, role=role, rank=rank, data=data)


def _straggler_events(end: float = 16.0) -> list[Event]:
    """3 workers, batch 10, BPT 0.1 s; worker 2 takes 0.5 s a step from t=10 s.
    Each step is reported the moment it ends (one reports event per step)."""
    evs = [_ev("job_start", 0.0)] + [_ev("running", 0.1, "worker", r) for r in range(3)]
    for rank in range(3):
        t, step = 0.2, 0
        while True:
            bpt = SLOW_S if rank == 2 and t >= SLOW_FROM - 1e-9 else FAST_S
            t, step = round(t + bpt, 6), step + 1
            if t > end:
                break
            evs.append(_ev("reports", t, "worker", rank, step=[step], batch_size=[10],
                           compute_s=[bpt], comm_s=[0.0], samples=[10], injected_s=[0.0],
                           t=[t]))  # fmt: skip
    evs.sort(key=lambda e: e.wall)
    evs.append(_ev("job_end", end + 0.1, status="succeeded"))
    return evs


def _run(evs: list[Event], policy: str, **kw: Any):
    return what_if(evs, policy, control_interval=1.0, tick_s=0.5, **kw)


def test_adjust_bs_comes_at_the_first_decision_that_sees_the_straggler() -> None:
    result = _run(_straggler_events(), "nd:l_trans=2,l_per=10")
    assert result.would, "a 5x slower worker must be acted on"
    first = result.would[0]
    # Decisions fall on ticks 0.5, 1.5, ... ; the short window [T-2, T] first has
    # worker 2's mean BPT >= 1.5 x the mean at T = 11.5 s (3 slow steps of 8).
    assert first.action == "ADJUST_BS"
    assert first.at_s == pytest.approx(11.5)
    sizes = {int(k): v for k, v in first.fields["sizes"].items()}
    assert sum(sizes.values()) == 30 and sizes[2] < 10 < min(sizes[0], sizes[1])
    assert "transient straggler worker 2" in first.reason
    assert result.decisions == 16  # one per control interval from 0.5 s to 15.5 s
    assert result.actual == []


def test_decisions_fall_on_the_grid_the_run_recorded() -> None:
    # The live control loop started at 0.3 s and ticked every 0.5 s from there;
    # a resumed supervisor's loop started again at 12.05 s on its own grid.
    evs = [*_straggler_events(), _ev("control_schedule", 0.3, tick_s=0.5, interval_s=1.0)]
    evs.sort(key=lambda e: e.wall)
    result = _run(evs, "nd:l_trans=2,l_per=10")
    # Decisions at 0.8, 1.8, ...: the one at 10.8 s has seen one slow step, 11.8 s three.
    assert result.would[0].action == "ADJUST_BS"
    assert result.would[0].at_s == pytest.approx(11.8)
    assert result.decisions == 16  # 0.8 s to 15.8 s
    resumed = [*evs, _ev("control_schedule", 12.05, tick_s=0.25, interval_s=1.0)]
    resumed.sort(key=lambda e: e.wall)
    ticks = tick_times(read_run(resumed), 0.5)
    assert ticks[:3] == pytest.approx([0.8, 1.3, 1.8])
    before, after = [t for t in ticks if t < 12.05], [t for t in ticks if t > 12.05]
    assert before[-1] == pytest.approx(11.8) and after[:2] == pytest.approx([12.3, 12.55])
    assert after[-1] == pytest.approx(16.05)  # the last event (job_end) at 16.1 s
    # A run recorded before the grid was: every tick_s from its first event.
    assert tick_times(read_run(_straggler_events()), 0.5)[:2] == pytest.approx([0.5, 1.0])


def test_a_larger_lambda_names_no_straggler_and_kills_nothing() -> None:
    evs = _straggler_events()
    result = _run(evs, "nd:l_trans=2,l_per=6,lambda=6,restart_cost=1",
                  initial_remaining=1000, spare_hosts=["spare1"])  # fmt: skip
    # Balancing still pays (worker 2 is 5x slower), but nobody is a straggler at 6x.
    assert result.would and {a.action for a in result.would} == {"ADJUST_BS"}
    assert not any("transient straggler" in a.reason for a in result.would)
    assert all("throughput changed" in a.reason for a in result.would)


def test_kill_restart_needs_the_remaining_work_and_a_worker_still_there() -> None:
    evs = _straggler_events()
    policy = "nd:l_trans=2,l_per=6,restart_cost=1"
    spare = ["spare1"]

    def kills(events: list[Event], **kw: Any) -> list[Any]:
        return [a for a in _run(events, policy, **kw).would if a.action == "KILL_RESTART"]

    # Remaining work unknown (no data set, no shards_done): the policy never kills.
    assert not kills(evs, spare_hosts=spare)
    # No spare host to restart it on (the cluster is busy): no kill either.
    assert not kills(evs, initial_remaining=1000)
    # Both known: worker 2's 6 s window reaches 1.5 x the fastest worker's BPT at
    # 13.5 s, a decision before it reaches 1.5 x the mean of all three.
    found = kills(evs, initial_remaining=1000, spare_hosts=spare)
    assert len(found) == 1 and found[0].target == "worker 2 onto spare1"
    assert found[0].at_s == pytest.approx(13.5)
    [paper] = [a for a in _run(evs, policy + ",reference=mean", initial_remaining=1000,
                               spare_hosts=spare).would if a.action == "KILL_RESTART"]  # fmt: skip
    assert paper.at_s == pytest.approx(14.5)
    # The DDS reported almost nothing left at 12 s: the restart would not pay.
    late = [*evs, _ev("shards_done", 12.0, "worker", 0, count=1, remaining_steps=1)]
    late.sort(key=lambda e: e.wall)
    assert not kills(late, initial_remaining=1000, spare_hosts=spare)
    # Worker 2 ended at 13 s: its windows start over, too short to judge it by 14.5 s.
    gone = [*evs, _ev("exit", 13.0, "worker", 2, verdict="succeeded")]
    gone.sort(key=lambda e: e.wall)
    assert not [a for a in kills(gone, initial_remaining=1000, spare_hosts=spare)
                if a.at_s < 15.0]  # fmt: skip


def test_a_slow_server_is_judged_from_its_recorded_updates_and_exchanges() -> None:
    """Two workers at 1 s a step whose exchange with server 1 takes 0.6 s (0.05 s
    with server 0), server 1's updates 10x server 0's: nd moves server 1 once its
    window is full, in the replay as it would live; the servers' updates come
    from the ``server_reports`` events, batched as the supervisor took them."""
    evs = [_ev("job_start", 0.0)] + [_ev("running", 0.1, "worker", r) for r in range(2)]
    for step in range(1, 31):
        t = 0.2 + step * 1.0
        for rank in range(2):
            evs.append(_ev("reports", t, "worker", rank, step=[step], batch_size=[10],
                           compute_s=[0.3], comm_s=[0.7], samples=[10], injected_s=[0.0],
                           t=[t], servers=[[[0, 1000, 0.05], [1, 1000, 0.6]]]))  # fmt: skip
        if step % 2 == 0:  # two updates a report, as the fleet asks every interval
            for server, update_s in ((0, 0.003), (1, 0.03)):
                evs.append(_ev("server_reports", t + 0.05, "server", server,
                               version=[step - 1, step], update_s=[update_s, update_s],
                               injected_s=[0.0, 0.0], dropped=[[], []],
                               t=[t - 1.0, t]))  # fmt: skip
    evs.sort(key=lambda e: e.wall)
    evs.append(_ev("job_end", 31.0, status="succeeded"))
    run_log = read_run(evs)
    assert [row.version for row in run_log.server_updates[:2]] == [(1, 2), (1, 2)]
    assert run_log.server_updates[0].ended_s == pytest.approx((1.2, 2.2))
    result = _run(evs, "nd:l_trans=2,l_per=6,restart_cost=1", initial_remaining=1000,
                  spare_hosts=["spare1"])  # fmt: skip
    kills = [a for a in result.would if a.action == "KILL_RESTART"]
    assert kills and kills[0].target == "server 1 onto spare1"
    # Full at 6.0 s (6 s x fill 0.8 after the first update, ended at 1.2 s); its
    # fifth and sixth updates reach the supervisor at 6.25 s; the next tick is 6.5 s.
    assert kills[0].at_s == pytest.approx(6.5)
    # Without the exchanges (only the updates, 27 ms apart) the saving is noise
    # beside a 1 s step, as before servers' exchanges counted.
    quiet = [e for e in evs if e.kind != "reports"] + [
        _ev("reports", e.mono, "worker", e.rank, **{**e.data, "servers": []})
        for e in evs if e.kind == "reports"
    ]  # fmt: skip
    quiet.sort(key=lambda e: e.wall)
    assert not [a for a in _run(quiet, "nd:l_trans=2,l_per=6,restart_cost=1",
                                initial_remaining=1000, spare_hosts=["spare1"]).would
                if a.action == "KILL_RESTART"]  # fmt: skip


def test_recorded_and_what_if_actions_share_a_row_when_they_agree() -> None:
    evs = _straggler_events()
    sizes = {"0": 14, "1": 14, "2": 2}
    evs.append(_ev("decision", 11.6, policy="nd", action="ADJUST_BS", reason="recorded",
                   sizes=sizes, apply_at_step=120, inputs={"x": 1}))  # fmt: skip
    evs.append(_ev("decision", 14.6, "worker", 1, policy="nd", action="KILL_RESTART",
                   reason="recorded kill", target_host=None, inputs={}))  # fmt: skip
    evs.sort(key=lambda e: e.wall)
    result = _run(evs, "nd:l_trans=2,l_per=10")
    rows = paired_rows(result)
    assert rows[0][1] is not None and rows[0][2] is not None  # same kind, 0.1 s apart
    assert rows[0][1].reason == "recorded" and rows[0][2].action == "ADJUST_BS"
    kill = next(r for r in rows if r[1] is not None and r[1].action == "KILL_RESTART")
    assert kill[2] is None and kill[1].target == "worker 1"
    assert "inputs" not in kill[1].fields
    text = " ".join(to_plain(render_what_if(result), width=160).split())
    assert "ADJUST_BS sizes 0:14 1:14 2:2 @step 120" in text
    assert "taken: ADJUST_BS x1, KILL_RESTART x1" in text
    data = json.loads(json.dumps(result.to_json()))
    assert data["counts"]["actual"] == {"ADJUST_BS": 1, "KILL_RESTART": 1}
    assert data["would"][0]["at_s"] == pytest.approx(11.5)


def test_bad_policy_and_interval_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown parameter lamda"):
        _run(_straggler_events(end=2.0), "nd:lamda=2")
    with pytest.raises(ValueError, match="must be > 0"):
        what_if([], "nd", control_interval=0.0, tick_s=0.5)


def test_auto_is_refused_with_the_reason_and_where_its_plans_are() -> None:
    with pytest.raises(ConfigError, match="cannot re-decide a run: auto plans from"):
        what_if([], "auto:sample_s=5", control_interval=1.0, tick_s=0.5)


def test_initial_remaining_steps_counts_whole_shards() -> None:
    spec = {"dataset_size": 1050, "shard_size": 100, "epochs": 2, "global_batch": 30}
    assert initial_remaining_steps(spec) == 11 * 2 * 100 // 30
    assert initial_remaining_steps({"dataset_size": 100}) is None


# ------------------------------------------------------------------ real run
# The shared real job (tests/elastic_run.py): workers 2 and 3 run on a contended
# host at 2.4x the others' BPT; nd (lambda 1.5) balanced them, then moved both
# onto the spare.


@pytest.fixture(scope="module")
def recorded_run(elastic_run: ElasticRun) -> Path:
    result = elastic_run.result
    assert result.returncode == 0, result.stdout + result.stderr
    return elastic_run.run_dir


def _cli_what_if(run_dir: Path, policy: str) -> dict[str, Any]:
    result = run(["replay", str(run_dir), "--policy", policy, "--json"], env={}, timeout=60)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _kills(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in actions if a["action"] == "KILL_RESTART"]


@pytest.mark.integration
def test_the_recorded_policy_re_decides_what_it_decided(recorded_run: Path) -> None:
    data = _cli_what_if(recorded_run, RECORDED)
    assert data["recorded_policy"] == RECORDED and data["control_interval_s"] == 0.5
    actual, would = data["actual"], data["would"]
    assert actual and actual[0]["action"] == "ADJUST_BS"
    assert would and would[0]["action"] == "ADJUST_BS"
    assert abs(would[0]["at_s"] - actual[0]["at_s"]) <= 0.5
    # The plans agree on what matters: the same global batch, the slow host's
    # workers shrunk below the equal share and below the fast ones. Their exact
    # sizes are not compared: the replay ticks on the grid the live loop recorded,
    # but a live tick comes later by the loop's lateness (ms, more on a loaded
    # machine) and sees the reports that arrived meanwhile; a first plan comes
    # from 2-3 steps a worker, so a step more or less moves a throughput by
    # several percent (seen: slow shares 9+6 live, 6+6 replayed). Neither is a
    # fast worker promised more than the equal share: on a loaded machine one
    # of them can have a slow step among its first few (seen in CI: 10+16 fast,
    # 7+7 slow); the slow host's pair below both of them is the claim.
    would_sizes, actual_sizes = would[0]["fields"]["sizes"], actual[0]["fields"]["sizes"]
    assert would_sizes.keys() == actual_sizes.keys() == {"0", "1", "2", "3"}
    assert sum(would_sizes.values()) == sum(actual_sizes.values()) == 40
    for sizes in (would_sizes, actual_sizes):
        slowest_share = max(sizes["2"], sizes["3"])
        assert slowest_share < 10 and slowest_share < min(sizes["0"], sizes["1"]), sizes
    # What the live plan was made from is in its event: re-solved, it gives the
    # same sizes (a proportional model per worker until a line is fitted).
    [decision] = [e for e in events(recorded_run)
                  if e["kind"] == "decision" and e.get("action") == "ADJUST_BS"][:1]  # fmt: skip
    inputs = decision["inputs"]
    if not inputs["step_model"]:
        ranks = sorted(inputs["throughput_used"], key=int)
        plan = solve_batch_sizes([inputs["throughput_used"][r] for r in ranks],
                                 inputs["global_batch"], inputs["min_batch"])  # fmt: skip
        assert dict(zip(ranks, plan, strict=True)) == actual_sizes
    first_kill = _kills(actual)[0]
    assert {k["fields"]["rank"] for k in _kills(actual)} == {2, 3}
    assert _kills(would) and abs(_kills(would)[0]["at_s"] - first_kill["at_s"]) <= 0.5


@pytest.mark.parametrize(
    ("given", "recorded", "expected"),
    [
        ("nd:lambda=2.0", "nd:l_trans=3,l_per=8", "nd:l_trans=3,l_per=8,lambda=2.0"),
        ("nd:l_per=4", "nd:l_trans=3,l_per=8", "nd:l_trans=3,l_per=4"),
        ("nd", "nd:lambda=1.2", "nd:lambda=1.2"),
        ("lb-bsp:lambda=2", "nd:l_trans=3", "lb-bsp:lambda=2"),  # another policy: as given
        ("nd:lambda=2", "", "nd:lambda=2"),
        ("my.mod:Pol:x=2", "my.mod:Pol:x=1,y=3", "my.mod:Pol:y=3,x=2"),
        ("my.mod:Other:x=2", "my.mod:Pol:y=3", "my.mod:Other:x=2"),
    ],
)
def test_a_what_if_of_the_runs_own_policy_keeps_the_parameters_it_does_not_name(
    given: str, recorded: str, expected: str
) -> None:
    assert inherit_params(given, recorded) == expected


@pytest.mark.integration
def test_a_larger_lambda_gives_a_different_plausible_set(recorded_run: Path) -> None:
    same = _cli_what_if(recorded_run, RECORDED)
    # Only lambda is named: the run's windows and costs are kept.
    other = _cli_what_if(recorded_run, "nd:lambda=4.0")
    assert other["policy"] == RECORDED + ",lambda=4.0"
    killed_at = _kills(same["actual"])[0]["at_s"]
    # At 2.4x the others, workers 2 and 3 are no stragglers for lambda 4.0: no
    # KILL_RESTART up to the recorded one (later recorded reports come from the
    # replacement, which what-if does not simulate away).
    assert not [a for a in _kills(other["would"]) if a["at_s"] <= killed_at + 0.5]
    # It still balances batch sizes, naming no transient straggler, up to the
    # recorded KILL_RESTART too: the reports after it are another regime (the
    # replacement starting, workers out of data at the end), which under make
    # test's load once put three workers 4x behind the fourth at step 184.
    balances = [
        a for a in other["would"] if a["action"] == "ADJUST_BS" and a["at_s"] <= killed_at + 0.5
    ]
    assert balances and not any("transient straggler" in a["reason"] for a in balances)
    # The table names both policies and tallies each side.
    result = run(["replay", str(recorded_run), "--policy", "nd:lambda=4.0"], env={})
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert f"what-if: {RECORDED},lambda=4.0" in text and "taken: ADJUST_BS x" in text
    assert "KILL_RESTART x2" in text


@pytest.mark.integration
def test_bad_policy_on_the_command_line_exits_2(recorded_run: Path) -> None:
    result = run(["replay", str(recorded_run), "--policy", "fastest"], env={}, timeout=60)
    assert result.returncode == 2
    assert "unknown policy 'fastest'" in " ".join(result.stderr.split())


@pytest.mark.integration
def test_events_of_the_real_run_feed_the_what_if_in_process(recorded_run: Path) -> None:
    evs = list(read_events(recorded_run / "events.jsonl"))
    result = what_if(evs, "lb-bsp:l_trans=2", control_interval=0.5, tick_s=0.5)
    assert result.skipped_reports == 0 and result.decisions >= 4
    assert result.would and result.would[0].action == "ADJUST_BS"


def test_replay_with_dd_plans_by_the_hostfile_classes_of_the_recorded_hosts() -> None:
    """``replay --policy dd`` knows each worker's host from its spawn event and
    the host's class and bounds from job.json, as the live supervisor does."""
    from dtlaunch.cli.replay import _host_devices

    hosts = {0: "v1", 1: "v2", 2: "p1"}
    evs = [_ev("job_start", 0.0)]
    evs += [Event(kind="spawn", mono=0.05, wall=1000.05, role="worker", rank=r, host=h, data={})
            for r, h in hosts.items()]  # fmt: skip
    evs += [_ev("running", 0.1, "worker", r) for r in hosts]
    for rank in hosts:
        bpt = 0.64 if rank == 2 else 0.4  # 64 records: v100 160/s, p100 100/s
        for step in range(1, 12):
            t = round(0.2 + step * 0.64, 6)
            evs.append(_ev("reports", t, "worker", rank, step=[step], batch_size=[64],
                           compute_s=[bpt], comm_s=[0.0], samples=[64], injected_s=[0.0],
                           t=[t]))  # fmt: skip
    evs.sort(key=lambda e: e.wall)
    from dataclasses import asdict

    from dtlaunch.hostfile import HostSpec

    declared = [("v1", "v100"), ("v2", "v100"), ("p1", "p100")]
    job = {  # job.json's hosts, as JobSpec.to_json writes them
        "hosts": [asdict(HostSpec(label=h, hostname=h, device_class=c, max_batch=66))
                  for h, c in declared]
    }  # fmt: skip
    result = _run(evs, "dd:l_trans=5,l_per=10,profile=3", host_devices=_host_devices(job))
    [plan] = [a for a in result.would if a.action == "ADJUST_BS"]
    sizes = {int(k): v for k, v in plan.fields["sizes"].items()}
    passes = {int(k): v for k, v in plan.fields["accumulations"].items()}
    assert max(sizes.values()) <= 66 and passes[0] == passes[1] > 1  # v100s accumulate
    assert sum(sizes[r] * passes[r] for r in hosts) == 192
    assert "p100" in plan.reason and "v100" in plan.reason  # declared, not inferred
