"""The blocks over a changed number of servers (solvers/spread.py), checked
against placements worked out by hand and against invariants on random inputs."""

from __future__ import annotations

import random

import pytest

from dtlaunch.solvers import InfeasibleError, spread_blocks


def loads(sizes, owner, servers):
    out = [0] * servers
    for size, server in zip(sizes, owner, strict=True):
        out[server] += size
    return out


def test_a_new_server_takes_blocks_from_the_most_loaded_until_it_is_even():
    # Two servers of 60 each; a third joins. Moving the 20 from server 0 and the
    # 20 from server 1 gives 40 each: two blocks move, nothing else.
    sizes = [40, 20, 40, 20]
    owner = spread_blocks(sizes, [0, 0, 1, 1], 3)
    assert loads(sizes, owner, 3) == [40, 40, 40]
    assert owner == (0, 2, 1, 2)


def test_a_removed_servers_blocks_go_largest_first_to_the_least_loaded():
    # Server 2 leaves with 50 and 10: the 50 goes to server 1 (10 -> 60), the 10
    # to server 0 (30 -> 40). Then 60 against 40: server 1's 10 moves, 50 / 50.
    sizes = [30, 10, 50, 10]
    owner = spread_blocks(sizes, [0, 1, 2, 2], 2)
    assert sorted(loads(sizes, owner, 2)) == [50, 50]
    assert owner[2] == 1 and owner[0] == 0  # the big ones stay where they landed


def test_a_block_larger_than_the_gap_stays():
    # 100 against 0: moving the 100 would only swap the loads.
    assert spread_blocks([100], [0], 2) == (0,)


def test_an_added_server_gets_a_block_even_when_balance_would_not_move_one():
    # One big block and two small: balancing moves the big one to server 1 and
    # stops; server 2 would stay empty, so it takes the smallest block.
    owner = spread_blocks([32, 4, 1600], [0, 0, 0], 3)
    assert sorted(set(owner)) == [0, 1, 2]
    assert owner[2] != owner[0] and owner[2] != owner[1]


def test_unchanged_servers_and_an_even_map_move_nothing():
    assert spread_blocks([5, 5, 5, 5], [0, 1, 0, 1], 2) == (0, 1, 0, 1)


@pytest.mark.parametrize("seed", range(30))
def test_random_maps_stay_put_where_they_can_and_end_balanced(seed):
    rng = random.Random(seed)
    before = rng.randint(1, 6)
    after = rng.randint(1, 6)
    sizes = [rng.choice([1, 4, 4, 16, 64]) * rng.randint(1, 3) for _ in range(rng.randint(1, 40))]
    owner = [rng.randrange(before) for _ in sizes]
    new = spread_blocks(sizes, owner, after)
    assert all(0 <= s < after for s in new)
    final = loads(sizes, new, after)
    # Every server holds a block while there are blocks enough.
    assert len(set(new)) == min(after, len(sizes))
    if len(sizes) >= 2 * after:  # (the last fill may undo a move on few blocks)
        # No single block move lowers the larger of two loads any more.
        heavy, light = max(final), min(final)
        on_heavy = [s for s, o in zip(sizes, new, strict=True) if o == final.index(heavy)]
        assert not any(0 < s < heavy - light for s in on_heavy)
    # Spread again, it stays: nothing moves that balance does not need.
    assert spread_blocks(sizes, new, after) == new


@pytest.mark.parametrize(
    ("sizes", "owner", "servers", "problem"),
    [
        ([1], [0], 0, "at least one server"),
        ([1, 2], [0], 1, "2 block sizes for 1 owners"),
        ([-1], [0], 1, ">= 0"),
    ],
)
def test_impossible_requests_are_refused(sizes, owner, servers, problem):
    with pytest.raises(InfeasibleError, match=problem):
        spread_blocks(sizes, owner, servers)
