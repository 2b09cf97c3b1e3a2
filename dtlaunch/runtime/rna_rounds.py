"""The communication thread behind ``dtlaunch.rna.Trainer`` (RNA §3.3, Fig. 4).

``RoundWorker`` owns this worker's side of RNA's protocol with the supervisor's
round coordinator (``dtlaunch.wire.messages.rna``): it hosts a generation's
store when asked, forms the gloo group (its own, not torch.distributed's
default group), takes the model state from the generation's source, answers
probes when a gradient is ready, and joins every round with the
staleness-weighted mean of the gradients handed over since the last one
(``local_contribution``) or nothing. It owns the global model (``shadow``) and
an optimizer for it; the training thread copies the newest model in under
``lock``. One round at a time: it reads its messages in order, so a new
group's message is handled after the round in flight.

A round in flight when a member dies can end on some members and fail on
others (a member that received every contribution completes it; one whose
send to the dead peer failed, or that waited on it, does not). So a new
group does not take the state of the source the coordinator named blindly:
its members first tell each other how many rounds their models hold, and the
most advanced one broadcasts (the named source among equals;
``state_source``). A member's model never goes back to fewer rounds, and
equal round counts stay equal models. The gradients a member put into a round
that failed on it are kept aside until then: the state taken says whether that
round ran in the same generation, with them in it (then they are dropped,
else they go back to the pending ones).

Under hierarchical RNA (§4) a group's ``RnaGroup`` names its size in the
partition: its rounds scale the learning rate by that size, not the job's, and
some of its rounds end with an exchange with the parameter server
(``rna_exchange``): the initiator pushes the group's progress since its last
exchange and pulls the server's model, then broadcasts it (with whether the
exchange worked) to the group, whose members take it as model and as the base
of the next exchange. The base and the count of exchanges travel with the
state a new group takes.

With ``average`` the thread also keeps an exponential moving average of the
global model over its updates (``final_model``: what the worker ends with; its
decay warms up over the first updates, ``solvers.rna.average_decay``),
which travels with the state like the model; a group's last exchange before it
holds (``RnaStart.final``) pushes that average instead of the model.

A group is formed once every member is at its store (``rna_meeting``). Until
then the thread keeps reading its messages (set aside, handled afterwards in
order): a newer generation's (the coordinator gave up on this one) ends the
wait at once instead of after ``timeout_s``; a group whose successor is
already waiting when it is read gets only a short visit to its store, which
may be gone.
"""

from __future__ import annotations

import datetime
import io
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from dtlaunch.errors import ConfigError
from dtlaunch.runtime.rna_exchange import ServerExchange
from dtlaunch.runtime.rna_meeting import STOP, Inbox, meet
from dtlaunch.runtime.rna_pending import PendingGradients, local_contribution, state_source
from dtlaunch.solvers.rna import average_decay, lr_factor, momentum_for_staleness
from dtlaunch.wire.messages import (
    RnaExchanged,
    RnaFailed,
    RnaFormed,
    RnaGroup,
    RnaJoin,
    RnaLeave,
    RnaLeft,
    RnaOpenStore,
    RnaProbe,
    RnaReady,
    RnaRoundRecord,
    RnaRounds,
    RnaStart,
    RnaStoreReady,
)

__all__ = ["RoundWorker"]

logger = logging.getLogger(__name__)

REPORT_EVERY_S = 1.0  # the group's first member reports its rounds this often
SAMPLE_EVERY_S = 0.5  # and one round in full at most this often
IDLE_POLL_S = 0.5
WAKE = object()  # the training thread handed a gradient over


class RoundWorker(threading.Thread):
    """The communication thread: RNA's groups and rounds (module docstring).

    It owns the global model (``shadow``) and its optimizer; the training
    thread reads ``shadow`` under ``lock`` when ``published`` moved.
    """

    def __init__(
        self,
        *,
        params: list[torch.Tensor],
        optimizer: torch.optim.Optimizer,
        inbox: queue.Queue[object],
        send: Callable[..., None],
        rank: int,
        world_size: int,
        staleness: int,
        correct_momentum: bool = False,
        average: float = 0.0,
        exchange: ServerExchange | None = None,
    ) -> None:
        super().__init__(name=f"dtlaunch-rna-{rank}", daemon=True)
        self.rank = rank
        self.world_size = world_size
        self.staleness = staleness
        self.correct_momentum = correct_momentum
        # The model the worker ends with: an exponential moving average of the
        # global model over its updates, this weight on the older ones (0: the
        # last update's model). Travels with the state, as the model does.
        self.average = average
        self._averaged: list[torch.Tensor] | None = None
        self._average_updates = 0  # in _averaged: its decay warms up over them
        self.lock = threading.Lock()
        self.shadow = [p.detach().to("cpu", copy=True) for p in params]
        self._user_optimizer = optimizer
        self._optimizer = _shadow_optimizer(optimizer, params, self.shadow)
        self._incoming = inbox
        self._send = send
        self._pending = PendingGradients()
        self.applied = 0  # rounds in the shadow model
        self.published = 0  # bumped whenever the shadow model changed
        self.rounds_joined = 0
        # round -> the generation it ran in, for the last rounds of the model
        # (travels with the state: did a round that failed here run elsewhere?)
        self._lineage: dict[int, int] = {}
        # (gen, round, gradients) of the round that failed here, until a group forms
        self._unsettled: tuple[int, int, list[tuple[int, torch.Tensor, int]]] | None = None
        self._group: Any = None  # a ProcessGroupGloo (its stubs lack the collectives)
        self._gen = 0
        self._members: list[int] = []
        self._store_server: TCPStore | None = None  # the store this worker hosts
        self._store_gen = 0
        self._probe: tuple[int, int, float] | None = None  # (gen, round, when heard)
        self._left = threading.Event()
        self.formed = threading.Event()  # a group formed: the shadow is the group's model
        self._finished = False  # leave() was called
        self._stopped = threading.Event()
        self._inbox = Inbox(inbox, self._stopped)
        self._rounds_since_report = 0
        self._contributions: list[int] = []
        self._sampled: list[RnaRoundRecord] = []
        self._reported_at = time.monotonic()
        self._sampled_at = 0.0
        # Hierarchical RNA: the group's size in the partition (0: one group of
        # all), the model of its last exchange, and the exchanges in the model
        self._exchange = exchange
        self._group_size = 0
        self._base: list[torch.Tensor] | None = None
        self.exchanges = 0

    # --------------------------------------------------- training thread side

    def hand_over(self, version: int, gradient: torch.Tensor) -> None:
        with self.lock:
            self._pending.add(version, gradient)
            self._pending.prune(current=self.applied, bound=self.staleness)
        self._incoming.put(WAKE)

    def leave(self, timeout: float) -> bool:
        self._finished = True
        self._send(RnaLeave(applied=self.applied))
        return self._left.wait(timeout)

    def stop(self) -> None:
        self._stopped.set()
        self._incoming.put(STOP)
        self.join(timeout=5.0)

    # ------------------------------------------------------------ the thread

    def run(self) -> None:
        # Sticky: a supervisor resumed after a crash has no groups; it hears every
        # worker's join again (after its Rehello) and forms one from them.
        self._send(RnaJoin(applied=self.applied), repeat_on_rehello=True)
        while not self._stopped.is_set():
            try:
                item = self._inbox.next(timeout=IDLE_POLL_S)
            except queue.Empty:
                self._maybe_report()
                continue
            if item is STOP:
                break
            try:
                self._handle(item)
            except Exception:  # a bug here must not end the thread silently
                logger.exception("rna: handling %r failed", item)
            self._maybe_report()
        if self._exchange is not None:
            self._exchange.close()  # its sockets are this thread's

    def _handle(self, item: object) -> None:
        if item is WAKE:
            self._answer_probe()
        elif isinstance(item, RnaProbe):
            if item.gen == self._gen and self._group is not None:
                self._probe = (item.gen, item.round, time.monotonic())
                self._answer_probe()
        elif isinstance(item, RnaStart):
            if item.gen == self._gen and self._group is not None:
                self._run_round(item)
        elif isinstance(item, RnaOpenStore):
            self._open_store(item.gen)
        elif isinstance(item, RnaGroup):
            self._form(item)
        elif isinstance(item, RnaLeft):
            self._maybe_report(force=True)
            self._left.set()

    def _answer_probe(self) -> None:
        probe = self._probe
        if probe is None:
            return
        with self.lock:
            ready = bool(self._pending)
        if not ready:
            return
        gen, round_, heard = probe
        self._probe = None
        self._send(RnaReady(gen=gen, round=round_, waited_s=round(time.monotonic() - heard, 6)))

    def _ask_back_in(self) -> None:
        """Without a group, ask for one: the failure may belong to a group the
        coordinator gave up on already (it timed out waiting while this thread was
        blocked in a collective, or it was a crashed supervisor's)."""
        self._send(RnaJoin(applied=self.applied, finished=self._finished))

    def _open_store(self, gen: int) -> None:
        try:
            self._store_server = TCPStore(
                "0.0.0.0",
                0,
                None,
                True,
                timeout=datetime.timedelta(seconds=60),
                wait_for_workers=False,
            )
        except Exception as err:
            self._send(RnaFailed(gen=gen, round=-1, error=f"opening the store: {err}"))
            return
        self._store_gen = gen
        self._send(RnaStoreReady(gen=gen, port=self._store_server.port))

    def _form(self, msg: RnaGroup) -> None:
        """Leave the old group, form ``msg.gen``, take the state of its most
        advanced member (``_sync_state``)."""
        if msg.gen < self._gen:
            return  # older than the group this worker is in (or went on to): stale
        self._group = None
        self._probe = None
        self._gen = msg.gen
        self._members = list(msg.members)
        self._group_size = msg.group_size
        if self.rank not in msg.members:
            return
        timeout = datetime.timedelta(seconds=msg.timeout_s)
        hosted = self._store_server if self._store_gen == msg.gen else None
        try:
            store = meet(msg, self.rank, self._inbox, hosted)
            if store is None:
                logger.warning("rna: group %d was given up for a newer one as it formed", msg.gen)
                return  # the newer generation's message is next
            group = dist.ProcessGroupGloo(
                PrefixStore(f"rna/{msg.gen}", store),
                msg.members.index(self.rank),
                len(msg.members),
                timeout,
            )
            self._sync_state(group, msg.members.index(msg.source_rank), msg.gen)
        except Exception as err:
            logger.warning("rna: forming group %d failed: %s", msg.gen, err)
            self._send(RnaFailed(gen=msg.gen, round=-1, error=str(err)[:500]))
            self._ask_back_in()
            return
        self._group = group
        self._contributions = [0] * len(msg.members)
        self.formed.set()
        self._send(RnaFormed(gen=msg.gen, applied=self.applied))

    def _sync_state(self, group: Any, named_index: int, gen: int) -> None:
        """The most advanced member's model, optimizer state, round count and
        lineage, to every member (module docstring); ``named_index``: the
        coordinator's source, which wins among equals."""
        index = self._members.index(self.rank)
        counts = torch.zeros((len(self._members), 2), dtype=torch.int64)
        counts[index, 0], counts[index, 1] = self.applied, self.exchanges
        group.allreduce([counts]).wait()
        ranked = [(int(a), int(e)) for a, e in counts.tolist()]
        source_index = state_source(ranked, named_index)
        if source_index != named_index:
            logger.warning(
                "rna: group %d takes the state of worker %d (%d rounds), the most advanced, "
                "not worker %d's (%d)",
                gen,
                self._members[source_index],
                ranked[source_index][0],
                self._members[named_index],
                ranked[named_index][0],
            )
        is_source = index == source_index
        payload = torch.zeros(0, dtype=torch.uint8)
        if is_source:
            buffer = io.BytesIO()
            with self.lock:
                torch.save(
                    {
                        "params": self.shadow,
                        "optimizer": self._optimizer.state_dict(),
                        "applied": self.applied,
                        "lineage": self._lineage,
                        # hierarchical RNA: the model of the last exchange
                        "base": self._base if self._base is not None else [],
                        "exchanges": self.exchanges,
                        "averaged": self._averaged if self._averaged is not None else [],
                        "average_updates": self._average_updates,
                    },
                    buffer,
                )
            payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        group.broadcast(size, source_index).wait()
        if not is_source:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        group.broadcast(payload, source_index).wait()
        if not is_source:
            state = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)
            with self.lock:
                with torch.no_grad():
                    for shadow, value in zip(self.shadow, state["params"], strict=True):
                        shadow.copy_(value)
                self._optimizer.load_state_dict(state["optimizer"])
                self.applied = int(state["applied"])
                self._lineage = {int(r): int(g) for r, g in state["lineage"].items()}
                self._base = [t.clone() for t in state["base"]] or None
                self.exchanges = int(state["exchanges"])
                self._averaged = [t.clone() for t in state["averaged"]] or None
                self._average_updates = int(state["average_updates"])
                self.published += 1
        if self._averaged is None and self.average > 0:
            self._averaged = [t.detach().clone() for t in self.shadow]  # no update yet
        if self._base is None and self._exchange is not None:
            self._base = [t.clone() for t in self.shadow]  # no exchange yet
        self._settle()

    def _settle(self) -> None:
        """The gradients of the round that failed here: in the model now if that
        round ran (in the generation it failed in: with them), else pending again."""
        unsettled, self._unsettled = self._unsettled, None
        if unsettled is None:
            return
        gen, round_, taken = unsettled
        if self._lineage.get(round_) == gen:
            return
        with self.lock:
            self._pending.put_back(taken)
            self._pending.prune(current=self.applied, bound=self.staleness)

    def _set_aside(self, gen: int, round_: int, taken: list[tuple[int, torch.Tensor, int]]) -> None:
        """Hold the failed round's gradients until a group says whether it ran."""
        if self._unsettled is not None:  # not expected: no round runs between
            with self.lock:
                self._pending.put_back(self._unsettled[2])
        self._unsettled = (gen, round_, taken)

    def _run_round(self, start: RnaStart) -> None:
        group = self._group
        assert group is not None
        if self._probe is not None and self._probe[1] <= start.round:
            self._probe = None  # that round started; a late answer would be ignored anyway
        with self.lock:
            taken = self._pending.take()
        mine = local_contribution(taken, current=start.round, bound=self.staleness)
        members = len(self._members)
        size = self.shadow_size()
        buffer = torch.zeros(size + 2 * members, dtype=self.shadow[0].dtype)
        index = self._members.index(self.rank)
        if mine.gradient is not None:
            buffer[:size] = mine.gradient
            buffer[size + index] = 1.0
            buffer[size + members + index] = float(mine.staleness)
        began = time.monotonic()
        try:
            group.allreduce([buffer]).wait()
        except Exception as err:
            # Not lost: the next group uses them, unless the round ran elsewhere.
            self._set_aside(self._gen, start.round, taken)
            self._group = None
            logger.warning("rna: round %d of group %d failed: %s", start.round, self._gen, err)
            self._send(RnaFailed(gen=self._gen, round=start.round, error=str(err)[:500]))
            self._ask_back_in()
            return
        comm_s = time.monotonic() - began
        weights = buffer[size : size + members]
        contributors = float(weights.sum().item())
        staleness = buffer[size + members :]
        with self.lock:
            if contributors > 0:
                # Every member sums the same buffer: the same mean, the same step.
                mean_staleness = float((weights * staleness).sum().item()) / contributors
                self._apply(
                    buffer[:size] / contributors,
                    lr_factor(contributors, self._group_size or self.world_size),
                    mean_staleness,
                )
            self.applied = start.round + 1
            self.published += 1
        self._lineage[start.round] = self._gen
        for old in [r for r in self._lineage if r < self.applied - self.staleness - 2]:
            del self._lineage[old]
        self.rounds_joined += 1
        self._note_round(start, weights, staleness, comm_s)
        if start.exchange:
            self._exchange_round(group, start)

    def _exchange_round(self, group: Any, start: RnaStart) -> None:
        """Hierarchical RNA: the initiator exchanges the group's model with the
        parameter server and broadcasts the outcome (module docstring)."""
        source = self._members.index(start.initiator)
        size = self.shadow_size()
        buffer = torch.zeros(size + 1, dtype=self.shadow[0].dtype)  # [worked, model...]
        if self.rank == start.initiator:
            began, error = time.monotonic(), ""
            try:
                if self._exchange is None:
                    raise ConfigError("this worker has no parameter server to exchange with")
                assert self._base is not None  # set when the group formed
                weight = self._group_size / self.world_size if self._group_size else 1.0
                # The group's last exchange pushes the average of its updates:
                # the server's final model, which every worker ends with, is
                # smoothed as a single group's is (``final_model``). This
                # thread is the only writer of both: it reads them unlocked.
                averaged = self._averaged
                pushed = averaged if start.final and averaged is not None else self.shadow
                buffer[1:] = self._exchange.push_pull(pushed, self._base, weight)
                buffer[0] = 1.0
            except Exception as err:
                error = f"{type(err).__name__}: {err}"[:500]
                logger.warning("rna: exchange after round %d failed: %s", start.round, error)
            self._send(
                RnaExchanged(
                    gen=self._gen,
                    round=start.round,
                    seconds=round(time.monotonic() - began, 6),
                    ok=not error,
                    error=error,
                )
            )
        try:
            group.broadcast(buffer, source).wait()
        except Exception as err:
            self._group = None
            logger.warning("rna: exchange of group %d failed: %s", self._gen, err)
            self._send(RnaFailed(gen=self._gen, round=start.round, error=str(err)[:500]))
            self._ask_back_in()
            return
        if buffer[0] == 0:
            return  # the exchange failed: the group keeps its model and its base
        with self.lock:
            offset = 1
            with torch.no_grad():
                for shadow in self.shadow:
                    shadow.copy_(buffer[offset : offset + shadow.numel()].view_as(shadow))
                    offset += shadow.numel()
            self._base = [t.clone() for t in self.shadow]
            self.exchanges += 1
            self.published += 1

    def shadow_size(self) -> int:
        return sum(p.numel() for p in self.shadow)

    def final_model(self) -> list[torch.Tensor]:
        """The model this worker ends with (call under ``lock``): the average of
        the global model's updates, or, once its group exchanged with a
        parameter server (whose final model every worker takes), the global
        model."""
        if self._averaged is None or self.exchanges:
            return self.shadow
        return self._averaged

    def _apply(self, mean: torch.Tensor, factor: float, staleness: float) -> None:
        """One optimizer step on the global model with the round's mean gradient,
        whose contributions were ``staleness`` rounds old on average: with
        ``correct_momentum`` an SGD momentum fades out as that staleness nears a
        round, at the same step (``solvers.rna.momentum_for_staleness``)."""
        offset = 0
        for shadow in self.shadow:
            count = shadow.numel()
            shadow.grad = mean[offset : offset + count].view_as(shadow).clone()
            offset += count
        for mine, users in zip(
            self._optimizer.param_groups, self._user_optimizer.param_groups, strict=True
        ):
            for key, value in users.items():
                if key != "params":
                    mine[key] = value
            mine["lr"] = users["lr"] * factor
            if self.correct_momentum and isinstance(self._optimizer, torch.optim.SGD):
                mine["momentum"], rate = momentum_for_staleness(
                    users["momentum"], staleness, dampening=users.get("dampening", 0.0)
                )
                mine["lr"] *= rate
        self._optimizer.step()
        if self._averaged is not None:
            decay = average_decay(self.average, self._average_updates)
            self._average_updates += 1
            with torch.no_grad():
                for averaged, shadow in zip(self._averaged, self.shadow, strict=True):
                    averaged.mul_(decay).add_(shadow, alpha=1.0 - decay)

    def _note_round(
        self, start: RnaStart, weights: torch.Tensor, staleness: torch.Tensor, comm_s: float
    ) -> None:
        if self._members.index(self.rank) != 0:
            return  # the group's first member reports for all
        contributed = [i for i, w in enumerate(weights.tolist()) if w > 0]
        for i in contributed:
            self._contributions[i] += 1
        self._rounds_since_report += 1
        now = time.monotonic()
        if now - self._sampled_at >= SAMPLE_EVERY_S:
            self._sampled_at = now
            stale = staleness.tolist()
            self._sampled.append(
                RnaRoundRecord(
                    round=start.round,
                    initiator=start.initiator,
                    contributors=[self._members[i] for i in contributed],
                    staleness=[int(stale[i]) for i in contributed],
                    comm_s=round(comm_s, 6),
                )
            )

    def _maybe_report(self, *, force: bool = False) -> None:
        if not self._rounds_since_report:
            return
        now = time.monotonic()
        if now - self._reported_at < REPORT_EVERY_S and not force:
            return
        self._reported_at = now
        self._send(
            RnaRounds(
                gen=self._gen,
                members=list(self._members),
                rounds=self._rounds_since_report,
                contributions=list(self._contributions),
                sampled=self._sampled,
            )
        )
        self._rounds_since_report = 0
        self._contributions = [0] * len(self._members)
        self._sampled = []


def _shadow_optimizer(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], shadow: list[torch.Tensor]
) -> torch.optim.Optimizer:
    """An optimizer of ``optimizer``'s class over ``shadow``, with its groups and state."""
    by_id = {id(p): s for p, s in zip(params, shadow, strict=True)}
    groups = [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [by_id[id(p)] for p in group["params"]],
        }
        for group in optimizer.param_groups
    ]
    try:
        copy = type(optimizer)(groups, **optimizer.defaults)
    except Exception as err:
        raise ConfigError(
            f"dtlaunch.rna.Trainer: cannot build a {type(optimizer).__name__} for the global "
            f"model from its defaults ({err}); use a torch.optim optimizer"
        ) from err
    copy.load_state_dict(optimizer.state_dict())  # momentum etc., if it stepped already
    return copy
