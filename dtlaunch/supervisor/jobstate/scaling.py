"""Changing a running job's number of workers or built-in parameter servers
(``dtlaunch scale RUN_DIR --workers N --servers M``). Pure.

Ranks stay ``0..N-1``, as torchrun's ``RANK``/``WORLD_SIZE`` promise a script: a
scale-up adds the next ranks, a scale-down removes the highest ones (rank 0,
which scripts single out for checkpoints and logs, stays while any worker
does). New workers go where a slot is free: spare hosts first (their agents
run already, idle), then the other hosts in hostfile order, as DLRover places
new pods on free capacity.

``plan_scale`` decides and refuses: a request that cannot be carried out raises
``ConfigError`` naming the problem and the fix, and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dtlaunch.errors import ConfigError
from dtlaunch.supervisor.placement import ROLE_SERVER, ROLE_WORKER, Assignment

__all__ = [
    "ScalePlan",
    "ServerChange",
    "added_assignment",
    "plan_scale",
    "rescaled",
    "rescaled_servers",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalePlan:
    count: int  # workers after the change
    added: dict[int, str]  # new rank -> the host it starts on
    removed: list[int]  # ranks that stop, highest first


def plan_scale(
    count: int,
    *,
    ranks: Sequence[int],
    room: Sequence[tuple[str, int]],
    stopping: Iterable[int] = (),
    role: str = ROLE_WORKER,
) -> ScalePlan:
    """The change from the ``role`` processes ``ranks`` (workers, or built-in
    parameter servers) to ``count`` of them.

    ``room``: (host, free slots) in the order new processes take them.
    ``stopping``: ranks a previous scale-down is still stopping; they cannot
    start again until their old process is gone (a worker's exit gives its data
    back, which must not take a new process's; a server's holds its port).

    Raises:
        ConfigError: ``count`` below 1, or more new processes than free slots.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(
            f"--{role}s must be a whole number >= 1 (got {count!r}); "
            "to end the job use dtlaunch stop"
        )
    current = sorted(ranks)
    if current != list(range(len(current))):
        raise ConfigError(f"the job's {role} ranks are not 0..n-1: {current}")
    if count <= len(current):
        return ScalePlan(count=count, added={}, removed=current[count:][::-1])
    wanted = list(range(len(current), count))
    busy = sorted(set(wanted) & set(stopping))
    if busy:
        raise ConfigError(
            f"{role}(s) {_ranks(busy)} are still stopping after the last scale-down; "
            "run dtlaunch scale again once they have stopped (dtlaunch status shows them)"
        )
    free = sum(max(0, n) for _, n in room)
    if free < len(wanted):
        where = ", ".join(f"{host}: {n}" for host, n in room if n > 0) or "none"
        other = "servers" if role == ROLE_WORKER else "workers"
        raise ConfigError(
            f"no room for {len(wanted)} more {role}(s): {free} slot(s) free on hosts that "
            f"are up ({where}). Fix: ask for at most {len(current) + free} {role}s, or "
            f"free slots (fewer {other}, a host back up, a larger slots= in the hostfile "
            "of a new job)"
        )
    added: dict[int, str] = {}
    slots = iter(host for host, n in room for _ in range(max(0, n)))
    for rank in wanted:
        added[rank] = next(slots)
    return ScalePlan(count=count, added=added, removed=[])


def added_assignment(
    rank: int, host: str, processes: Iterable[Assignment], role: str = ROLE_WORKER
) -> Assignment:
    """The assignment of a ``role`` process added on ``host`` beside ``processes``
    (the job's others): the next local rank of its role there, and the host's
    group rank (a host new to the role comes after the others, as torchrun
    numbers a node that joins)."""
    others = [a for a in processes if a.role == role and a.rank != rank]
    local = sum(1 for a in others if a.host == host)
    groups = {a.host: a.group_rank for a in others}
    group_rank = groups.get(host, max(groups.values(), default=-1) + 1)
    return Assignment(
        role=role,
        rank=rank,
        host=host,
        local_rank=local,
        local_world_size=local + 1,
        group_rank=group_rank,
    )


def rescaled(
    assignments: Sequence[Assignment], scales: Sequence[tuple[int, dict[int, str]]]
) -> tuple[list[Assignment], list[int]]:
    """The assignments after the job's scale steps (each: the worker count, and
    the host of each rank it added), as a resumed supervisor rebuilds them from
    the event log; with the ranks that ran once and are no longer the job's
    (their data shards must go back)."""
    current = list(assignments)
    ever = {a.rank for a in current if a.role == ROLE_WORKER}
    for count, added in scales:
        current = [a for a in current if a.role != ROLE_WORKER or a.rank < count]
        for rank, host in sorted(added.items()):
            if rank < count and all(a.rank != rank for a in current if a.role == ROLE_WORKER):
                current.append(added_assignment(rank, host, current))
                ever.add(rank)
    kept = {a.rank for a in current if a.role == ROLE_WORKER}
    current.sort(key=lambda a: (a.role != ROLE_WORKER, a.rank))
    return current, sorted(ever - kept)


# A step in the life of the built-in servers, as the event log tells it: a rank a
# scale-out added on a host, or a rank a scale-in drained and stopped (host "").
ServerChange = tuple[int, str]


def rescaled_servers(
    assignments: Sequence[Assignment], changes: Sequence[ServerChange]
) -> list[Assignment]:
    """The assignments after the servers' scale steps, in order (a rank added on
    its host, or a rank drained and stopped), as a resumed supervisor rebuilds
    them from the event log."""
    current = list(assignments)
    for rank, host in changes:
        current = [a for a in current if a.role != ROLE_SERVER or a.rank != rank]
        if host:
            current.append(added_assignment(rank, host, current, ROLE_SERVER))
    current.sort(key=lambda a: (a.role != ROLE_WORKER, a.rank))
    return current


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)
