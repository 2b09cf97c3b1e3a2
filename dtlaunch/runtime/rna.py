"""``dtlaunch.rna.Trainer``: RNA's non-blocking allreduce in a training script (RNA §3).

::

    job = dtlaunch.init(dataset_size=..., shard_size=...)
    rna = dtlaunch.rna.Trainer(model, optimizer)
    for idx in job.bsp_batches():   # under rna: job.batches(); a batch may be empty otherwise
        if idx:
            loss = loss_fn(model(x[idx]), y[idx]); loss.backward()
        rna.step()      # hands the gradient over, applies the newest global update
        job.step()
    rna.close()         # (also at exit) the last gradient is used, the model is final

The loop is ``job.bsp_batches()`` so that the same script also runs as a
synchronous job: there a worker with no data at the moment trains an empty
batch and still joins the step, and all stop together (a plain ``batches()``
loop would leave the others waiting in a collective at the end of the data).
Under ``--policy rna`` nobody waits for anybody, and ``bsp_batches()`` is
``batches()``: a batch is never empty.

What ``step()`` does depends on how the script runs:

- ``dtlaunch run --policy rna``: RNA. The gradient goes to this process's
  communication thread and ``step()`` returns at once; the model is replaced by
  the newest global model the rounds produced. The thread owns a gloo group of
  its own (not ``torch.distributed``'s default group: do not call
  ``init_process_group`` for it) and joins every round the supervisor starts,
  with what it has: the staleness-weighted mean of the gradients handed over
  since the last round (§3.3), or nothing (weight 0). The round's result is
  ``sum(w_i g_i) / sum(w_i)`` over the members, applied with the learning rate
  times ``contributors / world_size`` (§3.3's linear scaling: the optimizer's
  rate is the one for all workers contributing). The thread keeps the global
  model and the optimizer (a copy of yours, built from its class, its
  parameter groups and its state; your optimizer keeps being the source of the
  hyperparameters, so a learning-rate scheduler on it still works), so every
  member applies every round's update in the same order and all models stay
  equal. A newcomer (a restarted worker) gets the model, the optimizer state
  and the round count from a survivor when the group re-forms. ``close()``
  leaves your model at a moving average of the global model over its last
  updates (``--policy rna:average=0.9``, about the last ten; 0: the last
  model), which smooths the last rounds' noise out of the model you keep.
- ``dtlaunch run --policy rna --servers 1``: hierarchical RNA (§4). The
  supervisor may split the workers into groups by their iteration times; each
  group runs the rounds above among its members (the learning rate scaled by
  the group's size) and every few rounds exchanges its model with the
  parameter server (``rna_exchange``: asynchronous model averaging between
  the groups). At the end every worker takes the server's final model, so all
  end equal, as in one group.
- ``dtlaunch run`` with another policy, or torchrun: a plain synchronous step.
  Gradients are averaged over the workers weighted by their batch's records
  (``allreduce_gradients``), then the optimizer steps. The trainer creates the
  default gloo group if the script did not and broadcasts rank 0's model first.
- ``python script.py``: the optimizer steps on the local gradient.

``step()`` zeroes the gradients afterwards (the global gradient was written into
them), so calling ``optimizer.zero_grad()`` before ``backward()`` is optional.
Buffers (e.g. batch-norm statistics) stay each worker's own. torch is an
optional dependency; only this module of the SDK's RNA side imports it.
"""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import torch
import torch.distributed as dist

from dtlaunch.errors import ConfigError
from dtlaunch.ps.config import ENV_SERVERS as ENV_PS_SERVERS
from dtlaunch.runtime.context import Job, current_job
from dtlaunch.runtime.environ import ENV_RNA
from dtlaunch.runtime.rna_exchange import ServerExchange, job_client_factory
from dtlaunch.runtime.rna_rounds import RoundWorker
from dtlaunch.solvers.rna import MOMENTUM_MODES

__all__ = ["ENV_RNA", "RnaSettings", "Trainer", "parse_rna_env"]

logger = logging.getLogger(__name__)

LEAVE_WAIT_S = 120.0  # close(): how long the supervisor may take to let this worker go
# Trainer(): how long to wait for the first group (every worker starting, the
# supervisor's join grace, forming), and how often to say that it waits.
FIRST_GROUP_WAIT_S = 300.0
FIRST_GROUP_NOTE_S = 30.0


@dataclass(frozen=True, slots=True)
class RnaSettings:
    """What ``DTLAUNCH_RNA`` carries: the staleness bound, whether the
    rounds' optimizer fades an SGD momentum out for stale gradients (``auto``,
    ``solvers.rna.momentum_for_staleness``) or keeps it (``keep``), and the
    weight of the final model's moving average (0: none)."""

    staleness: int
    momentum: str = "keep"
    average: float = 0.0


def parse_rna_env(raw: str | None) -> RnaSettings | None:
    """The settings ``DTLAUNCH_RNA`` carries
    (``staleness=N[,momentum=auto|keep][,average=A]``), or None when RNA is off.
    Without ``momentum`` or ``average`` (a supervisor of an earlier version) the
    momentum is kept and the final model is the last one.

    Raises:
        ConfigError: the variable is malformed.
    """
    if raw is None or not raw.strip():
        return None
    fields = dict(item.partition("=")[::2] for item in raw.split(",") if item.strip())
    try:
        staleness = int(fields.get("staleness", ""))
    except ValueError:
        staleness = -1
    if staleness < 0:
        raise ConfigError(f"{ENV_RNA}={raw!r}: expected staleness=N (N >= 0)")
    momentum = fields.get("momentum", "keep")
    if momentum not in MOMENTUM_MODES:
        raise ConfigError(f"{ENV_RNA}={raw!r}: momentum must be one of {', '.join(MOMENTUM_MODES)}")
    try:
        average = float(fields.get("average", "0"))
    except ValueError:
        average = -1.0
    if not 0 <= average < 1:
        raise ConfigError(f"{ENV_RNA}={raw!r}: average must be a number in [0, 1)")
    return RnaSettings(staleness=staleness, momentum=momentum, average=average)


class Trainer:
    """See the module docstring."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, job: Job | None = None
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._job = job if job is not None else current_job()
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        if not self._params:
            raise ValueError("dtlaunch.rna.Trainer: the optimizer has no parameters")
        dtypes = {p.dtype for p in self._params}
        if len(dtypes) != 1:
            raise ValueError(
                "dtlaunch.rna.Trainer averages one flat gradient per round; the optimizer's "
                f"parameters have several dtypes ({sorted(map(str, dtypes))}): give it "
                "parameters of one dtype"
            )
        self._closed = False
        self._comms: RoundWorker | None = None
        self._seen = 0  # the communication thread's publication last copied in
        self.version = 0  # rounds in this process's model (RNA), or steps taken
        settings = parse_rna_env(os.environ.get(ENV_RNA))
        client = self._job.supervisor_client() if self._job is not None else None
        if settings is not None and client is not None and self._job is not None:
            self.mode = "rna"
            if dist.is_initialized():
                logger.warning(
                    "dtlaunch.rna.Trainer: --policy rna needs no torch.distributed default "
                    "group (its rounds run on a group of their own), and a restarted worker "
                    "cannot rejoin one: remove init_process_group() from the script"
                )
            self._comms = RoundWorker(
                params=self._params,
                optimizer=optimizer,
                inbox=client.rna_inbox,
                send=client.send,
                rank=self._job.rank,
                world_size=self._job.world_size,
                staleness=settings.staleness,
                correct_momentum=settings.momentum == "auto",
                average=settings.average,
                # With --servers: hierarchical RNA's groups exchange through them.
                exchange=(
                    ServerExchange(job_client_factory(self._job))
                    if os.environ.get(ENV_PS_SERVERS)
                    else None
                ),
            )
            self._comms.start()
            self._await_first_group()
        elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
            self.mode = "sync"
            if not dist.is_initialized():
                dist.init_process_group(backend="gloo")
            with torch.no_grad():
                for p in self._params:
                    dist.broadcast(p.data, src=0)
        else:
            self.mode = "local"
        atexit.register(self.close)

    # ------------------------------------------------------------------ API

    def step(self) -> None:
        """Hand this step's gradient over and take the newest global model (RNA),
        or average and apply it (synchronous), or apply it (local). Never waits
        for another worker under RNA."""
        if self._closed:
            raise RuntimeError("dtlaunch.rna.Trainer.step() after close()")
        if self._comms is not None:
            self._comms.hand_over(self.version, self._flat_gradient())
            self._take_newest()
        elif self.mode == "sync":
            self._sync_step()
        else:
            self.optimizer.step()
            self.version += 1
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def rounds(self) -> int:
        """Rounds the group ran that this process's communication thread joined."""
        return self._comms.rounds_joined if self._comms is not None else 0

    def close(self, timeout: float = LEAVE_WAIT_S) -> None:
        """Leave the group: the last gradient handed over goes into one more round,
        then the model takes the newest global update. Waits up to ``timeout``."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        comms = self._comms
        if comms is None:
            return
        if not comms.leave(timeout):
            logger.warning(
                "rna: the supervisor did not let worker %d go within %.0f s; leaving anyway",
                comms.rank,
                timeout,
            )
        self._take_newest(final=True)
        comms.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _await_first_group(self) -> None:
        """Start from the group's model, as DDP starts from rank 0's: until the
        first group forms, gradients would be computed on this worker's own
        initial model (or, for a restarted worker, a fresh one)."""
        comms = self._comms
        assert comms is not None
        waited = 0.0
        while not comms.formed.wait(FIRST_GROUP_NOTE_S):
            waited += FIRST_GROUP_NOTE_S
            if waited >= FIRST_GROUP_WAIT_S:
                logger.warning(
                    "rna: worker %d found no group in %.0f s; training on its own model "
                    "until one forms",
                    comms.rank,
                    waited,
                )
                return
            logger.info(
                "rna: worker %d waits for its group to form (%.0f s; the supervisor waits "
                "for every worker to start)",
                comms.rank,
                waited,
            )
        self._take_newest()

    def _sync_step(self) -> None:
        """The gradients averaged over the workers, weighted by each one's records
        this step (0 for an empty batch of ``job.bsp_batches()``), then the
        optimizer step: the same update on every worker."""
        from dtlaunch.runtime.collective import allreduce_gradients

        # torchrun without dtlaunch's data: the script's batches are equal.
        samples = self._job.samples_in_step if self._job is not None else 1
        comm_s, wait_s = allreduce_gradients(self.model, samples)
        if self._job is not None:
            self._job.record_comm(comm_s)
            self._job.record_wait(wait_s)
        self.optimizer.step()
        self.version += 1

    def _flat_gradient(self) -> torch.Tensor:
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
            for p in self._params
        ]
        return torch.cat(parts).to("cpu", copy=True)

    def _take_newest(self, *, final: bool = False) -> None:
        """Copy the newest global model in (when it moved), or with ``final``
        the model this worker ends with (``RoundWorker.final_model``)."""
        comms = self._comms
        if comms is None:
            return
        with comms.lock:
            if comms.published == self._seen and not final:
                return
            values = comms.final_model() if final else comms.shadow
            with torch.no_grad():
                for param, value in zip(self._params, values, strict=True):
                    param.copy_(value)
            self._seen = comms.published
            self.version = comms.applied
