"""Hierarchical RNA's groups (RNA §4) on the supervisor, with a fake clock: a
partition re-forms the workers into groups without restarts, each group
probes and runs rounds among its own members, some rounds exchange with the
parameter server, and at the end every group holds its members until all of
them exchanged last, then all take the final model together."""

from __future__ import annotations

import dataclasses

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.supervisor.rna.coordinator import GroupPhase, SendTo
from dtlaunch.supervisor.rna.groups import GroupedCoordinator
from dtlaunch.wire.messages import RnaGroup, RnaLeft, RnaOpenStore, RnaProbe, RnaStart
from tests.test_rna_coordinator import notes, sent


def form(coord: GroupedCoordinator, out, now: float, applied: int = 0):
    """Answer every RnaOpenStore in ``out`` and form the groups it opens;
    returns the commands of the formations (the first rounds' probes)."""
    result = []
    for store, opened in sent(out, RnaOpenStore):
        groups = sent(coord.store_ready(store, opened.gen, 4000 + store, f"h{store}"), RnaGroup)
        msg = groups[0][1]
        assert sorted(r for r, _ in groups) == msg.members
        for rank in msg.members:
            result += coord.formed(rank, msg.gen, applied, now)
    return result


def running(world=4, exchange_every=2) -> tuple[GroupedCoordinator, list]:
    coord = GroupedCoordinator(world_size=world, seed=3, exchange_every=exchange_every)
    out = []
    for rank in range(world):
        out += coord.join(rank, 0, now=0.0)
    out = form(coord, out, 0.1)
    assert [sub.phase for sub in coord.coordinators] == [GroupPhase.RUNNING]
    return coord, out


def group_msgs(out):
    return {rank: msg for rank, msg in sent(out, RnaGroup)}


def test_a_partition_re_forms_the_workers_into_groups_that_probe_only_their_members():
    coord, out = running()
    assert coord.groups == [(0, 1, 2, 3)]
    (one,) = coord.coordinators
    gen = one.current.gen
    one.ready(sent(out, RnaProbe)[0][0], gen, 0, now=0.2)  # a round of the one group ran
    out = coord.partition([[0, 1], [2, 3]], now=1.0, reason="spread")
    assert coord.rounds_started == 1  # the old group's round still counts
    assert notes(out, "rna_partition") == [{"groups": [[0, 1], [2, 3]], "reason": "spread"}]
    opens = sent(out, RnaOpenStore)
    assert len(opens) == 2 and len({m.gen for _, m in opens}) == 2
    assert min(m.gen for _, m in opens) > gen  # the shared counter goes on
    # Each group forms from the members it took over, with its size in the partition.
    formed = []
    for store, opened in opens:
        msgs = group_msgs(coord.store_ready(store, opened.gen, 4100, "h"))
        assert {m.group_size for m in msgs.values()} == {2}
        members = next(iter(msgs.values())).members
        assert members in ([0, 1], [2, 3]) and store in members
        for rank in members:
            formed += coord.formed(rank, opened.gen, 1, now=1.1)
    probes = sent(formed, RnaProbe)
    by_gen: dict[int, set[int]] = {}
    for rank, msg in probes:
        by_gen.setdefault(msg.gen, set()).add(rank)
    assert sorted(sorted(ranks) for ranks in by_gen.values()) == [[0, 1], [2, 3]]
    # A message about the old generation is stale now.
    assert coord.ready(0, gen, 1, now=1.2) == []
    assert coord.failed(0, gen, 1, "old", now=1.2) == []


def test_groups_exchange_every_few_rounds_from_the_first_partition_on():
    coord, out = running(exchange_every=3)
    (sub,) = coord.coordinators
    gen = sub.current.gen
    # One group before any partition: plain RNA, no exchange, the server unused.
    for round_ in range(4):
        out = coord.ready(sent(out, RnaProbe)[0][0], gen, round_, now=0.2 + round_)
        assert not sent(out, RnaStart)[0][1].exchange
    assert sub.group_size == 0 and not sub.hold_at_end
    form(coord, coord.partition([[0, 1], [2, 3]], now=5.0, reason="spread"), 5.1, applied=4)
    a, _ = coord.coordinators
    assert a.group_size == 2 and a.hold_at_end
    flags, out = [], []
    for round_ in range(4, 11):
        probed = [r for r, m in sent(out, RnaProbe) if m.gen == a.current.gen] or [0]
        out = coord.ready(probed[0], a.current.gen, round_, now=6.0 + round_)
        flags.append(sent(out, RnaStart)[0][1].exchange)
    assert flags == [False, False, True, False, False, True, False]
    # Merged back into one group, it goes on exchanging: the server holds the model.
    out = coord.partition([[0, 1, 2, 3]], now=30.0, reason="even")
    (whole,) = coord.coordinators
    assert whole.exchange_every == 3 and whole.group_size == 4


def test_without_a_server_there_is_one_group_and_no_exchange():
    coord, out = running(exchange_every=0)
    assert coord.partition_refusal([[0, 1], [2, 3]]) is not None
    out2 = coord.partition([[0, 1], [2, 3]], now=1.0, reason="spread")
    assert "parameter server" in notes(out2, "rna_partition")[0]["refused"]
    assert coord.groups == [(0, 1, 2, 3)]
    gen = coord.coordinators[0].current.gen
    for round_ in range(5):
        out = coord.ready(sent(out, RnaProbe)[0][0], gen, round_, now=0.2 + round_)
        assert not sent(out, RnaStart)[0][1].exchange
    # Finished workers are let go at once, as plain RNA does.
    out = []
    for rank in range(4):
        out += coord.leave(rank, 5, now=10.0)
    assert sorted(r for r, _ in sent(out, RnaLeft)) == [0, 1, 2, 3]


def test_partitions_that_cannot_be_made_are_refused_with_the_reason():
    coord, _ = running()
    assert "cover" in coord.partition_refusal([[0, 1], [2]])
    assert "cover" in coord.partition_refusal([[0, 1], [1, 2, 3]])
    # The groups in force: nothing to change, nothing refused.
    assert coord.partition_refusal([[3, 2, 1, 0]]) is None
    assert coord.partition([[3, 2, 1, 0]], now=0.5, reason="same") == []
    assert coord.partition_refusal([[0, 1], [2, 3]]) is None
    coord.leave(3, 0, now=1.0)  # its data ended: the job is finishing
    assert "finishing" in coord.partition_refusal([[0, 1], [2, 3]])


def test_no_partition_while_a_group_forms():
    """A resumed supervisor's first group forms while members may still be
    blocked in a collective of the crashed one's: regrouping them then timed
    them out and left a worker to end on its own model (found by a resume after
    a split). The policy is told, and asks again later."""
    from dtlaunch.supervisor.control.policies import parse_policy

    coord = GroupedCoordinator(world_size=4, seed=3, exchange_every=1)
    for rank in range(4):
        coord.join(rank, 0, now=0.0)
    (sub,) = coord.coordinators
    assert sub.phase is GroupPhase.OPENING
    assert "opening" in coord.partition_refusal([[0, 1], [2, 3]])
    out = coord.partition([[0, 1], [2, 3]], now=1.0, reason="spread")
    assert "opening" in notes(out, "rna_partition")[0]["refused"]
    assert coord.groups == [(0, 1, 2, 3)] and sent(out, RnaOpenStore) == []
    # The policy hears the refusal: its groups in force are the old ones again,
    # and the regroup_s wait does not hold the next ask back.
    pol = parse_policy("rna:split=0.3,confirm=1,regroup_s=60")
    (ask,) = pol.decide(_snapshot(B_TIMES, 10.0))
    assert ask.groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    pol.groups_refused()
    (again,) = pol.decide(_snapshot(B_TIMES, 11.0))
    assert again.groups == ask.groups


def test_a_worker_that_dies_re_forms_only_its_own_group():
    coord, _ = running()
    form(coord, coord.partition([[0, 1], [2, 3]], now=1.0, reason="spread"), 1.1)
    a, b = coord.coordinators
    gen_b = b.current.gen
    out = coord.worker_gone(0, now=2.0)
    assert sent(out, RnaOpenStore) and all(r == 1 for r, _ in sent(out, RnaOpenStore))
    assert b.current.gen == gen_b and b.phase is GroupPhase.RUNNING
    # Its restart joins its own group again.
    out = coord.join(0, 0, now=3.0)
    assert [r for r, _ in sent(out, RnaOpenStore)] == [1]
    assert a.restarting == set()


def finish_group(coord, ranks, now):
    out = []
    for rank in ranks:
        out += coord.leave(rank, 10, now=now)
    return out


def first_group_finished():
    """Groups {0, 1} and {2, 3}; the first one's data ended: (the coordinator,
    the commands of its end, its last RnaStart)."""
    coord, _ = running()
    form(coord, coord.partition([[0, 1], [2, 3]], now=1.0, reason="spread"), 1.1, applied=4)
    out = finish_group(coord, [0, 1], now=5.0)
    return coord, out, [m for _, m in sent(out, RnaStart)][-1]


def test_groups_hold_their_finished_members_until_every_group_exchanged_last():
    # Group a's data ends: its last round exchanges, and it holds its members.
    coord, out, last = first_group_finished()
    a, b = coord.coordinators
    assert last.exchange and last.final and sent(out, RnaLeft) == []
    assert a.phase is GroupPhase.HOLDING
    # The rounds before it exchanged as usual, not as the last one.
    assert not any(m.final for _, m in sent(out, RnaStart) if m.round < last.round)
    out = coord.exchanged(last.initiator, a.current.gen, last.round, 5.1, seconds=0.01)
    assert notes(out, "rna_group")[0]["phase"] == "holding" and sent(out, RnaLeft) == []
    # Still held while group b trains; the wait is said.
    waits = notes(coord.tick(20.0), "rna_wait")
    assert waits and "other groups" in waits[0]["why"]
    # Group b ends; until its last exchange is confirmed nobody goes.
    out = finish_group(coord, [2, 3], now=21.0)
    last_b = [m for _, m in sent(out, RnaStart)][-1]
    assert last_b.exchange and last_b.final and sent(out, RnaLeft) == []
    out = coord.exchanged(last_b.initiator, b.current.gen, last_b.round, 21.1, seconds=0.02)
    # Released together: one more exchange each (the final model), then let go.
    starts = sent(out, RnaStart)
    assert sorted(r for r, _ in starts) == [0, 1, 2, 3] and all(m.exchange for _, m in starts)
    assert not any(m.final for _, m in starts)  # it only takes the final model
    assert sorted(r for r, _ in sent(out, RnaLeft)) == [0, 1, 2, 3]
    # Each member reads its last RnaStart (the final model) before its RnaLeft.
    order = [(c.rank, type(c.msg)) for c in out if isinstance(c, SendTo)]
    for rank in range(4):
        assert order.index((rank, RnaStart)) < order.index((rank, RnaLeft))
    assert notes(out, "rna_exchange") and notes(out, "rna_exchange")[0]["group"] == 1


def test_a_failed_exchange_is_recorded_and_a_member_dying_while_held_re_forms_the_group():
    coord, _, last = first_group_finished()
    a, _ = coord.coordinators
    out = coord.exchanged(
        last.initiator, a.current.gen, last.round, 5.1, seconds=0.5, ok=False, error="PsError: x"
    )
    assert notes(out, "rna_exchange")[0]["error"] == "PsError: x"
    # A member of the held group dies: the group forms again when it is back.
    out = coord.worker_gone(1, now=6.0)
    assert a.phase is GroupPhase.OPENING and not a.final_exchanged
    out = form(coord, out, 6.1)
    out = coord.join(1, 0, now=7.0, finished=True)  # its restart found no data left
    out = form(coord, out, 7.1, applied=9)
    last = [m for _, m in sent(out, RnaStart)][-1]
    assert last.exchange and last.final and a.phase is GroupPhase.HOLDING


# ------------------------------------------------------------------ the policy


def _snapshot(times: dict[int, float], now: float, *, servers: bool = True):
    """A Monitor fed one step a second by workers of ``times`` (s per step) up to
    ``now``; with or without a running server in the job's resources."""
    from dtlaunch.supervisor.control.monitor import JobResources, Monitor, ProcessUse
    from tests.test_policies import run

    mon = Monitor(l_trans=3, l_per=10)
    run(mon, times, start=0.0, end=now)
    use = ProcessUse(host="h", cpu_cores=0.1, cpu_limit=1.0, rss_bytes=1, memory_limit=0)
    res = JobResources(
        workers={r: use for r in times},
        servers={0: use} if servers else {},
        host_cores={"h": 8.0},
        free_worker_slots=0,
    )
    return dataclasses.replace(mon.snapshot(now), resources=res)


B_TIMES = {0: 0.074, 1: 0.076, 2: 0.075, 3: 0.077, 4: 0.124, 5: 0.126, 6: 0.125, 7: 0.127}


def test_the_policy_splits_by_the_papers_rule_once_the_groups_are_confirmed():
    from dtlaunch.supervisor.control.actions import NoAction, RnaGroups
    from dtlaunch.supervisor.control.policies import parse_policy

    # zeta 0.053 against v 0.1005: the paper's zeta > v keeps one group.
    paper = parse_policy("rna")
    for now in (10.0, 11.0, 12.0):
        (kept,) = paper.decide(_snapshot(B_TIMES, now))
        assert isinstance(kept, NoAction) and "stay" in kept.reason
    assert kept.inputs["zeta_s"] == pytest.approx(0.053) and kept.inputs["v_s"] == pytest.approx(
        0.1005
    )
    # split=0.3: two groups, asked for once seen twice in a row.
    pol = parse_policy("rna:split=0.3,confirm=2,regroup_s=30")
    (first,) = pol.decide(_snapshot(B_TIMES, 10.0))
    assert isinstance(first, NoAction) and "seen 1 of 2" in first.reason
    (split,) = pol.decide(_snapshot(B_TIMES, 11.0))
    assert isinstance(split, RnaGroups) and split.groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split.inputs["groups"] == split.groups and "0.3" in split.reason
    (same,) = pol.decide(_snapshot(B_TIMES, 12.0))
    assert isinstance(same, NoAction) and "stay" in same.reason
    # The spread goes away: one group again, but not before regroup_s passed.
    even = {r: 0.1 for r in range(8)}
    assert isinstance(pol.decide(_snapshot(even, 20.0))[0], NoAction)
    (waits,) = pol.decide(_snapshot(even, 21.0))
    assert isinstance(waits, NoAction) and "the last regroup was 10 s ago" in waits.reason
    (merged,) = pol.decide(_snapshot(even, 41.5))
    assert isinstance(merged, RnaGroups) and merged.groups == [list(range(8))]


def test_the_policy_keeps_one_group_without_a_server_or_when_told_to():
    from dtlaunch.supervisor.control.actions import NoAction
    from dtlaunch.supervisor.control.policies import parse_policy

    pol = parse_policy("rna:split=0.3,confirm=1")
    (none,) = pol.decide(_snapshot(B_TIMES, 10.0, servers=False))
    assert isinstance(none, NoAction) and "--servers 1" in none.reason
    off = parse_policy("rna:hierarchical=off,split=0.3,confirm=1")
    assert isinstance(off.decide(_snapshot(B_TIMES, 10.0))[0], NoAction)
    with pytest.raises(ConfigError, match="hierarchical must be one of auto, off"):
        parse_policy("rna:hierarchical=yes")
    with pytest.raises(ConfigError, match="split"):
        parse_policy("rna:split=0")


def test_hierarchical_rna_needs_torch_and_the_built_in_server(tmp_path):
    from dtlaunch.config import JobSpec

    def spec(policy: str, **kw) -> JobSpec:
        return JobSpec(
            run_id="r", run_dir=tmp_path, script="train.py", workers=4, policy=policy,
            restart_scope="process", **kw,
        ).validate()  # fmt: skip

    assert spec("rna", servers=1, mode="ps").mode == "ps"
    with pytest.raises(ConfigError, match="drop --policy"):
        spec("rna", framework="tf")
    with pytest.raises(ConfigError, match="hierarchical=auto, or drop --servers"):
        spec("rna:hierarchical=off", servers=1, mode="ps")
    with pytest.raises(ConfigError, match="use --ps-server builtin"):
        spec("rna", servers=1, mode="ps", ps_server="script")
