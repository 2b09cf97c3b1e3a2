"""A member's gradients between RNA's rounds (RNA §3.3): the ones handed over
and not yet in a round (``PendingGradients``), their staleness-weighted local
reduction for the next round (``local_contribution``), and whose state a
re-formed group takes (``state_source``). Used by the communication thread
(``rna_rounds.RoundWorker``); no I/O, no threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dtlaunch.solvers.rna import staleness_weights

__all__ = ["Contribution", "PendingGradients", "local_contribution", "state_source"]


@dataclass(frozen=True, slots=True)
class Contribution:
    """What a member puts into a round: the staleness-weighted mean of its
    pending gradients (None: nothing, weight 0) and the largest staleness kept."""

    gradient: torch.Tensor | None
    staleness: int


def local_contribution(
    pending: Sequence[tuple[int, torch.Tensor, int]], *, current: int, bound: int
) -> Contribution:
    """RNA §3.3's local reduction of ``pending``: (model version, sum of the
    gradients computed on it, how many) for round ``current``.

    Each gradient of version ``t`` weighs ``t - min_kept + 1`` (newer ones more);
    versions more than ``bound`` rounds old are dropped. A version newer than
    ``current`` (a member that ran a round the re-formed group did not) counts as
    current.
    """
    versions = [min(version, current) for version, _, count in pending for _ in range(count)]
    if not versions:
        return Contribution(None, 0)
    weights = staleness_weights(versions, current=current, bound=bound)
    total: torch.Tensor | None = None
    oldest = 0
    index = 0
    for version, summed, count in pending:
        weight = weights[index]  # every gradient of one version weighs the same
        index += count
        if weight <= 0.0:
            continue
        term = summed * weight
        total = term if total is None else total + term
        oldest = max(oldest, current - min(version, current))
    return Contribution(total, oldest)


def state_source(applied: Sequence[Any], named: int) -> int:
    """The group index whose state a new group takes: the member whose model
    holds the most rounds (``applied``, by group index), ``named`` (the
    coordinator's source) among equals, else the first of them. Under
    hierarchical RNA each entry is (rounds, exchanges with the server): of two
    models with the same rounds, the one that took the server's model after
    the last round is ahead."""
    most = max(applied)
    if applied[named] == most:
        return named
    return applied.index(most)


@dataclass(slots=True)
class PendingGradients:
    """Gradients handed over and not yet in a round: per model version, their sum."""

    by_version: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)

    def add(self, version: int, gradient: torch.Tensor) -> None:
        summed, count = self.by_version.get(version, (None, 0))
        self.by_version[version] = (gradient if summed is None else summed + gradient, count + 1)

    def prune(self, *, current: int, bound: int) -> None:
        """Drop what no round can use any more: memory stays bounded while no
        round runs (a group forming)."""
        for version in [v for v in self.by_version if current - v > bound]:
            del self.by_version[version]

    def take(self) -> list[tuple[int, torch.Tensor, int]]:
        taken = [(v, s, c) for v, (s, c) in sorted(self.by_version.items())]
        self.by_version.clear()
        return taken

    def put_back(self, taken: list[tuple[int, torch.Tensor, int]]) -> None:
        for version, summed, count in taken:
            held, held_count = self.by_version.get(version, (None, 0))
            self.by_version[version] = (
                summed if held is None else held + summed,
                held_count + count,
            )

    def __bool__(self) -> bool:
        return bool(self.by_version)
