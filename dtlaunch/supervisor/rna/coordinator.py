"""RNA's round coordinator: groups, probes and rounds, I/O-free (RNA §3.2, §3.3).

The supervisor keeps no training state for RNA, only who is in the group and
which round is next. Stimuli go in through methods (a worker joined, a store
listens, a member formed, a probe was answered, a collective failed, a worker
left or died, time passed); each returns the commands to carry out: a message
to one worker, or an event to record. The clock is a parameter, so tests drive
it step by step with a fake time.

Group life: ``WAITING`` for the workers to join (every expected worker, or the
ones that did within ``join_grace_s``) -> ``OPENING`` (one member opens the
generation's store) -> ``FORMING`` (every member connects and takes the model
state of the member with the most rounds, ``source_rank`` among equals: a round
under way when a member died may have ended on some members only) ->
``RUNNING`` rounds. A member that dies, fails a collective, leaves, or a
newcomer that joins, ends the generation: a new one is formed from whoever is
still there, at once (a member finishes the round it is in before it reads the
new group: it reads its messages in order; one still waiting for a given-up
group's members leaves that wait when the new one's message comes). A member
that does not answer while a group forms is left out after ``group_timeout_s``.

A round (§3.2): ``probes`` random members are probed; the first that answers
that it has a gradient becomes the initiator and every member is told to run
the round. A probe unanswered after ``reprobe_after`` (three times the median
recent response, at least ``MIN_REPROBE_S``) widens the round to ``probes``
more members, so one lost probe or two busy workers cannot hold the group up.
Answers name their round: one for a round already started is late and ignored.

Hierarchical RNA (§4, ``groups.py``) runs one coordinator per group of the
partition, on that group's ``ranks``, numbering generations from one shared
counter. Every ``exchange_every`` rounds, a round carries an exchange with the
parameter server between the groups (``RnaStart.exchange``). A group that
exchanges (``hold_at_end``) and whose members all finished does not let them go: its
last round exchanges (its progress reaches the server), the initiator confirms
it (``exchanged``), and the group ``HOLDING``s until ``release``: one more
exchange, after every group's last one, gives all of them the job's final model.
"""

from __future__ import annotations

import enum
import itertools
import random
import statistics
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dtlaunch.wire.messages import (
    Message,
    RnaGroup,
    RnaLeft,
    RnaOpenStore,
    RnaProbe,
    RnaStart,
)

__all__ = [
    "Command",
    "GroupPhase",
    "Note",
    "RoundCoordinator",
    "SendTo",
]

MIN_REPROBE_S = 0.05  # below this, widening would race the answers already on their way
FIRST_REPROBE_S = 0.5  # before any response was measured
RESPONSES_KEPT = 64
WAIT_NOTE_EVERY_S = 10.0  # how often a round that does not start is reported
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True, slots=True)
class SendTo:
    """Send ``msg`` to worker ``rank``."""

    rank: int
    msg: Message


@dataclass(frozen=True, slots=True)
class Note:
    """Record an event ``kind`` with ``fields``."""

    kind: str
    fields: dict[str, Any]


Command = SendTo | Note


class GroupPhase(enum.Enum):
    WAITING = "waiting"  # for workers to join
    OPENING = "opening"  # one member opens the store
    FORMING = "forming"  # every member connects and takes the state
    RUNNING = "running"  # rounds
    HOLDING = "holding"  # every member finished; waits for the other groups (§4)
    DONE = "done"  # every worker left


@dataclass(slots=True)
class _Generation:
    gen: int
    members: list[int]
    store_rank: int
    source_rank: int
    deadline: float
    store_addr: str = ""
    store_port: int = 0
    formed: set[int] = field(default_factory=set)


class RoundCoordinator:
    """See the module docstring. ``address_of(rank)`` is the host address other
    workers reach ``rank``'s store at."""

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
        ranks: Iterable[int] | None = None,
        gens: Iterator[int] | None = None,
        group_size: int = 0,
        exchange_every: int = 0,
    ) -> None:
        """``ranks``: this coordinator's workers (default: all ``world_size``);
        ``gens``: the generation numbers to use (default: from ``first_gen``),
        shared by the groups of a partition; ``group_size``, ``exchange_every``:
        hierarchical RNA's (module docstring; 0, 0: one group without a
        parameter server)."""
        if probes < 1:
            raise ValueError(f"probes must be at least 1, got {probes}")
        self.world_size = world_size
        self.ranks = frozenset(ranks if ranks is not None else range(world_size))
        self._gens = gens if gens is not None else itertools.count(first_gen)
        self.group_size = group_size
        self.exchange_every = exchange_every
        self.hold_at_end = exchange_every > 0  # the last exchange comes before leaving
        self._rounds_to_exchange = exchange_every
        self.final_round = -1  # HOLDING: the last round, whose exchange is awaited
        self.final_exchanged = False
        self._final_initiator = -1  # of the last round that exchanged
        self.exchanges = 0  # confirmed by the initiators
        self.probes = probes
        self.group_timeout_s = group_timeout_s
        self.join_grace_s = join_grace_s
        self.sample_every_s = sample_every_s
        self._rng = random.Random(seed)
        self.phase = GroupPhase.WAITING
        self.expected: set[int] = set(self.ranks)  # alive, not left
        self.joined: dict[int, int] = {}  # rank -> rounds in its model, since the last group
        self.leaving: set[int] = set()  # members whose training ended, kept until all have
        self.restarting: set[int] = set()  # exited, expected back (a restart joins again)
        self._failed_formations = 0  # in a row: the next group waits longer each time
        self._not_before = 0.0  # no group opens before this
        self._first_join_at: float | None = None
        self.current: _Generation | None = None
        self._last_formed: _Generation | None = None  # its members hold the newest model
        self.round = 0  # the round being probed
        self._probed: dict[int, float] = {}  # rank -> when probed, for the open round
        self._opened_at = 0.0
        self._widened_at = 0.0
        self._noted_wait_at = 0.0
        self._responses: deque[float] = deque(maxlen=RESPONSES_KEPT)
        self._sampled_at = -1e18
        self.rounds_started = 0
        self.late_answers = 0
        self.regroups = 0

    # ------------------------------------------------------------- queries

    @property
    def members(self) -> list[int]:
        return list(self.current.members) if self.current is not None else []

    def reprobe_after(self) -> float:
        """How long a round's probes may go unanswered before more are sent."""
        if not self._responses:
            return FIRST_REPROBE_S
        return max(MIN_REPROBE_S, 3.0 * statistics.median(self._responses))

    def median_response_s(self) -> float | None:
        return statistics.median(self._responses) if self._responses else None

    # --------------------------------------------------------- membership

    def join(self, rank: int, applied: int, now: float, *, finished: bool = False) -> list[Command]:
        """``rank``'s communication thread is ready: a first start, a restart, or
        a member that lost its group (a failed collective) asking back in;
        ``finished``: its training ended already (it only waits to be let go)."""
        if rank not in self.ranks:
            return []
        self.expected.add(rank)
        if finished:
            self.leaving.add(rank)
        else:
            self.leaving.discard(rank)
        self.restarting.discard(rank)
        self.joined[rank] = applied
        if self._first_join_at is None:
            self._first_join_at = now
        if self.phase is GroupPhase.WAITING or self.phase is GroupPhase.DONE:
            return self._maybe_open(now)
        if self.current is not None and rank in self.current.members:
            if self.phase in (GroupPhase.OPENING, GroupPhase.FORMING):
                return []  # the group being formed has it: its RnaGroup is on the way
            # A member of the running group lost it (its process restarted before
            # we heard it died, or a collective of an older group failed late).
            return self._regroup(now, reason=f"worker {rank} joined again")
        return self._regroup(now, reason=f"worker {rank} joined")

    def leave(self, rank: int, applied: int, now: float) -> list[Command]:
        """``rank``'s training ended. Its last gradient is used: it is a ready
        answer to the open round. It stays a member (with nothing to add, so it
        is not probed) until every member has left; then one last round runs
        and all of them are let go together, with the same final model."""
        cur = self.current
        out: list[Command] = [Note("rna_leave", {"rank": rank, "applied": applied})]
        if cur is None or rank not in cur.members:
            if applied > 0 and rank in self.expected:
                # It lost its group (a crash, a member's death, a group that timed
                # out) and its data ended before the next one formed: it joins that
                # one as finished, so that it ends on the group's model, not its own.
                return [*out, *self.join(rank, applied, now, finished=True)]
            # Not in a group (it never formed one): nothing of it to wait for.
            self.expected.discard(rank)
            self.joined.pop(rank, None)
            return [*out, SendTo(rank, RnaLeft(round=-1)), *self._maybe_open(now)]
        self.leaving.add(rank)
        if self.phase is not GroupPhase.RUNNING:
            return out  # the group forms first; its first round uses the gradient
        finished = self._all_finished(cur)
        last = finished and self.hold_at_end
        out += self._start(rank, now, exchange=last, final=last, timed=not finished)
        if finished:
            return out + self._end(now)
        return out + self._open_round(now)

    def worker_gone(self, rank: int, now: float, *, succeeded: bool = False) -> list[Command]:
        """``rank``'s process ended (the node table heard it). Unless it was let
        go already, or ``succeeded`` (it ended its work without waiting to be let
        go: it is not restarted), it is restarting: its restart joins again, and
        the finished members wait for it, so that it too ends with their model."""
        if rank not in self.expected:
            return []  # let go, then exited
        if succeeded:
            self.expected.discard(rank)
        else:
            self.restarting.add(rank)
        self.joined.pop(rank, None)
        self.leaving.discard(rank)
        cur = self.current
        if cur is not None and rank in cur.members:
            # Its gloo group cannot run another collective: a new one without it
            # (which, when the others only wait to be let go, runs their last round).
            return self._regroup(now, reason=f"worker {rank} exited")
        return self._maybe_open(now) if self.phase is GroupPhase.WAITING else []

    def take_over(
        self,
        *,
        joined: dict[int, int],
        expected: set[int],
        restarting: set[int],
        now: float,
        reason: str,
    ) -> list[Command]:
        """Start as one group of a new partition (``groups.py``): ``joined``, its
        ranks alive in the old groups (rank -> rounds in their models), form its
        first generation at once; ``expected``: its ranks not let go yet;
        ``restarting``: those of them whose restart will join."""
        self.expected = set(expected) & self.ranks
        self.restarting = set(restarting) & self.ranks
        self.joined = {r: a for r, a in joined.items() if r in self.ranks}
        if not self.joined:
            return self._maybe_open(now)
        return self._open(now, sorted(self.joined), reason=reason)

    # ------------------------------------------------------------- forming

    def store_ready(self, rank: int, gen: int, port: int, addr: str) -> list[Command]:
        """The store host answered ``RnaOpenStore``: tell every member where it is."""
        cur = self.current
        if (
            cur is None
            or self.phase is not GroupPhase.OPENING
            or gen != cur.gen
            or rank != cur.store_rank
        ):
            return []
        cur.store_addr, cur.store_port = addr, port
        self.phase = GroupPhase.FORMING
        msg = RnaGroup(
            gen=cur.gen,
            members=list(cur.members),
            store_addr=addr,
            store_port=port,
            source_rank=cur.source_rank,
            timeout_s=self.group_timeout_s,
            group_size=self.group_size,
        )
        return [SendTo(member, msg) for member in cur.members]

    def formed(self, rank: int, gen: int, applied: int, now: float) -> list[Command]:
        """``rank`` formed the group; once every member has, rounds begin at ``applied``."""
        cur = self.current
        if cur is None or self.phase is not GroupPhase.FORMING or gen != cur.gen:
            return []
        if rank not in cur.members:
            return []
        cur.formed.add(rank)
        if cur.formed != set(cur.members):
            return []
        self.phase = GroupPhase.RUNNING
        self.round = applied
        self.joined.clear()
        self._first_join_at = None
        self._failed_formations = 0
        self._last_formed = cur
        out: list[Command] = [
            Note(
                "rna_group",
                {
                    "phase": "formed",
                    "gen": cur.gen,
                    "members": list(cur.members),
                    "source": cur.source_rank,
                    "round": applied,
                },
            )
        ]
        if self._all_finished(cur):  # they all finished while it formed
            first = min(cur.members)
            return (
                out
                + self._start(
                    first, now, exchange=self.hold_at_end, final=self.hold_at_end, timed=False
                )
                + self._end(now)
            )
        return out + self._open_round(now)

    def failed(self, rank: int, gen: int, round_: int, error: str, now: float) -> list[Command]:
        """A collective of ``gen`` failed on ``rank``: form a new group of the living."""
        cur = self.current
        if cur is None or gen != cur.gen:
            return []
        note = Note("rna_failed", {"rank": rank, "gen": gen, "round": round_, "error": error})
        if self.phase is not GroupPhase.RUNNING:
            self._failed_formations += 1
        return [note, *self._regroup(now, reason=f"a collective failed on worker {rank}")]

    # -------------------------------------------------------------- rounds

    def ready(self, rank: int, gen: int, round_: int, now: float) -> list[Command]:
        """``rank`` answers a probe: the first answer for the open round starts it."""
        cur = self.current
        if (
            cur is None
            or self.phase is not GroupPhase.RUNNING
            or gen != cur.gen
            or round_ != self.round
            or rank not in cur.members
        ):
            self.late_answers += 1
            return []
        return self._start(rank, now) + self._open_round(now)

    def exchanged(self, rank: int, gen: int, round_: int) -> list[Command]:
        """``rank``, the initiator of ``round_``, exchanged the group's model with
        the parameter server. For a ``HOLDING`` group's last round: its progress
        is on the server, and the group may be released."""
        cur = self.current
        if cur is None or gen != cur.gen or rank not in cur.members:
            return []
        self.exchanges += 1
        if self.phase is GroupPhase.HOLDING and round_ == self.final_round:
            self.final_exchanged = True
            return [Note("rna_group", {"phase": "holding", "gen": gen, "round": round_})]
        return []

    @property
    def ready_to_release(self) -> bool:
        """Holding, with its last round's exchange confirmed."""
        return self.phase is GroupPhase.HOLDING and self.final_exchanged

    def release(self, now: float) -> list[Command]:
        """Every group's last exchange is on the server: one more exchange takes
        the job's final model to every member, then they are let go together."""
        cur = self.current
        if cur is None or not self.ready_to_release:
            return []
        return self._start(min(cur.members), now, exchange=True, timed=False) + self._let_go(now)

    def tick(self, now: float) -> list[Command]:
        """Time passed: widen an unanswered round, give up on silent members."""
        cur = self.current
        if self.phase is GroupPhase.WAITING:
            return self._maybe_open(now)
        if cur is None:
            return []
        if self.phase is GroupPhase.HOLDING:
            if now - self._noted_wait_at < WAIT_NOTE_EVERY_S:
                return []
            self._noted_wait_at = now
            why = (
                "every member finished; waiting for the other groups to finish, to take "
                "the job's final model from the parameter server"
                if self.final_exchanged
                else f"every member finished; waiting for worker {self._final_initiator}'s "
                "last exchange with the parameter server"
            )
            return [
                Note(
                    "rna_wait",
                    {"round": self.final_round, "gen": cur.gen, "probed": [], "why": why},
                )
            ]
        if self.phase in (GroupPhase.OPENING, GroupPhase.FORMING) and now >= cur.deadline:
            silent = (
                [cur.store_rank]
                if self.phase is GroupPhase.OPENING
                else sorted(set(cur.members) - cur.formed)
            )
            for rank in silent:
                self.joined.pop(rank, None)
            note = Note(
                "rna_group",
                {
                    "phase": "timeout",
                    "gen": cur.gen,
                    "waited_s": self.group_timeout_s,
                    "silent": silent,
                    "stage": self.phase.value,
                },
            )
            self._failed_formations += 1
            survivors = [m for m in cur.members if m not in silent]
            return [note, *self._regroup(now, reason="members did not answer", keep=survivors)]
        if self.phase is not GroupPhase.RUNNING:
            return []
        out: list[Command] = []
        if now - self._widened_at >= self.reprobe_after():
            out += self._probe(now, self._pick(exclude=set(self._probed)))
        if now - self._opened_at >= WAIT_NOTE_EVERY_S and now - self._noted_wait_at >= (
            WAIT_NOTE_EVERY_S
        ):
            self._noted_wait_at = now
            out.append(
                Note(
                    "rna_wait",
                    {
                        "round": self.round,
                        "gen": cur.gen,
                        "waited_s": round(now - self._opened_at, 3),
                        "probed": sorted(self._probed),
                        "why": (
                            f"every member finished; waiting for worker(s) "
                            f"{sorted(self.restarting)} to rejoin"
                            if self.leaving >= set(cur.members)
                            else "no probed worker has a gradient ready"
                        ),
                    },
                )
            )
        return out

    # ------------------------------------------------------------ internals

    def _maybe_open(self, now: float) -> list[Command]:
        if not self.joined:
            if not self.expected and self.current is None and self.phase is not GroupPhase.DONE:
                self.phase = GroupPhase.DONE
                return [Note("rna_group", {"phase": "done", "rounds": self.rounds_started})]
            return []
        waiting_for = sorted(self.expected - set(self.joined))
        first = self._first_join_at if self._first_join_at is not None else now
        if (waiting_for and now - first < self.join_grace_s) or now < self._not_before:
            return []
        return self._open(now, sorted(self.joined), missing=waiting_for)

    def _regroup(self, now: float, *, reason: str, keep: list[int] | None = None) -> list[Command]:
        """End the current generation and open the next one with who is still here."""
        cur = self.current
        staying = keep if keep is not None else (cur.members if cur is not None else [])
        members = sorted(
            {m for m in staying if m in self.expected and m not in self.restarting}
            | set(self.joined)
        )
        self.regroups += 1
        self._probed.clear()
        self.final_round, self.final_exchanged = -1, False
        if not members:
            self.current = None
            self.phase = GroupPhase.WAITING
            return [Note("rna_group", {"phase": "ended", "reason": reason}), *self._maybe_open(now)]
        if self._failed_formations >= 2:
            # The same failure again and again (a port that cannot be reached, a
            # broken host): try again later, not in a tight loop.
            delay = min(MAX_BACKOFF_S, 0.5 * 2 ** (self._failed_formations - 2))
            self.current = None
            self.phase = GroupPhase.WAITING
            self.joined.update({m: self.joined.get(m, 0) for m in members})
            self._not_before = now + delay
            self._first_join_at = now - self.join_grace_s  # nobody else to wait for
            return [Note("rna_group", {"phase": "backoff", "reason": reason, "retry_in_s": delay})]
        return self._open(now, members, reason=reason)

    def _all_finished(self, cur: _Generation) -> bool:
        """Every member finished and nobody else is expected (a restart)."""
        return self.leaving >= set(cur.members) and self.expected <= set(cur.members)

    def _end(self, now: float) -> list[Command]:
        """Every member finished, after their last round: let them go, or hold
        them (``hold_at_end``) until the other groups finished too."""
        cur = self.current
        assert cur is not None
        if not self.hold_at_end:
            return self._let_go(now)
        self.phase = GroupPhase.HOLDING
        self.final_round, self.final_exchanged = self.round - 1, False
        self._noted_wait_at = now
        return []

    def _let_go(self, now: float) -> list[Command]:
        """Every member finished: release them together after the last round."""
        cur = self.current
        assert cur is not None
        last = self.round - 1
        out: list[Command] = [SendTo(m, RnaLeft(round=last)) for m in cur.members]
        self.expected -= set(cur.members)
        self.leaving -= set(cur.members)
        self.current = None
        self.phase = GroupPhase.WAITING
        out.append(Note("rna_group", {"phase": "finished", "gen": cur.gen, "round": last}))
        return out + self._maybe_open(now)

    def _open(
        self,
        now: float,
        members: list[int],
        *,
        missing: list[int] | None = None,
        reason: str = "start",
    ) -> list[Command]:
        formed = self._last_formed
        # A rank that joined since is a new process (a restart), even if its
        # rank was in the last group: its model is not the group's.
        survivors = [
            m
            for m in members
            if formed is not None and m in formed.members and m not in self.joined
        ]
        # The members take the state of whichever of them holds the most rounds
        # (a round in flight when a member died may have ended on some only,
        # which only they know); the source named here wins among equals.
        if survivors:
            source = survivors[0]  # holds the group's model (maybe a round behind)
        else:
            source = max(members, key=lambda m: (self.joined.get(m, 0), -m))
        gen = next(self._gens)
        # The store goes on a survivor too, when there is one: a newcomer's
        # host may be the one that just failed.
        store = source
        self.current = _Generation(
            gen=gen,
            members=members,
            store_rank=store,
            source_rank=source,
            deadline=now + self.group_timeout_s,
        )
        self.phase = GroupPhase.OPENING
        note = Note(
            "rna_group",
            {
                "phase": "opening",
                "gen": gen,
                "members": members,
                "source": source,
                "reason": reason,
                **({"missing": missing} if missing else {}),
            },
        )
        return [note, SendTo(store, RnaOpenStore(gen=gen))]

    def _open_round(self, now: float) -> list[Command]:
        self._probed.clear()
        self._opened_at = now
        self._noted_wait_at = now
        return self._probe(now, self._pick(exclude=set()))

    def _pick(self, *, exclude: set[int]) -> list[int]:
        cur = self.current
        if cur is None:
            return []
        pool = [m for m in cur.members if m not in exclude and m not in self.leaving]
        return self._rng.sample(pool, min(self.probes, len(pool)))

    def _probe(self, now: float, ranks: list[int]) -> list[Command]:
        cur = self.current
        self._widened_at = now
        if cur is None or not ranks:
            return []
        for rank in ranks:
            self._probed[rank] = now
        msg = RnaProbe(gen=cur.gen, round=self.round)
        return [SendTo(rank, msg) for rank in ranks]

    def _start(
        self,
        initiator: int,
        now: float,
        *,
        exchange: bool = False,
        final: bool = False,
        timed: bool = True,
    ) -> list[Command]:
        """Round ``self.round`` starts, ``initiator`` first. It exchanges with the
        parameter server when asked (``exchange``) or when ``exchange_every``
        rounds ran since the last one; ``final``: the group's last exchange
        before it holds. ``timed``: its probes' response counts (not for the
        rounds a group ends with)."""
        cur = self.current
        assert cur is not None
        response = now - self._opened_at
        if timed:
            self._responses.append(response)
        self.rounds_started += 1
        if self.exchange_every > 0:
            self._rounds_to_exchange -= 1
            if exchange or self._rounds_to_exchange <= 0:
                exchange, self._rounds_to_exchange = True, self.exchange_every
        if exchange:
            self._final_initiator = initiator
        msg = RnaStart(
            gen=cur.gen, round=self.round, initiator=initiator, exchange=exchange, final=final
        )
        out: list[Command] = [SendTo(member, msg) for member in cur.members]
        if now - self._sampled_at >= self.sample_every_s:
            self._sampled_at = now
            out.append(
                Note(
                    "rna_round",
                    {
                        "round": self.round,
                        "gen": cur.gen,
                        "initiator": initiator,
                        "probed": sorted(self._probed),
                        "response_s": round(response, 6),
                        "late_answers": self.late_answers,
                    },
                )
            )
        self.round += 1
        return out
