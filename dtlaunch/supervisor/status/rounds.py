"""RNA's rounds as ``dtlaunch status`` shows them: rounds per second and each
worker's share of the rounds it contributed a gradient to, over the recent
``rna_rounds`` reports (``dtlaunch.supervisor.rna``). Under hierarchical RNA
several groups report, each its own rounds: the rate counts all of them, a
worker's share only those of its group (the reports it is a member of).
I/O-free."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["RoundRates"]

WINDOW_S = 10.0  # recent enough to follow a straggler, long enough to be smooth
REPORT_S = 1.0  # a group reports its rounds this often (runtime.rna_rounds.REPORT_EVERY_S)
STALE_S = 3 * REPORT_S  # no report for this long: no rounds run now


class RoundRates:
    """Folds ``rna_rounds`` events; see the module docstring."""

    def __init__(self) -> None:
        # (time, rounds in the report, {rank: rounds it contributed to})
        self._reports: deque[tuple[float, int, dict[int, int]]] = deque()
        self.total_rounds = 0
        # A snapshot asks once per worker node: computed once per report.
        self._shares: dict[int, float] | None = None

    def add(self, at: float, data: Mapping[str, Any]) -> None:
        members = [int(m) for m in data.get("members", [])]
        counts = [int(c) for c in data.get("contributions", [])]
        rounds = int(data.get("rounds", 0))
        self.total_rounds += rounds
        self._shares = None
        self._reports.append((at, rounds, dict(zip(members, counts, strict=False))))
        while self._reports and at - self._reports[0][0] > WINDOW_S:
            self._reports.popleft()

    def per_second(self, now: float) -> float:
        """Rounds per second over the window up to ``now``; 0 once reports stop."""
        recent = [r for r in self._reports if now - r[0] <= WINDOW_S]
        if not recent or now - recent[-1][0] > STALE_S:
            return 0.0
        # Each report covers about REPORT_S before it was sent.
        span = recent[-1][0] - recent[0][0] + REPORT_S
        return sum(r[1] for r in recent) / span

    def shares(self) -> dict[int, float]:
        """Each worker's contributions over its group's rounds in the window, 0 to 1."""
        if self._shares is None:
            counts: dict[int, int] = {}
            rounds: dict[int, int] = {}  # rank -> rounds of the reports it is in
            for _, in_report, by_rank in self._reports:
                for rank, count in by_rank.items():
                    counts[rank] = counts.get(rank, 0) + count
                    rounds[rank] = rounds.get(rank, 0) + in_report
            self._shares = {
                rank: count / rounds[rank] for rank, count in sorted(counts.items()) if rounds[rank]
            }
        return self._shares
