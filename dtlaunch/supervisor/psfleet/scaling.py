"""Adding and removing built-in parameter servers while the job trains
(``dtlaunch scale RUN_DIR --servers M``; DLRover §5.3, PSLD §5). I/O-free.

The node table holds how many servers the job should run (``server_target``)
and their slots; the placement map says how many hold the model's blocks. The
fleet closes the gap one step at a time, each step a reassignment
(``reassign.BlockReassigner``) whose map has the new number of servers:

* **grow**: once every added server runs and listens (empty: it waits for an
  import), blocks move onto it, as few as balance needs (``solvers.spread``);
  it takes the workers' membership with its first import;
* **shrink**: the blocks of the servers at and above the target move onto the
  others, in the same way;
* **drain**: servers outside the map (a shrink done) are stopped.

Each step is decided afresh from the two counts, so a supervisor killed at any
point resumes where the run is: a reassignment left pending is completed or
rolled back first (``reassign``), and the counts tell what is left.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Drain", "Rescale", "ServerStep", "Wait", "next_server_step"]


@dataclass(frozen=True, slots=True)
class Rescale:
    """Reassign the blocks onto servers ``0..servers-1`` (grow or shrink)."""

    servers: int
    was: int


@dataclass(frozen=True, slots=True)
class Drain:
    """Stop these servers: no block of the job's map is on them."""

    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Not yet: why."""

    reason: str


ServerStep = Rescale | Drain | Wait


def next_server_step(
    *, map_servers: int, target: int, ready: Mapping[int, bool]
) -> ServerStep | None:
    """What the fleet does next to run ``target`` servers, from a map of
    ``map_servers`` and the server slots ``ready`` (rank -> it runs and its
    endpoint is known); None when nothing is left to do."""
    if map_servers != target:
        # Every server a block leaves or comes to must answer: the added ones
        # once they listen, the others (restarted ones) once back.
        waiting = [r for r in range(max(map_servers, target)) if not ready.get(r, False)]
        if waiting:
            return Wait(f"server(s) {', '.join(map(str, waiting))} not running yet")
        return Rescale(servers=target, was=map_servers)
    outside = tuple(sorted(r for r in ready if r >= target))
    return Drain(outside) if outside else None
