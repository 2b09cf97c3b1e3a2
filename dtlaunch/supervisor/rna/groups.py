"""Hierarchical RNA's groups (RNA §4), I/O-free: one round coordinator per group.

``GroupedCoordinator`` is what the supervisor's round service talks to. It
starts with one group of every worker; ``partition`` replaces the groups (the
policy's decision from the workers' iteration times, ``solvers.rna.split_groups``)
without restarting any process: each new group is one new generation of the
members it takes over, formed at once, with the state of its most advanced
member. A worker's messages go to the coordinator of its group; those about a
generation of the old partition are then stale and ignored.

With a parameter server (``exchange_every`` > 0), from the first partition on
each group exchanges its model with the server every ``exchange_every`` of its
rounds (the initiator
pushes the group's progress since its last exchange, weighted by the group's
share of the workers, and pulls the server's model, which it broadcasts to the
group: asynchronous model averaging between the groups). At the end every group
holds its members after its last exchange, and once every group's last
exchange is on the server, one more exchange gives all of them the same final
model before they are let go together, as a single group's members are.
Until the first partition the one group runs plain RNA, without exchanges
(and the server stays empty: the first exchange seeds it with the model the
groups start from); after it, the server holds the job's model, and the groups
keep exchanging even if they are merged back into one. Without a parameter
server there is one group and no exchange: plain RNA.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dtlaunch.supervisor.rna.coordinator import (
    Command,
    GroupPhase,
    Note,
    RoundCoordinator,
)

__all__ = ["GroupedCoordinator"]


class GroupedCoordinator:
    """See the module docstring."""

    def __init__(
        self,
        *,
        world_size: int,
        probes: int = 2,
        group_timeout_s: float = 60.0,
        join_grace_s: float = 120.0,
        sample_every_s: float = 1.0,
        seed: int = 0,
        first_gen: int = 1,
        exchange_every: int = 0,
    ) -> None:
        if exchange_every < 0:
            raise ValueError(f"exchange_every must be 0 or more, got {exchange_every}")
        self.world_size = world_size
        self.probes = probes
        self.group_timeout_s = group_timeout_s
        self.join_grace_s = join_grace_s
        self.sample_every_s = sample_every_s
        self.exchange_every = exchange_every
        self._seed = seed
        self._gens = itertools.count(first_gen)
        self.partitions = 0  # partitions made after the first group
        self.groups: list[tuple[int, ...]] = [tuple(range(world_size))]
        self._subs: list[RoundCoordinator] = [self._new(self.groups[0], 0)]
        self._exchange_noted_at: dict[int, float] = {}
        self._rounds_before = 0  # started by the groups of earlier partitions

    # ------------------------------------------------------------- queries

    @property
    def hierarchical(self) -> bool:
        """Whether groups can exchange through a parameter server (and so be
        partitioned)."""
        return self.exchange_every > 0

    @property
    def coordinators(self) -> list[RoundCoordinator]:
        return list(self._subs)

    @property
    def members(self) -> list[int]:
        return sorted(m for sub in self._subs for m in sub.members)

    @property
    def rounds_started(self) -> int:
        """Rounds started by every group, those of earlier partitions included."""
        return self._rounds_before + sum(sub.rounds_started for sub in self._subs)

    def group_of(self, rank: int) -> RoundCoordinator | None:
        for sub in self._subs:
            if rank in sub.ranks:
                return sub
        return None

    def partition_refusal(self, groups: Sequence[Sequence[int]]) -> str | None:
        """Why ``groups`` cannot replace the partition now (None: it can)."""
        if not self.hierarchical:
            return (
                "hierarchical RNA's groups exchange through a parameter server; "
                "this job has none (run it with --servers 1)"
            )
        flat = sorted(r for group in groups for r in group)
        if flat != list(range(self.world_size)) or any(not group for group in groups):
            return (
                f"groups {[list(g) for g in groups]} do not cover ranks "
                f"0..{self.world_size - 1} once each"
            )
        if self._in_force(groups):
            return None  # nothing to change
        for sub in self._subs:
            if sub.leaving or sub.phase is GroupPhase.HOLDING:
                return "workers are finishing their data: the groups stay as they are"
            if sub.expected and sub.phase is not GroupPhase.RUNNING:
                # Its members may still be blocked in a collective of a group a
                # crash or a death interrupted; regrouping them now would time out
                # on them and leave them out.
                return f"a group is {sub.phase.value}: the groups change once every one runs"
        return None

    def _in_force(self, groups: Sequence[Sequence[int]]) -> bool:
        return sorted(tuple(sorted(g)) for g in groups) == sorted(self.groups)

    # --------------------------------------------------------- partition

    def partition(self, groups: Sequence[Sequence[int]], now: float, reason: str) -> list[Command]:
        """Replace the groups by ``groups`` (each a list of ranks; together every
        rank once). Refused (a note, nothing changed) per ``partition_refusal``."""
        refusal = self.partition_refusal(groups)
        if refusal is None and self._in_force(groups):
            return []
        if refusal is not None:
            return [
                Note(
                    "rna_partition",
                    {"groups": [list(g) for g in groups], "refused": refusal, "reason": reason},
                )
            ]
        old = self._subs
        self._rounds_before += sum(o.rounds_started for o in old)
        self.groups = [tuple(sorted(g)) for g in groups]
        self.partitions += 1
        self._subs = [self._new(group, i) for i, group in enumerate(self.groups)]
        out: list[Command] = [
            Note(
                "rna_partition",
                {"groups": [list(g) for g in self.groups], "reason": reason},
            )
        ]
        for sub in self._subs:
            joined: dict[int, int] = {}
            expected: set[int] = set()
            restarting: set[int] = set()
            for rank in sub.ranks:
                was = next(o for o in old if rank in o.ranks)
                if rank in was.expected:
                    expected.add(rank)
                if rank in was.restarting:
                    restarting.add(rank)
                elif rank in was.joined:
                    joined[rank] = was.joined[rank]
                elif rank in was.members:
                    joined[rank] = was.round  # its model holds the group's rounds
            out += sub.take_over(
                joined=joined,
                expected=expected,
                restarting=restarting,
                now=now,
                reason=f"partition {self.partitions}",
            )
        return out

    # ------------------------------------------------- stimuli, by rank

    def join(self, rank: int, applied: int, now: float, *, finished: bool = False) -> list[Command]:
        sub = self.group_of(rank)
        if sub is None:
            return []
        return sub.join(rank, applied, now, finished=finished) + self._release(now)

    def leave(self, rank: int, applied: int, now: float) -> list[Command]:
        sub = self.group_of(rank)
        if sub is None:
            return []
        return sub.leave(rank, applied, now) + self._release(now)

    def worker_gone(self, rank: int, now: float, *, succeeded: bool = False) -> list[Command]:
        sub = self.group_of(rank)
        if sub is None:
            return []
        return sub.worker_gone(rank, now, succeeded=succeeded) + self._release(now)

    def store_ready(self, rank: int, gen: int, port: int, addr: str) -> list[Command]:
        sub = self.group_of(rank)
        return sub.store_ready(rank, gen, port, addr) if sub is not None else []

    def formed(self, rank: int, gen: int, applied: int, now: float) -> list[Command]:
        sub = self.group_of(rank)
        if sub is None:
            return []
        return sub.formed(rank, gen, applied, now) + self._release(now)

    def failed(self, rank: int, gen: int, round_: int, error: str, now: float) -> list[Command]:
        sub = self.group_of(rank)
        return sub.failed(rank, gen, round_, error, now) if sub is not None else []

    def ready(self, rank: int, gen: int, round_: int, now: float) -> list[Command]:
        sub = self.group_of(rank)
        return sub.ready(rank, gen, round_, now) if sub is not None else []

    def exchanged(
        self,
        rank: int,
        gen: int,
        round_: int,
        now: float,
        *,
        seconds: float,
        ok: bool = True,
        error: str = "",
    ) -> list[Command]:
        """The initiator of ``round_`` exchanged its group's model with the
        server (``ok``) or failed to (the group kept its own model)."""
        sub = self.group_of(rank)
        if sub is None:
            return []
        out = sub.exchanged(rank, gen, round_)
        index = self._subs.index(sub)
        if not ok or now - self._exchange_noted_at.get(index, -1e18) >= self.sample_every_s:
            self._exchange_noted_at[index] = now
            fields: dict[str, object] = {
                "group": index,
                "gen": gen,
                "round": round_,
                "initiator": rank,
                "seconds": round(seconds, 6),
                "exchanges": sub.exchanges,
            }
            if not ok:
                fields["error"] = error
            out.append(Note("rna_exchange", fields))
        return out + self._release(now)

    def tick(self, now: float) -> list[Command]:
        out: list[Command] = []
        for sub in self._subs:
            out += sub.tick(now)
        return out + self._release(now)

    # ------------------------------------------------------------ internals

    def _new(self, ranks: Sequence[int], index: int) -> RoundCoordinator:
        exchanging = self.hierarchical and self.partitions > 0
        return RoundCoordinator(
            world_size=self.world_size,
            probes=self.probes,
            group_timeout_s=self.group_timeout_s,
            join_grace_s=self.join_grace_s,
            sample_every_s=self.sample_every_s,
            seed=self._seed + 7919 * (self.partitions * len(self.groups) + index),
            ranks=ranks,
            gens=self._gens,
            group_size=len(ranks) if exchanging else 0,
            exchange_every=self.exchange_every if exchanging else 0,
        )

    def _release(self, now: float) -> list[Command]:
        """Once every group holds after its last exchange (or has nobody left),
        release them all: each takes the server's final model and is let go."""
        if not self.hierarchical:
            return []
        held = [sub for sub in self._subs if sub.ready_to_release]
        if not held or any(not sub.ready_to_release and sub.expected for sub in self._subs):
            return []
        out: list[Command] = []
        for sub in held:
            out += sub.release(now)
        return out
