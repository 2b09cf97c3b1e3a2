"""Re-forming an allreduce group around its survivors (KILL_RESTART, AntDT Table II).

When the Controller replaces a straggling worker, restarting the whole group (as
torchrun does after a failure) would throw away every survivor's progress. Here
only the straggler goes:

1. The supervisor sends ``Regroup(gen, leaving_rank, store_rank)`` to every worker.
2. The workers agree on the step: ``Job.bsp_batches()`` already all-reduces one
   flag per step, and now also the newest generation each worker has heard of;
   the group acts at the first step where all have heard of ``gen`` (so no step
   number has to be guessed ahead of time).
3. The leaving worker flushes its acks and waits to be killed; its unfinished
   shards go back to the queue. The survivors take down their process group;
   ``store_rank`` (the lowest survivor) hosts a fresh ``TCPStore`` and reports its
   port (``RegroupReady``).
4. The supervisor kills the straggler and starts the newcomer with the same rank
   (on a spare host when there is one) with ``MASTER_ADDR``/``MASTER_PORT`` of that
   store and ``TORCHELASTIC_USE_AGENT_STORE=True``, so its plain
   ``dist.init_process_group()`` joins the new group; the survivors hear where
   to meet (``RegroupGo``) and join too.
5. ``store_rank`` broadcasts the attached model and optimizer state, the step
   count and the global batch; the newcomer receives them in ``job.attach()``.

A resize (``dtlaunch scale --workers N``) is the same protocol with
``Regroup(world_size=N, leaving_rank=-1)``: the supervisor sends it once the new
ranks, started under ``dtlaunch.runtime.prewarm``, are warm. A rank from ``N``
up stops reading shards and holds the agreement back (it reports the old
generation) until the shard it reads is trained and acked, taking empty steps
meanwhile; then it leaves as a replaced worker does. Rank 0 hosts the store,
the survivors re-form with ``N`` workers, the newcomers join through their
wrapper with ``DTLAUNCH_JOIN``, and every worker's batch becomes its equal
share of the global batch.

Requirements on the script (checked where possible): the model and optimizer
are registered with ``job.attach()`` right after the process group is created and
before any other collective, gradients are averaged with
``job.allreduce_gradients()`` (not DDP, which holds the old group), and the loop
is ``job.bsp_batches()``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from dtlaunch.errors import ConfigError
from dtlaunch.runtime.store import connect_store
from dtlaunch.wire.messages import Message, Regroup, RegroupGo, RegroupReady

__all__ = ["ENV_JOIN", "ElasticGroup", "JoinInfo", "parse_join"]

logger = logging.getLogger(__name__)

ENV_JOIN = "DTLAUNCH_JOIN"  # "<gen>:<source rank>:<batch size>" for a newcomer
ENV_REGROUP_TIMEOUT = "DTLAUNCH_REGROUP_TIMEOUT"
DEFAULT_REGROUP_TIMEOUT_S = 300.0
PARK_POLL_S = 0.5


class RegroupLink(Protocol):
    """What the group needs from the supervisor connection."""

    def send(self, msg: Message, *, repeat_on_rehello: bool = False) -> None: ...

    def wait_regroup_go(self, gen: int, timeout: float) -> RegroupGo: ...

    def close(self, timeout: float) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinInfo:
    """A newcomer's instructions: which generation it joins, who sends the state."""

    gen: int
    source_rank: int
    batch_size: int  # the local batch size the replaced worker had (0: the default)


def parse_join(raw: str | None) -> JoinInfo | None:
    """``DTLAUNCH_JOIN`` as set by the supervisor, or None for a normal start.

    Raises:
        ConfigError: the variable is malformed.
    """
    if not raw:
        return None
    try:
        gen_text, source_text, batch_text = raw.split(":")
        info = JoinInfo(gen=int(gen_text), source_rank=int(source_text), batch_size=int(batch_text))
    except ValueError:
        raise ConfigError(
            f"{ENV_JOIN}={raw!r} is not <generation>:<source rank>:<batch size>; it is set by "
            "dtlaunch"
            " for a worker that replaces another, never by hand"
        ) from None
    if info.gen < 1 or info.source_rank < 0 or info.batch_size < 0:
        raise ConfigError(f"{ENV_JOIN}={raw!r} is out of range")
    return info


def _timeout() -> float:
    raw = os.environ.get(ENV_REGROUP_TIMEOUT, "")
    try:
        value = float(raw) if raw else DEFAULT_REGROUP_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"{ENV_REGROUP_TIMEOUT}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"{ENV_REGROUP_TIMEOUT}={raw!r} must be more than 0 seconds")
    return value


class ElasticGroup:
    """One worker's side of regrouping: what to hand a newcomer, and the protocol."""

    def __init__(self, *, rank: int, world_size: int, link: RegroupLink) -> None:
        self._rank = rank
        self._world_size = world_size
        self._link = link
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self.gen = 0  # the generation this worker's process group belongs to
        self._heard: Regroup | None = None  # newest Regroup not acted on yet
        self._store: TCPStore | None = None  # kept alive while we host it

    @property
    def attached(self) -> bool:
        return self._model is not None

    @property
    def heard_gen(self) -> int:
        return self._heard.gen if self._heard is not None else self.gen

    @property
    def world_size(self) -> int:
        """The size of the group this worker belongs to (a resize changes it)."""
        return self._world_size

    @property
    def removed(self) -> bool:
        """The regroup heard (not carried out yet) is a resize without this rank:
        the worker finishes the shard it reads, then leaves at the agreed step."""
        msg = self._heard
        return msg is not None and msg.world_size > 0 and self._rank >= msg.world_size

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._model = model
        self._optimizer = optimizer

    def hear(self, msg: Regroup) -> None:
        if msg.gen > self.heard_gen:
            self._heard = msg

    def join(self, info: JoinInfo) -> dict[str, Any]:
        """A newcomer: receive the state from ``info.source_rank``; returns the
        job counters that came with it (``step``, ``global_batch``)."""
        if not dist.is_initialized():
            raise ConfigError(
                "this worker replaces another and must join the running group: call "
                "torch.distributed.init_process_group() before job.attach()"
            )
        self.gen = info.gen
        counters = self._share_state(info.source_rank, {})
        logger.info(
            "rank %d joined generation %d at step %d (state from rank %d)",
            self._rank,
            info.gen,
            counters["step"],
            info.source_rank,
        )
        return counters

    def regroup(self, gen: int, counters: dict[str, Any]) -> dict[str, Any] | None:
        """Carry out generation ``gen`` (agreed by every worker) at this step.

        Returns the shared counters for a survivor; never returns for the
        worker that leaves (it waits to be killed).
        """
        msg = self._heard
        if msg is None or msg.gen != gen:
            raise RuntimeError(f"regroup generation {gen} agreed but never heard here")
        self._heard = None
        if msg.leaves(self._rank):
            self._leave(msg)
        before = self._world_size
        if msg.world_size:
            self._world_size = msg.world_size
        timeout = _timeout()
        backend = dist.get_backend()
        started = time.monotonic()
        dist.destroy_process_group()
        self._store = None
        if self._rank == msg.store_rank:
            store = TCPStore(
                "0.0.0.0",
                0,
                self._world_size,
                is_master=True,
                timeout=timedelta(seconds=timeout),
                wait_for_workers=False,
            )
            self._store = store
            # Sent again to a supervisor resumed meanwhile, which else could not
            # tell the others where to meet.
            self._link.send(
                RegroupReady(gen=gen, step=int(counters["step"]), store_port=store.port),
                repeat_on_rehello=True,
            )
            self._link.wait_regroup_go(gen, timeout)
        else:
            go = self._link.wait_regroup_go(gen, timeout)
            store = connect_store(
                go.master_addr, go.master_port, timeout, world_size=self._world_size
            )
        dist.init_process_group(
            backend,
            store=PrefixStore("default_pg", store),
            rank=self._rank,
            world_size=self._world_size,
            timeout=timedelta(seconds=timeout),
        )
        self.gen = gen
        shared = self._share_state(msg.store_rank, counters)
        change = (
            f"{before} -> {self._world_size} workers"
            if msg.world_size
            else f"rank(s) {sorted({msg.leaving_rank, *msg.replaced})} replaced"
        )
        logger.info(
            "rank %d re-formed the group (generation %d, %s) in %.2fs",
            self._rank,
            gen,
            change,
            time.monotonic() - started,
        )
        return shared

    def _leave(self, msg: Regroup) -> None:
        """This worker is replaced, or a scale-down removed it: finish its acks,
        then wait for the kill (the script's code after its loop would call
        collectives of a group that has gone on without it)."""
        logger.info(
            "rank %d %s (generation %d); waiting to be stopped",
            self._rank,
            "leaves the job" if msg.world_size else "is replaced",
            msg.gen,
        )
        self._link.close(10.0)
        deadline = time.monotonic() + _timeout()
        while time.monotonic() < deadline:
            time.sleep(PARK_POLL_S)
        raise RuntimeError(
            f"rank {self._rank} was to be replaced (regroup generation {msg.gen}) but the "
            "supervisor never stopped it"
        )

    def _share_state(self, source: int, counters: dict[str, Any]) -> dict[str, Any]:
        """Broadcast model tensors in place and the optimizer state + counters."""
        if self._model is None:
            raise ConfigError(
                "a regroup needs the model: call job.attach(model, optimizer) after "
                "creating them (before the training loop)"
            )
        with torch.no_grad():
            for tensor in self._model.state_dict().values():
                dist.broadcast(tensor, src=source)
        sent = self._rank == source
        payload: list[Any] = [
            {
                "optimizer": self._optimizer.state_dict() if self._optimizer else None,
                **counters,
            }
            if sent
            else None
        ]
        dist.broadcast_object_list(payload, src=source)
        received: dict[str, Any] = payload[0]
        if not sent and self._optimizer is not None and received["optimizer"] is not None:
            self._optimizer.load_state_dict(received["optimizer"])
        return {k: v for k, v in received.items() if k != "optimizer"}
