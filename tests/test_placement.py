"""Process placement: quotas, overflow, block ranks, spare hosts, capacity errors."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import HostSpec, parse_hostfile
from dtlaunch.supervisor.placement import Assignment, place


def _hosts(text: str) -> list[HostSpec]:
    return parse_hostfile(text, "h")


def _layout(assignments: list[Assignment]) -> list[tuple[str, int, str, int, int, int]]:
    return [
        (a.role[0], a.rank, a.host, a.local_rank, a.local_world_size, a.group_rank)
        for a in assignments
    ]


def _per_host(assignments: list[Assignment], role: str) -> dict[str, int]:
    return dict(Counter(a.host for a in assignments if a.role == role))


# (hostfile, workers, servers, expected {host: count} for workers, for servers)
CASES = [
    ("a", 1, 0, {"a": 1}, {}),
    ("a slots=4", 3, 0, {"a": 3}, {}),
    # block placement: the first host is filled before the next one is used
    ("a slots=4\nb slots=4", 3, 0, {"a": 3}, {}),
    ("a slots=4\nb slots=4", 6, 0, {"a": 4, "b": 2}, {}),
    ("a slots=2\nb slots=2\nc slots=2", 6, 0, {"a": 2, "b": 2, "c": 2}, {}),
    # servers go to the quota host, workers take what is left in file order
    ("a slots=4\nb slots=4 servers=2", 6, 2, {"a": 4, "b": 2}, {"b": 2}),
    # quota larger than needed: only as many as asked
    ("a slots=4\nb slots=4 servers=3", 4, 1, {"a": 4}, {"b": 1}),
    # quotas are filled in file order
    ("a slots=2 servers=1\nb slots=2 servers=1", 3, 1, {"a": 1, "b": 2}, {"a": 1}),
    ("a slots=2 servers=1\nb slots=2 servers=1", 2, 2, {"a": 1, "b": 1}, {"a": 1, "b": 1}),
    # beyond all quotas: free slots, hosts in file order (a before b)
    ("a slots=2\nb slots=2 servers=1", 2, 2, {"a": 1, "b": 1}, {"a": 1, "b": 1}),
    ("a slots=3\nb slots=3 servers=1", 2, 4, {"b": 2}, {"a": 3, "b": 1}),
    # no quota anywhere: servers take the first free slots
    ("a slots=2\nb slots=2", 3, 1, {"a": 1, "b": 2}, {"a": 1}),
    # servers=0 (allreduce mode): quota slots are used by workers
    ("a slots=2 servers=2\nb slots=2", 4, 0, {"a": 2, "b": 2}, {}),
    # spare hosts get nothing, wherever they are in the file
    ("s slots=8 spare\na slots=2\nb slots=2", 3, 0, {"a": 2, "b": 1}, {}),
    (
        "a slots=2\ns slots=8 servers=4 spare\nb slots=2 servers=1",
        2,
        2,
        {"a": 1, "b": 1},
        {"a": 1, "b": 1},
    ),
    # exactly full
    ("a slots=2 servers=1\nb slots=3", 4, 1, {"a": 1, "b": 3}, {"a": 1}),
]


@pytest.mark.parametrize(("text", "workers", "servers", "want_workers", "want_servers"), CASES)
def test_counts_per_host(text, workers, servers, want_workers, want_servers):
    assignments = place(_hosts(text), workers=workers, servers=servers)
    assert _per_host(assignments, "worker") == want_workers
    assert _per_host(assignments, "server") == want_servers


def test_block_ranks_local_ranks_and_group_ranks():
    hosts = _hosts("a slots=3\nb slots=2 servers=1\nc slots=2\nd slots=4 spare")
    assignments = place(hosts, workers=5, servers=2)
    assert _layout(assignments) == [
        # role, rank, host, local_rank, local_world_size, group_rank
        ("w", 0, "a", 0, 2, 0),
        ("w", 1, "a", 1, 2, 0),
        ("w", 2, "b", 0, 1, 1),
        ("w", 3, "c", 0, 2, 2),
        ("w", 4, "c", 1, 2, 2),
        ("s", 0, "a", 0, 1, 0),  # overflow server: first free slot in file order
        ("s", 1, "b", 0, 1, 1),  # quota server
    ]


def test_group_rank_counts_only_hosts_running_that_role():
    hosts = _hosts("a slots=2 servers=2\nb slots=2\nc slots=2")
    assignments = place(hosts, workers=4, servers=2)
    workers = [(a.host, a.group_rank) for a in assignments if a.role == "worker"]
    servers = [(a.host, a.group_rank) for a in assignments if a.role == "server"]
    assert workers == [("b", 0), ("b", 0), ("c", 1), ("c", 1)]
    assert servers == [("a", 0), ("a", 0)]


def test_labels_with_ports_are_the_host_names_used():
    hosts = _hosts("node1:2222 slots=1\n[::1]:22 slots=1")
    assert [a.host for a in place(hosts, workers=2, servers=0)] == ["node1:2222", "[::1]:22"]


def test_inline_hosts_place_like_mpirun():
    from dtlaunch.hostfile import parse_inline

    assignments = place(parse_inline("n1:2,n2:2"), workers=4, servers=0)
    assert [(a.rank, a.host, a.local_rank) for a in assignments] == [
        (0, "n1", 0),
        (1, "n1", 1),
        (2, "n2", 0),
        (3, "n2", 1),
    ]


def test_same_input_same_output():
    text = "a slots=3 servers=1\nb slots=5\nc slots=2 spare\nd slots=4 servers=2"
    first = place(_hosts(text), workers=7, servers=4)
    second = place(_hosts(text), workers=7, servers=4)
    assert first == second


def test_capacity_error_says_needed_available_and_fix():
    hosts = _hosts("a slots=2\nb slots=2\nspare1 slots=4 spare")
    with pytest.raises(ConfigError) as info:
        place(hosts, workers=4, servers=1)
    message = str(info.value)
    assert message == (
        "not enough slots: 5 needed (4 workers + 1 servers) but only 4 exist on 2 non-spare "
        "hosts (a slots=2, b slots=2); 1 spare host with 4 slots kept for relaunches and not "
        "used at start (drop 'spare' to use them). Fix: raise slots= on hostfile lines "
        "(or node:N in -H), add hosts, or lower --workers/--servers."
    )


def test_a_host_with_gpus_runs_no_more_workers_than_it_has_gpus():
    assert len(place(_hosts("a slots=3 servers=1 gpus=2"), workers=2, servers=1)) == 3
    with pytest.raises(ConfigError) as info:
        place(_hosts("a slots=4 gpus=2\nb slots=2"), workers=4, servers=0)
    message = str(info.value)
    assert "a would run 4 workers but declares gpus=2" in message
    assert "Fix: set slots= (or --nproc-per-node) to at most the GPU count" in message


def test_capacity_error_without_spare_hosts_and_one_host():
    with pytest.raises(ConfigError) as info:
        place(_hosts("a slots=2"), workers=3, servers=0)
    message = str(info.value)
    assert "3 needed (3 workers + 0 servers) but only 2 exist on 1 non-spare host (a slots=2)." in (
        message
    )
    assert "kept for relaunches" not in message


def test_capacity_error_when_every_host_is_spare():
    with pytest.raises(ConfigError, match="there is no non-spare host"):
        place(_hosts("a slots=8 spare"), workers=1, servers=0)


def test_capacity_error_with_many_hosts_lists_a_few():
    text = "\n".join(f"n{i}" for i in range(20))
    with pytest.raises(ConfigError) as info:
        place(_hosts(text), workers=21, servers=0)
    message = str(info.value)
    assert "only 20 exist on 20 non-spare hosts (n0 slots=1, " in message
    assert "n5 slots=1, ... (14 more))" in message
    assert "n6 " not in message


def test_empty_host_list_is_a_capacity_error():
    with pytest.raises(ConfigError, match="1 needed"):
        place([], workers=1, servers=0)


@pytest.mark.parametrize(
    ("workers", "servers", "fragment"),
    [
        (0, 0, "--workers must be a whole number >= 1 (got 0)"),
        (-3, 0, "--workers must be a whole number >= 1 (got -3)"),
        (True, 0, "--workers must be a whole number >= 1 (got True)"),
        (1, -1, "--servers must be a whole number >= 0 (got -1)"),
        (1, 1.5, "--servers must be a whole number >= 0 (got 1.5)"),
    ],
)
def test_bad_counts_are_refused(workers, servers, fragment):
    with pytest.raises(ConfigError) as info:
        place(_hosts("a slots=4"), workers=workers, servers=servers)
    assert str(info.value).startswith(fragment)


def test_repeated_labels_are_refused():
    host = HostSpec(label="a", hostname="a", slots=2, origin="x:1")
    with pytest.raises(ConfigError, match="host 'a' is listed twice"):
        place([host, host], workers=1, servers=0)


# ------------------------------------------------------------------ properties

host_specs = st.lists(
    st.tuples(st.integers(1, 6), st.integers(0, 6), st.booleans()),
    min_size=0,
    max_size=8,
).map(
    lambda rows: [
        HostSpec(label=f"h{i}", hostname=f"h{i}", slots=s, servers=min(q, s), spare=spare)
        for i, (s, q, spare) in enumerate(rows)
    ]
)


@settings(max_examples=400, deadline=None)
@given(hosts=host_specs, workers=st.integers(1, 40), servers=st.integers(0, 12))
def test_placement_properties(hosts, workers, servers):
    active = [h for h in hosts if not h.spare]
    capacity = sum(h.slots for h in active)
    if workers + servers > capacity:
        with pytest.raises(ConfigError, match=f"{workers + servers} needed"):
            place(hosts, workers=workers, servers=servers)
        return
    assignments = place(hosts, workers=workers, servers=servers)
    assert assignments == place(hosts, workers=workers, servers=servers)  # deterministic

    # sorted by (worker, server), then rank; every rank exactly once
    keys = [(a.role != "worker", a.rank) for a in assignments]
    assert keys == sorted(keys)
    for role, count in (("worker", workers), ("server", servers)):
        assert sorted(a.rank for a in assignments if a.role == role) == list(range(count))

    # no spare host, no host over its slots
    slots = {h.label: h.slots for h in active}
    for label, used in Counter(a.host for a in assignments).items():
        assert label in slots
        assert used <= slots[label]

    order = [h.label for h in active]
    for role in ("worker", "server"):
        mine = [a for a in assignments if a.role == role]
        per_host = Counter(a.host for a in mine)
        hosts_in_use = [label for label in order if per_host[label]]
        for a in mine:
            assert a.local_world_size == per_host[a.host]
            assert a.group_rank == hosts_in_use.index(a.host)
        # local ranks 0..n-1 per host, and ranks in blocks in file order
        for label in hosts_in_use:
            assert sorted(a.local_rank for a in mine if a.host == label) == list(
                range(per_host[label])
            )
        assert [(a.group_rank, a.local_rank) for a in mine] == sorted(
            (a.group_rank, a.local_rank) for a in mine
        )

    # servers use quotas first, in file order
    servers_on = Counter(a.host for a in assignments if a.role == "server")
    total_quota = sum(h.servers for h in active)
    assert sum(min(servers_on[h.label], h.servers) for h in active) == min(servers, total_quota)
    # workers fill hosts in file order: a host with workers has only full hosts before it
    used_on = Counter(a.host for a in assignments)
    workers_on = Counter(a.host for a in assignments if a.role == "worker")
    for i, host in enumerate(active):
        if workers_on[host.label]:
            assert all(used_on[h.label] == h.slots for h in active[:i])
