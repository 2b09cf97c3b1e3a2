"""RNA's round coordinator with a fake clock: groups, probes and rounds
(RNA §3.2), a dropped probe, a late answer, a worker dying mid-round, a
restarted worker rejoining, finished workers let go together."""

from __future__ import annotations

from dtlaunch.supervisor.rna.coordinator import (
    MIN_REPROBE_S,
    GroupPhase,
    Note,
    RoundCoordinator,
    SendTo,
)
from dtlaunch.wire.messages import (
    RnaGroup,
    RnaLeft,
    RnaOpenStore,
    RnaProbe,
    RnaStart,
)


def sent(commands, kind):
    return [(c.rank, c.msg) for c in commands if isinstance(c, SendTo) and isinstance(c.msg, kind)]


def notes(commands, kind):
    return [c.fields for c in commands if isinstance(c, Note) and c.kind == kind]


def formed_group(world=4, probes=2, applied=0, seed=1):
    """A coordinator whose group of every worker formed at round ``applied``."""
    coord = RoundCoordinator(world_size=world, probes=probes, seed=seed, group_timeout_s=30.0)
    out = []
    for rank in range(world):
        out += coord.join(rank, 0, now=0.0)
    ((store_rank, opened),) = sent(out, RnaOpenStore)
    out = coord.store_ready(store_rank, opened.gen, 4000, "127.0.0.2")
    groups = sent(out, RnaGroup)
    assert sorted(r for r, _ in groups) == list(range(world))
    msg = groups[0][1]
    assert msg.members == list(range(world)) and msg.store_addr == "127.0.0.2"
    result = []
    for rank in range(world):
        result = coord.formed(rank, msg.gen, applied, now=0.1)
    assert coord.phase is GroupPhase.RUNNING
    return coord, msg.gen, result


def test_a_group_forms_once_every_worker_joined_and_rounds_start_with_two_probes():
    coord = RoundCoordinator(world_size=3, seed=0)
    assert coord.join(0, 0, now=0.0) == [] and coord.join(1, 0, now=0.1) == []
    out = coord.join(2, 0, now=0.2)
    assert sent(out, RnaOpenStore) == [(0, RnaOpenStore(gen=1))]
    assert coord.store_ready(1, 1, 4000, "x") == []  # not the store host: ignored
    _, gen, out = formed_group(world=3, applied=7)
    probes = sent(out, RnaProbe)
    assert len(probes) == 2 and len({r for r, _ in probes}) == 2
    assert all(m == RnaProbe(gen=gen, round=7) for _, m in probes)
    assert notes(out, "rna_group")[0]["phase"] == "formed"


def test_the_first_answer_starts_the_round_for_everyone_and_a_late_answer_is_ignored():
    coord, gen, out = formed_group(world=4)
    first, second = (r for r, _ in sent(out, RnaProbe))
    out = coord.ready(second, gen, 0, now=0.15)
    starts = sent(out, RnaStart)
    assert sorted(r for r, _ in starts) == [0, 1, 2, 3]
    assert {m for _, m in starts} == {RnaStart(gen=gen, round=0, initiator=second)}
    assert {m.round for _, m in sent(out, RnaProbe)} == {1}  # the next round's probes
    # The other probed worker answers round 0 too, late: nothing starts.
    assert coord.ready(first, gen, 0, now=0.16) == []
    assert coord.late_answers == 1 and coord.rounds_started == 1
    # An answer from another generation is late as well.
    assert coord.ready(first, gen - 1, 1, now=0.17) == []


def test_a_dropped_probe_widens_the_round_to_more_workers():
    coord, gen, out = formed_group(world=6, probes=2)
    probed = {r for r, _ in sent(out, RnaProbe)}
    assert coord.tick(0.1 + coord.reprobe_after() / 2) == []  # not yet
    out = coord.tick(0.1 + coord.reprobe_after() + 0.001)
    widened = {r for r, _ in sent(out, RnaProbe)}
    assert len(widened) == 2 and not widened & probed
    # Any probed worker's answer starts it, the first ones included.
    out = coord.ready(next(iter(probed)), gen, 0, now=1.0)
    assert len(sent(out, RnaStart)) == 6


def test_the_reprobe_delay_follows_the_measured_responses():
    coord, gen, out = formed_group(world=4)
    now = 0.1
    for round_ in range(10):
        rank = sent(out, RnaProbe)[0][0]
        now += 0.02
        out = coord.ready(rank, gen, round_, now=now)
    assert abs(coord.median_response_s() - 0.02) < 1e-9
    assert abs(coord.reprobe_after() - max(MIN_REPROBE_S, 3 * 0.02)) < 1e-9


def test_a_round_that_does_not_start_is_reported_with_who_was_probed():
    coord, _, out = formed_group(world=3)
    out = []
    for step in range(1, 120):
        out += coord.tick(0.1 + step * 0.1)
    waits = notes(out, "rna_wait")
    assert waits and waits[0]["round"] == 0 and waits[0]["probed"]
    assert "no probed worker has a gradient ready" in waits[0]["why"]


def test_a_worker_dying_mid_round_reforms_the_group_around_the_survivors():
    coord, gen, out = formed_group(world=4)
    rank = sent(out, RnaProbe)[0][0]
    coord.ready(rank, gen, 0, now=0.2)  # round 0 runs; worker 2 dies in it
    out = coord.worker_gone(2, now=0.3)
    ((store, opened),) = sent(out, RnaOpenStore)
    assert opened.gen == gen + 1 and store == 0
    note = notes(out, "rna_group")[0]
    assert note["members"] == [0, 1, 3] and note["source"] == 0 and "exited" in note["reason"]
    # The survivors' failed collective of the old generation changes nothing more.
    assert coord.failed(1, gen, 0, "Connection closed by peer", now=0.31) == []
    out = coord.store_ready(0, gen + 1, 4001, "a0")
    assert sorted(r for r, _ in sent(out, RnaGroup)) == [0, 1, 3]
    for rank in (0, 1, 3):
        out = coord.formed(rank, gen + 1, 1, now=0.4)
    assert coord.phase is GroupPhase.RUNNING and coord.round == 1
    assert all(r != 2 for r, _ in sent(out, RnaProbe))


def test_a_restarted_worker_rejoins_and_takes_the_model_from_a_survivor():
    coord, gen, _ = formed_group(world=3)
    coord.worker_gone(0, now=1.0)  # rank 0, the last group's source, died
    out = coord.store_ready(1, gen + 1, 4001, "a1")
    for rank in (1, 2):
        coord.formed(rank, gen + 1, 5, now=1.1)
    out = coord.join(0, 0, now=2.0)  # its restart: a fresh model
    note = notes(out, "rna_group")[0]
    assert note["members"] == [0, 1, 2]
    assert note["source"] == 1, "the newcomer's fresh model must not become the group's"
    assert sent(out, RnaOpenStore)[0][0] == 1


def test_a_failed_collective_reforms_the_same_members_and_repeated_failures_back_off():
    coord, gen, _ = formed_group(world=2)
    out = coord.failed(1, gen, 3, "timeout", now=1.0)
    assert notes(out, "rna_failed")[0]["error"] == "timeout"
    assert sent(out, RnaOpenStore)[0][1].gen == gen + 1
    # Forming fails twice in a row: the next attempt waits.
    coord.failed(0, gen + 1, -1, "cannot reach the store", now=1.1)
    out = coord.failed(0, gen + 2, -1, "cannot reach the store", now=1.2)
    backoff = notes(out, "rna_group")[-1]
    assert backoff["phase"] == "backoff" and backoff["retry_in_s"] == 0.5
    assert sent(out, RnaOpenStore) == []
    assert coord.tick(1.3) == []
    out = coord.tick(1.8)
    assert sent(out, RnaOpenStore), "the group is tried again after the backoff"


def test_a_member_that_does_not_form_is_left_out_after_the_group_timeout():
    coord = RoundCoordinator(world_size=3, seed=0, group_timeout_s=5.0)
    for rank in range(3):
        coord.join(rank, 0, now=0.0)
    coord.store_ready(0, 1, 4000, "a0")
    coord.formed(0, 1, 0, now=0.5)
    coord.formed(1, 1, 0, now=0.5)  # worker 2 hangs
    assert notes(coord.tick(4.9), "rna_group") == []
    out = coord.tick(5.1)
    timeout = notes(out, "rna_group")[0]
    assert timeout["phase"] == "timeout" and timeout["silent"] == [2]
    assert notes(out, "rna_group")[1]["members"] == [0, 1]


def test_workers_that_finish_are_let_go_together_after_a_last_round():
    coord, _, out = formed_group(world=3)
    out = coord.leave(2, 9, now=1.0)
    # Its last gradient starts the open round; it stays a member, unprobed.
    assert {m.initiator for _, m in sent(out, RnaStart)} == {2}
    assert all(r != 2 for r, _ in sent(out, RnaProbe))
    assert sent(out, RnaLeft) == []
    coord.leave(0, 9, now=1.1)
    out = coord.leave(1, 9, now=1.2)
    lefts = sent(out, RnaLeft)
    last = sent(out, RnaStart)[0][1].round
    assert sorted(r for r, _ in lefts) == [0, 1, 2] and {m.round for _, m in lefts} == {last}
    assert [n["phase"] for n in notes(out, "rna_group")] == ["finished", "done"]
    assert coord.phase is GroupPhase.DONE


def test_workers_that_finish_while_the_group_forms_get_one_last_round():
    coord = RoundCoordinator(world_size=2, seed=0)
    coord.join(0, 0, now=0.0)
    coord.join(1, 0, now=0.0)
    coord.store_ready(0, 1, 4000, "a0")
    assert sent(coord.leave(0, 0, now=0.1), RnaLeft) == []
    assert sent(coord.leave(1, 0, now=0.1), RnaLeft) == []
    coord.formed(0, 1, 0, now=0.2)
    out = coord.formed(1, 1, 0, now=0.2)
    assert len(sent(out, RnaStart)) == 2 and len(sent(out, RnaLeft)) == 2


def test_a_worker_that_never_joins_is_not_waited_for_beyond_the_grace():
    coord = RoundCoordinator(world_size=3, seed=0, join_grace_s=10.0)
    coord.join(0, 0, now=0.0)
    coord.join(1, 0, now=0.0)
    assert coord.tick(9.0) == []
    out = coord.tick(10.5)
    note = notes(out, "rna_group")[0]
    assert note["members"] == [0, 1] and note["missing"] == [2]


def test_finished_workers_wait_for_a_restarting_one_so_that_it_ends_with_their_model():
    coord, gen, out = formed_group(world=3)
    coord.worker_gone(1, now=1.0)  # killed; the node table restarts it
    coord.store_ready(0, gen + 1, 4001, "a0")
    for rank in (0, 2):
        coord.formed(rank, gen + 1, 10, now=1.1)
    coord.leave(0, 12, now=2.0)
    out = coord.leave(2, 12, now=2.1)
    assert sent(out, RnaLeft) == [], "worker 1 is still to come back"
    waits = notes(coord.tick(13.0), "rna_wait")
    assert waits and "waiting for worker(s) [1] to rejoin" in waits[0]["why"]
    out = coord.join(1, 0, now=14.0)  # the restart, with no data left to train
    note = notes(out, "rna_group")[0]
    assert note["members"] == [0, 1, 2] and note["source"] == 0
    coord.store_ready(0, gen + 2, 4002, "a0")
    coord.leave(1, 0, now=14.1)
    for rank in (0, 1, 2):
        out = coord.formed(rank, gen + 2, 13, now=14.2)
    assert sorted(r for r, _ in sent(out, RnaLeft)) == [0, 1, 2]
    # Their processes then end: nothing is restarting.
    for rank in range(3):
        assert coord.worker_gone(rank, now=15.0) == []
    assert coord.phase is GroupPhase.DONE


def test_a_member_asking_back_in_after_a_failure_does_not_reform_the_group_again():
    coord, gen, _ = formed_group(world=3)
    out = coord.failed(2, gen, 4, "Connection reset by peer", now=1.0)
    assert sent(out, RnaOpenStore)[0][1].gen == gen + 1
    # Each member whose collective failed asks back in: the group being formed has them.
    for rank in range(3):
        assert coord.join(rank, 4, now=1.01) == []
    assert coord.current.gen == gen + 1


def test_a_late_failure_of_a_forgotten_group_brings_its_member_back():
    """A resumed supervisor (groups numbered after the crashed one's) formed a
    group while worker 1 was still blocked in the crashed one's collective."""
    coord = RoundCoordinator(world_size=3, seed=0, group_timeout_s=5.0, first_gen=8)
    for rank in range(3):
        coord.join(rank, 20, now=0.0)
    coord.store_ready(0, 8, 4000, "a0")
    coord.formed(0, 8, 20, now=0.1)
    coord.formed(2, 8, 20, now=0.1)
    coord.leave(0, 20, now=1.0)  # their data ran out meanwhile
    coord.leave(2, 20, now=1.0)
    out = coord.tick(5.5)  # worker 1 never formed: left out
    assert notes(out, "rna_group")[1]["members"] == [0, 2]
    assert coord.failed(1, 7, 19, "timeout", now=6.0) == []  # the crashed supervisor's group
    out = coord.join(1, 20, now=6.0, finished=True)  # its data ran out too
    assert notes(out, "rna_group")[0]["members"] == [0, 1, 2]
    gen = coord.current.gen
    coord.store_ready(coord.current.store_rank, gen, 4001, "a0")
    for rank in range(3):
        out = coord.formed(rank, gen, 20, now=6.5)
    assert sorted(r for r, _ in sent(out, RnaLeft)) == [0, 1, 2], "all let go, one model"


def test_workers_whose_data_ends_between_groups_end_on_one_model_not_their_own():
    """A resumed supervisor's first group timed out (every member still blocked
    in a crashed round), and the data ran out before another formed: each
    worker was let go at once with its own model (found by a resume of a
    hierarchical job). Now one that held rounds waits for the next group, as
    finished, and all are let go together after its last round."""
    coord = RoundCoordinator(world_size=3, seed=0, group_timeout_s=5.0, first_gen=8)
    out = []
    for rank in range(3):
        out += coord.join(rank, 20, now=0.0)
    ((store, opened),) = sent(out, RnaOpenStore)
    coord.store_ready(store, opened.gen, 4000, "a0")
    out = coord.tick(5.5)  # no member formed: the group is given up
    assert notes(out, "rna_group")[0]["silent"] == [0, 1, 2] and coord.current is None
    out = []
    for rank in range(3):
        out += coord.leave(rank, 20 + rank, now=6.0 + rank)
    assert sent(out, RnaLeft) == [], "let go before a group took them back"
    ((store, opened),) = [o for o in sent(out, RnaOpenStore)][-1:]
    assert notes(out, "rna_group")[-1]["members"] == [0, 1, 2]
    coord.store_ready(store, opened.gen, 4001, "a0")
    for rank in range(3):
        out = coord.formed(rank, opened.gen, 22, now=9.0)
    assert sorted(r for r, _ in sent(out, RnaLeft)) == [0, 1, 2], "all let go, one model"
    # A worker that never held a round (no group ever formed for it) is not held.
    fresh = RoundCoordinator(world_size=2, seed=0)
    assert sent(fresh.leave(1, 0, now=0.0), RnaLeft) == [(1, RnaLeft(round=-1))]


def test_a_finished_worker_that_exits_before_it_is_let_go_is_not_waited_for():
    coord, gen, _ = formed_group(world=3)
    coord.leave(0, 5, now=1.0)
    coord.leave(2, 5, now=1.0)
    # Worker 1 finished too, but its wait to be let go ran out and it exited: done.
    out = coord.worker_gone(1, now=2.0, succeeded=True)
    assert notes(out, "rna_group")[0]["members"] == [0, 2]
    coord.store_ready(0, gen + 1, 4001, "a0")
    for rank in (0, 2):
        out = coord.formed(rank, gen + 1, 7, now=2.1)
    assert len(sent(out, RnaStart)) == 2, "one last round for the gradients they still hold"
    assert sorted(r for r, _ in sent(out, RnaLeft)) == [0, 2]
    assert coord.phase is GroupPhase.DONE
