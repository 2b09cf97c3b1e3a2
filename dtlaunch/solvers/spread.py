"""The parameter blocks spread over a changed number of servers (DLRover §5.3,
PSLD §5: servers added or removed while the job trains). Pure.

A scale-out or scale-in moves blocks live, and every block moved is paused
traffic, so the new owners keep every block where it is unless balance needs
it elsewhere: the blocks of removed servers go first, largest first to the
least loaded server that stays (LPT), then single blocks move from the most to
the least loaded server while that lowers the larger of the two loads. On equal
speeds this is the least bytes a balanced placement needs to move, up to the
greedy's granularity (a block larger than the gap stays). Last, a server left
without a block takes the smallest block of one that holds several (an added
server must receive something to be brought to the others' step).
"""

from __future__ import annotations

from collections.abc import Sequence

from dtlaunch.errors import InfeasibleError

__all__ = ["spread_blocks"]


def spread_blocks(
    block_sizes: Sequence[int], owner: Sequence[int], servers: int
) -> tuple[int, ...]:
    """Each block's server once the job runs ``servers`` servers (``0..servers-1``),
    from ``owner`` (each block's server now, any index ``>= 0``; those at or above
    ``servers`` are removed), moving few bytes. Ties go to the lowest index.

    Raises:
        InfeasibleError: no server, sizes and owners of different lengths, a
            negative size or owner.
    """
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise InfeasibleError(f"at least one server is needed, got {servers!r}")
    sizes = [int(s) for s in block_sizes]
    placed = [int(s) for s in owner]
    if len(sizes) != len(placed):
        raise InfeasibleError(f"{len(sizes)} block sizes for {len(placed)} owners")
    if any(s < 0 for s in sizes) or any(s < 0 for s in placed):
        raise InfeasibleError("block sizes and owners must be >= 0")
    loads = [0] * servers
    homeless = []
    for block, (size, server) in enumerate(zip(sizes, placed, strict=True)):
        if server < servers:
            loads[server] += size
        else:
            homeless.append(block)
    for block in sorted(homeless, key=lambda b: (-sizes[b], b)):
        target = min(range(servers), key=lambda j: (loads[j], j))
        placed[block] = target
        loads[target] += sizes[block]
    # Each move lowers the sorted load vector, so this ends; the bound is a guard.
    for _ in range(len(sizes) * servers + 1):
        heavy = max(range(servers), key=lambda j: (loads[j], -j))
        light = min(range(servers), key=lambda j: (loads[j], j))
        gap = loads[heavy] - loads[light]
        # The block whose move leaves the two loads closest: size nearest gap / 2,
        # and below the gap (else the larger load would not drop); of two as
        # close, the smaller (fewer bytes paused).
        movable = [b for b, server in enumerate(placed) if server == heavy and 0 < sizes[b] < gap]
        if not movable:
            break
        block = min(movable, key=lambda b: (abs(2 * sizes[b] - gap), sizes[b], b))
        placed[block] = light
        loads[heavy] -= sizes[block]
        loads[light] += sizes[block]
    # Every server holds a block while there are blocks enough: a server added
    # empty would join the map without ever being brought to the others' step
    # (its blocks are what an import brings it to). It takes the smallest block
    # of a server that holds two or more.
    for empty in range(servers):
        if any(server == empty for server in placed):
            continue
        held = [placed.count(j) for j in range(servers)]
        donors = [b for b, server in enumerate(placed) if held[server] > 1]
        if not donors:
            break
        placed[min(donors, key=lambda b: (sizes[b], b))] = empty
    return tuple(placed)
