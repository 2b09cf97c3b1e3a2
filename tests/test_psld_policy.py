"""``--policy psld`` (PSLD §4) on the supervisor's side, without servers:

the policy over Monitor snapshots with a fake clock, the placement keeper's
two-phase reassignment record (what a resumed supervisor finds), ``replay
--policy psld`` over recorded events, and ``status``'s per-server share and
fitted speed. The live reassignment itself is tested with real servers in
``test_ps_reassign.py`` and end to end in ``test_psld_job.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dtlaunch.config import JobSpec
from dtlaunch.errors import ConfigError, RunDirError
from dtlaunch.events import Event, EventRecorder
from dtlaunch.solvers.psld import fit_server, predicted_makespan
from dtlaunch.supervisor.control.actions import NoAction, ReassignBlocks
from dtlaunch.supervisor.control.monitor import Monitor, PsLayout
from dtlaunch.supervisor.control.policies import parse_policy
from dtlaunch.supervisor.control.policies.psld import PRIOR_REASSIGN_COST_S
from dtlaunch.supervisor.psfleet.placement import (
    PENDING_FILE,
    PLACEMENT_FILE,
    PlacementKeeper,
)
from dtlaunch.supervisor.status.fold import StatusFold
from dtlaunch.ui.whatif import what_if
from dtlaunch.wire.messages import PsPlacedBlock, PsPlacementMap

MB = 1 << 20
# One tensor holds 40 % of the bytes (PSLD's skewed models), cut in 4 MiB blocks
# and placed by bytes on 4 servers.
SIZES = (4 * MB,) * 4 + (2 * MB,) * 8 + (1 * MB,) * 8
OWNER = tuple(i % 4 for i in range(len(SIZES)))
LAYOUT = PsLayout(version=1, servers=4, block_bytes=SIZES, owner=OWNER)
FAST_S_PER_BYTE = 1e-9  # about 1 GB/s
BASE_S = 0.002


def _seconds(server: int, held: int, slow: dict[int, float], jitter: float = 0.0) -> float:
    return BASE_S + FAST_S_PER_BYTE * slow.get(server, 1.0) * held * (1.0 + jitter)


def _feed(
    monitor: Monitor,
    layout: PsLayout,
    slow: dict[int, float],
    *,
    start: float,
    steps: int,
    workers: int = 2,
) -> float:
    """``steps`` steps of every worker, each with its exchanges with every server."""
    loads = layout.bytes_per_server()
    t = start
    for step in range(steps):
        t += 0.1
        for rank in range(workers):
            jitter = 0.01 * ((step + rank) % 3 - 1)
            samples = tuple(
                (j, 2 * loads[j], _seconds(j, loads[j], slow, jitter)) for j in range(len(loads))
            )
            monitor.report_worker(
                rank,
                now=t,
                step=step,
                batch_size=32,
                compute_s=0.05,
                comm_s=max(s for _, _, s in samples),
                samples=32,
                server_samples=samples,
            )
    return t


def _decide(policy_text: str, slow: dict[int, float], *, steps: int = 20) -> tuple[Any, Monitor]:
    policy = parse_policy(policy_text)
    monitor = Monitor(l_trans=policy.l_trans, l_per=policy.l_per)
    now = _feed(monitor, LAYOUT, slow, start=0.0, steps=steps)
    actions = policy.decide(monitor.snapshot(now, ps_layout=LAYOUT))
    assert len(actions) == 1
    return actions[0], monitor


def _fits(slow: dict[int, float]) -> list[Any]:
    # The servers' true lines, as a long profile at two loads would fit them.
    return [
        fit_server([MB, 8 * MB], [_seconds(j, MB, slow), _seconds(j, 8 * MB, slow)])
        for j in range(4)
    ]


# ------------------------------------------------------------------- policy


def _loads(owner: list[int]) -> list[int]:
    loads = [0] * 4
    for size, server in zip(SIZES, owner, strict=True):
        loads[server] += size
    return loads


def test_a_server_ten_times_slower_is_left_out_and_the_others_share_its_blocks() -> None:
    slow = {3: 10.0}
    action, _ = _decide("psld:eps=0,seed=1", slow)
    assert isinstance(action, ReassignBlocks), action.reason
    assert action.from_version == 1
    loads = _loads(action.owner)
    # Outside the superior set (Alg. 1): without exploration it gets nothing...
    assert loads[3] == 0
    assert max(loads[:3]) - min(loads[:3]) <= 2 * MB
    # ...and the predicted step is far shorter than with the map in force.
    fits = _fits(slow)
    assert predicted_makespan(SIZES, action.owner, fits) < 0.4 * predicted_makespan(
        SIZES, OWNER, fits
    )
    inputs = action.inputs
    assert inputs["superior"] == [0, 1, 2]
    assert inputs["variation"] > 1.0
    assert set(inputs["moved"]) == {i for i in range(len(SIZES)) if action.owner[i] != OWNER[i]}
    assert "server 3" in action.reason


def test_the_proportional_strawman_uses_every_server_by_its_speed() -> None:
    action, _ = _decide("psld:assign=proportional", {3: 10.0})
    assert isinstance(action, ReassignBlocks), action.reason
    loads = _loads(action.owner)
    # 1/31 of the bytes is 1.3 MiB: the slow server keeps one 1 MiB block.
    assert loads[3] == MB
    assert action.inputs["assign"] == "proportional"
    assert "superior" not in action.inputs


def test_servers_of_one_speed_keep_their_blocks() -> None:
    action, _ = _decide("psld", {})
    assert isinstance(action, NoAction)
    assert "<= threshold" in action.reason
    assert action.inputs["variation"] < 0.1


def test_the_threshold_and_the_superior_set_decide_what_a_partly_slow_server_keeps() -> None:
    """1.8x slower: a spread of 0.8, below the default threshold: nothing moves.
    Under threshold 0.5 it is confidently slower than the best (Alg. 1), so only
    exploration gives it blocks; 1.05x slower is within the noise floor and
    keeps a full share."""
    action, _ = _decide("psld:threshold=1", {2: 1.8})
    assert isinstance(action, NoAction)
    action, _ = _decide("psld:threshold=0.5,eps=0", {2: 1.8})
    assert isinstance(action, ReassignBlocks), action.reason
    assert action.inputs["superior"] == [0, 1, 3]
    assert _loads(action.owner)[2] == 0
    explored, _ = _decide("psld:threshold=0.5,eps=0.5,seed=1", {2: 1.8})
    assert isinstance(explored, ReassignBlocks)
    assert _loads(explored.owner)[2] > 0
    close, _ = _decide("psld:threshold=0,eps=0,margin=0", {2: 1.05})
    assert close.inputs["superior"] == [0, 1, 2, 3]


def test_a_map_already_balanced_for_the_speeds_is_kept() -> None:
    """After a good reassignment the slow server is still slow per byte: the
    spread stays above the threshold, but no map predicts a shorter step."""
    slow = {3: 10.0}
    first, _ = _decide("psld:eps=0", slow)
    assert isinstance(first, ReassignBlocks)
    balanced = PsLayout(version=2, servers=4, block_bytes=SIZES, owner=tuple(first.owner))
    policy = parse_policy("psld:eps=0,settle=0")
    monitor = Monitor(l_trans=policy.l_trans, l_per=policy.l_per)
    now = _feed(monitor, LAYOUT, slow, start=0.0, steps=20)
    now = _feed(monitor, balanced, slow, start=now, steps=20)
    action = policy.decide(monitor.snapshot(now, ps_layout=balanced))[0]
    assert isinstance(action, NoAction), action.reason
    assert action.inputs["variation"] > 1.0
    assert "predicts" in action.reason
    # Once the left-out server's last samples are older than the long window, it
    # is tried again with the others' mean fit as its prior (§5.1).
    later = _feed(monitor, balanced, slow, start=now + policy.l_per, steps=20)
    retry = policy.decide(monitor.snapshot(later, ps_layout=balanced))[0]
    assert isinstance(retry, ReassignBlocks), retry.reason
    assert _loads(retry.owner)[3] > 0


def test_it_waits_for_a_map_for_samples_and_for_a_reassignment_to_settle() -> None:
    policy = parse_policy("psld:eps=0,settle=5,min_samples=8")
    monitor = Monitor(l_trans=policy.l_trans, l_per=policy.l_per)
    now = _feed(monitor, LAYOUT, {3: 10.0}, start=0.0, steps=3)  # 6 samples a server
    assert "no parameter-server placement map" in policy.decide(monitor.snapshot(now))[0].reason
    waiting = policy.decide(monitor.snapshot(now, ps_layout=LAYOUT))[0]
    assert "6 of 8 profile samples" in waiting.reason
    now = _feed(monitor, LAYOUT, {3: 10.0}, start=now, steps=2)
    pending = policy.decide(monitor.snapshot(now, ps_layout=LAYOUT, reassign_pending=True))[0]
    assert "being carried out" in pending.reason
    assert isinstance(policy.decide(monitor.snapshot(now, ps_layout=LAYOUT))[0], ReassignBlocks)
    # The map changed: no decision for settle=5 s, then decisions again.
    newer = PsLayout(version=2, servers=4, block_bytes=SIZES, owner=OWNER)
    assert "settling" in policy.decide(monitor.snapshot(now, ps_layout=newer))[0].reason
    assert "settling" in policy.decide(monitor.snapshot(now + 4.9, ps_layout=newer))[0].reason
    later = _feed(monitor, newer, {3: 10.0}, start=now + 5.0, steps=10)
    assert not policy.decide(monitor.snapshot(later, ps_layout=newer))[0].reason.startswith(
        "settling"
    )


def test_a_map_that_cannot_repay_its_pause_in_the_steps_left_is_not_asked_for() -> None:
    """Gain x remaining steps against the pause: the measured one once there is
    one, before that the prior bound; no data set (None) means no limit."""
    policy = parse_policy("psld:eps=0")
    monitor = Monitor(l_trans=policy.l_trans, l_per=policy.l_per)
    now = _feed(monitor, LAYOUT, {3: 10.0}, start=0.0, steps=20)

    def decide(remaining: int | None, cost_s: float | None = None) -> Any:
        snap = monitor.snapshot(
            now, ps_layout=LAYOUT, remaining_steps=remaining, reassign_cost_s=cost_s
        )
        return policy.decide(snap)[0]

    unlimited = decide(None)
    assert isinstance(unlimited, ReassignBlocks), unlimited.reason
    step_gain = unlimited.inputs["makespan_current_s"] - unlimited.inputs["makespan_new_s"]
    # Two steps left repay less than the prior pause (0.5 s) at this gain (~5 ms).
    assert 2 * step_gain < PRIOR_REASSIGN_COST_S < 1000 * step_gain
    held = decide(2)
    assert isinstance(held, NoAction)
    assert "over the 2 steps left" in held.reason and "pause (0.5 s)" in held.reason
    assert held.inputs["gain_s"] == pytest.approx(2 * step_gain)
    assert isinstance(decide(1000), ReassignBlocks)
    # A measured pause replaces the prior, both ways.
    enough = int(0.02 / step_gain) + 1
    assert isinstance(decide(enough, cost_s=0.01), ReassignBlocks)
    assert isinstance(decide(enough, cost_s=0.5), NoAction)


def test_exploration_is_seeded_so_a_replay_decides_the_same() -> None:
    first, _ = _decide("psld:eps=0.3,seed=7", {3: 10.0})
    again, _ = _decide("psld:eps=0.3,seed=7", {3: 10.0})
    other, _ = _decide("psld:eps=0.3,seed=8", {3: 10.0})
    assert isinstance(first, ReassignBlocks)
    assert isinstance(again, ReassignBlocks)
    assert first.owner == again.owner
    assert first.inputs["explored"] > 0
    assert not isinstance(other, ReassignBlocks) or other.owner != first.owner


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("psld:eps=1.5", "eps must be a probability"),
        ("psld:eps=-1", "eps must be a number >= 0"),
        ("psld:threshold=x", "threshold must be a number"),
        ("psld:theta0=0", "theta0 must be a number > 0"),
        ("psld:min_samples=1", "min_samples must be an integer >= 2"),
        ("psld:epsilon=0.1", "unknown parameter epsilon"),
    ],
)
def test_bad_parameters_are_refused_with_the_fix(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_policy(text)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"workers": 2, "servers": 0}, "built-in parameter servers"),
        ({"workers": 2, "servers": 2, "ps_server": "script"}, "built-in parameter servers"),
        ({"workers": 2, "servers": 1}, "--servers 2 or more"),
    ],
)
def test_psld_is_refused_where_it_cannot_move_blocks(spec: dict[str, Any], problem: str) -> None:
    mode = "ps" if spec.get("servers") else "allreduce"
    job = JobSpec(
        run_id="r", run_dir=Path("/nonexistent"), script="train.py", mode=mode, policy="psld",
        **spec,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=problem):
        job.validate()


def test_psld_composes_with_asp() -> None:
    job = JobSpec(
        run_id="r", run_dir=Path("/nonexistent"), script="train.py", mode="ps", policy="psld",
        workers=2, servers=2, ps_consistency="asp",
    )  # fmt: skip
    job.validate()


# ------------------------------------------------------ the keeper's record


def _placement(owner: tuple[int, ...] = OWNER, version: int = 1) -> PsPlacementMap:
    return PsPlacementMap(
        version=version,
        servers=4,
        blocks=[
            PsPlacedBlock(
                param=i,
                name=f"p{i}",
                row_start=0,
                row_end=1,
                shape=[s // 4],
                dtype="float32",
                nbytes=s,
                server=j,
            )
            for i, (s, j) in enumerate(zip(SIZES, owner, strict=True))
        ],
    )


def _keeper(tmp_path: Path) -> tuple[PlacementKeeper, list[Event]]:
    seen: list[Event] = []

    class Sink:
        def emit(self, event: Event) -> None:
            seen.append(event)

    keeper = PlacementKeeper(tmp_path, EventRecorder([Sink()]))
    keeper.register(0, _placement())
    return keeper, seen


def test_a_reassignment_is_pending_until_committed_and_a_restart_finds_which(
    tmp_path: Path,
) -> None:
    keeper, events = _keeper(tmp_path)
    heard: list[int] = []
    keeper.listen(lambda p: heard.append(p.version))
    owner = (0,) * 4 + OWNER[4:]
    pending = keeper.begin(owner, at_version=17)
    assert [(m.source, m.target, m.blocks) for m in pending.moves] == [
        (1, 0, (1,)),
        (2, 0, (2,)),
        (3, 0, (3,)),
    ]
    assert pending.placement.version == 2
    # Killed here: a new supervisor sees the pending move, not committed.
    again = PlacementKeeper(tmp_path, EventRecorder([]))
    assert again.pending == pending
    assert not again.committed
    assert again.placement is not None
    assert again.placement.version == 1
    with pytest.raises(RunDirError, match="already under way"):
        keeper.begin(OWNER, at_version=20)
    keeper.commit()
    assert keeper.placement is not None
    assert keeper.placement.version == 2
    # Every worker asking now gets the new map.
    answer = keeper.register(1, _placement())
    assert answer.placement is not None
    assert [b.server for b in answer.placement.blocks] == list(owner)
    # Killed here: committed, only the releases are left.
    after = PlacementKeeper(tmp_path, EventRecorder([]))
    assert after.committed
    keeper.announce()
    assert heard == [1, 2]
    keeper.finish()
    assert not (tmp_path / PENDING_FILE).exists()
    assert json.loads((tmp_path / PLACEMENT_FILE).read_text())["placement"]["version"] == 2
    recorded = [e.data for e in events if e.kind == "ps_placement"]
    assert [r["version"] for r in recorded] == [1, 2]
    assert recorded[1]["owner"] == list(owner)
    assert recorded[1]["block_bytes"] == list(SIZES)
    assert recorded[1]["at_version"] == 17


def test_a_bad_owner_list_or_a_damaged_pending_file_is_refused(tmp_path: Path) -> None:
    keeper, _ = _keeper(tmp_path)
    with pytest.raises(RunDirError, match="owners for"):
        keeper.begin((0, 1), at_version=3)
    with pytest.raises(RunDirError, match="not among"):
        keeper.begin((4,) * len(SIZES), at_version=3)
    (tmp_path / PENDING_FILE).write_text("{not json")
    with pytest.raises(RunDirError, match="restore the file"):
        PlacementKeeper(tmp_path, EventRecorder([]))


# ------------------------------------------------------- replay and status


def _ev(kind: str, at: float, role: str = "", rank: int = -1, **data: Any) -> Event:
    return Event(kind=kind, mono=at, wall=1000.0 + at, role=role, rank=rank, data=data)


def _recorded_run(slow: dict[int, float], end: float = 12.0) -> list[Event]:
    loads = LAYOUT.bytes_per_server()
    evs = [_ev("job_start", 0.0, workers=2, servers=4)]
    evs += [_ev("running", 0.1, "worker", r) for r in range(2)]
    evs.append(
        _ev("ps_placement", 0.2, "worker", 0, version=1, servers=4, blocks=len(SIZES),
            bytes_per_server=loads, block_bytes=list(SIZES), owner=list(OWNER))
    )  # fmt: skip
    t, step = 0.3, 0
    while t < end:
        t, step = round(t + 0.1, 6), step + 1
        for rank in range(2):
            servers = [[j, 2 * loads[j], round(_seconds(j, loads[j], slow), 6)] for j in range(4)]
            evs.append(_ev("reports", t, "worker", rank, step=[step], batch_size=[32],
                           compute_s=[0.05], comm_s=[0.05], samples=[32], injected_s=[0.0],
                           t=[t], servers=[servers]))  # fmt: skip
    evs.append(_ev("job_end", end + 0.1, status="succeeded"))
    return evs


def test_replay_with_psld_fits_the_recorded_exchanges_and_lists_the_reassignment() -> None:
    slowed = what_if(_recorded_run({3: 10.0}), "psld:eps=0", control_interval=2.0, tick_s=0.5)
    reassigned = [a for a in slowed.would if a.action == "REASSIGN_BLOCKS"]
    assert reassigned, slowed.would
    # Listed, not carried out: the run's map stays, so the next decisions see the
    # same map and the policy settles only on a map change it never saw.
    assert reassigned[0].fields["from_version"] == 1
    even = what_if(_recorded_run({}), "psld:eps=0", control_interval=2.0, tick_s=0.5)
    assert even.would == []


def test_replay_prices_a_reassignment_at_the_runs_measured_pause() -> None:
    """Near the end of the data, whether a map repays its pause depends on the
    pause: replay takes it from the run's ``ps_reassign`` done events, as the
    live Controller took it from the reassignment it carried out."""
    evs = _recorded_run({3: 10.0})
    end = evs.pop()
    # The data set ends: 3 steps left from 2 s on, at a gain of ~5 ms a step.
    evs.append(_ev("shards_done", 2.0, "worker", 0, count=1, remaining_steps=3))
    evs.append(end)
    prior = what_if(evs, "psld:eps=0", control_interval=2.0, tick_s=0.5)
    assert not [a for a in prior.would if a.action == "REASSIGN_BLOCKS" and a.at_s > 2.0]
    cheap = [*evs[:-1], _ev("ps_reassign", 1.5, "supervisor", 0, phase="done", pause_s=0.001)]
    cheap.append(end)
    measured = what_if(cheap, "psld:eps=0", control_interval=2.0, tick_s=0.5)
    assert [a for a in measured.would if a.action == "REASSIGN_BLOCKS" and a.at_s > 2.0]


def test_status_shows_each_servers_share_and_fitted_speed() -> None:
    fold = StatusFold()
    fold.emit_all(_recorded_run({3: 10.0}))
    snap = fold.snapshot(now=12.0, source="events", stragglers={})
    servers = {n.rank: n for n in snap.nodes if n.role == "server"}
    assert snap.ps_map_version == 1
    assert [servers[j].ps_bytes for j in range(4)] == LAYOUT.bytes_per_server()
    fast, slow = servers[0].ps_speed, servers[3].ps_speed
    held = LAYOUT.bytes_per_server()
    assert fast == pytest.approx(held[0] / _seconds(0, held[0], {}), rel=1e-3)
    assert slow == pytest.approx(held[3] / _seconds(3, held[3], {3: 10.0}), rel=1e-3)
    assert fast > 5 * slow
