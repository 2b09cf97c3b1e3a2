"""PSLD's strawman placement (§7.1, "proportional"): a parameter server's share
of the model's bytes in proportion to its measured speed. Pure; the ``psld``
policy uses it for ``psld:assign=proportional``, the baseline PSLD is compared
against."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dtlaunch.errors import InfeasibleError

__all__ = ["assign_proportional"]


def assign_proportional(block_sizes: Sequence[int], speeds: Sequence[float]) -> tuple[int, ...]:
    """PSLD's strawman (§7.1, "proportional"): bytes in proportion to each
    server's measured speed, ignoring its fixed cost and the uncertainty. Blocks
    go largest first to the server whose load would then take the least time,
    ``(load + size) / speed``; equal times go to the lowest index. Returns
    each block's server, in the order of ``block_sizes``.

    Raises:
        InfeasibleError: invalid sizes, no speed, or a speed that is not a
            finite number > 0.
    """
    sizes = _validated_sizes(block_sizes)
    if not speeds or not all(math.isfinite(v) and v > 0 for v in speeds):
        raise InfeasibleError(f"speeds must be finite numbers > 0, got {list(speeds)!r}")
    loads = [0] * len(speeds)
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(len(speeds)), key=lambda j: ((loads[j] + sizes[i]) / speeds[j], j))
        loads[r] += sizes[i]
        owner[i] = r
    return tuple(owner)


def _validated_sizes(block_sizes: Sequence[int]) -> list[int]:
    sizes = list(block_sizes)
    if not all(type(s) is int and s >= 0 for s in sizes):
        raise InfeasibleError(f"block sizes must be integers >= 0 bytes, got {sizes!r}")
    return sizes
