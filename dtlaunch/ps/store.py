"""A server's blocks, optimizer state, version counter and gradient aggregation.

No I/O: the server loop feeds it pushes and membership changes and sends what it
returns. The version counts applied updates; a gradient is pushed with the
version it was computed against (its ``step``).

Consistency modes:

* **BSP** — gradients for the current version accumulate weighted by each
  worker's samples; the update applies once every active worker's gradient is in,
  as ``sum(samples_i * g_i) / sum(samples_i)`` (each worker's mean gradient
  weighted by its batch share B_i/B: the full-batch mean gradient).
* **BACKUP(b)** — BSP that applies with the first ``n - b`` of the ``n`` active
  workers' gradients. A gradient arriving after its step was applied is refused
  (``accepted`` False) and its worker is in the update's ``dropped`` list, so the
  records behind it can go back to the DDS. A step whose gradients so far are
  all empty (0 records: workers out of data) waits for one with records.
* **ASP** — each gradient applies on arrival, whatever version it was computed on.

A push sent again (its answer was lost on a broken connection, and the
client's ping found it neither waiting nor answered) is answered as the first
was and applied once: the store remembers each worker's last step and the
workers the last BSP step applied.

Blocks come and go while the version runs on: a migration or a reassignment's
import adopts them with their optimizer state (``adopt``), its source or a
rolled-back target drops them (``release``). A push must name exactly the
blocks held, except one the store answers without applying: a late push (its
step went on without it) may name the blocks of the placement of its step.

Membership changes re-check the open step, so a step waiting for a worker that
was removed completes at once: a BSP step never waits for a worker that left.

A worker that waits for data (the end of the data set or of an epoch, when the
others hold the last shards) says it is *idle*: steps stop waiting for it, or
they would wait for a push that comes only once the others' steps finish their
shards. When it has data again it is a member from the step it can still join:
the current one if no gradient of it is in yet, else the next (``activate``
returns which; the client pushes zeros for any step between that and the one it
trains on, so the parameters it computes on are the same on every server).

After a restart the store may take a worker's copy of its blocks (``offer``)
when it is newer than what it holds: the parameters jump to that version, the
optimizer state is kept (or initialised), and an open step is dropped, since
every gradient in it was computed on an older version that copy already
includes. ``recovered_at`` is the version of the copy the store holds (a
snapshot's or a worker's): updates before it were applied by an earlier process.
Copies are taken only until the store applies an update of its own (under BSP,
a step cannot complete before every member has offered its copy; under ASP the
first push commits the store to its copy, and each worker sends its last
gradient again if that copy lacks it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from dtlaunch.errors import ConfigError
from dtlaunch.ps.optim import BlockState, OptimizerConfig, apply_update, new_state
from dtlaunch.wire.messages import PsUpdate

__all__ = ["DTYPES", "ParamStore", "PushResult", "torch_dtype"]

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def torch_dtype(name: str) -> torch.dtype:
    """Raises: ConfigError for a dtype the PS does not hold."""
    dtype = DTYPES.get(name)
    if dtype is None:
        raise ConfigError(
            f"parameter dtype {name!r} is not supported by the PS; use one of {', '.join(DTYPES)}"
        )
    return dtype


@dataclass(frozen=True, slots=True)
class PushResult:
    accepted: bool
    update: PsUpdate | None  # set when this push completed a step


class ParamStore:
    """See the module docstring."""

    def __init__(self, *, mode: str = "bsp", workers: Sequence[int] = (), backup: int = 0) -> None:
        if mode not in ("bsp", "asp"):
            raise ConfigError(f"PS mode {mode!r} is not known; use bsp or asp")
        self.mode = mode
        self.params: dict[int, torch.Tensor] = {}
        self.states: dict[int, BlockState] = {}
        self.optimizer: OptimizerConfig | None = None
        self.version = 0
        self.recovered_at = 0  # versions below it were applied by an earlier process
        self.assigned: set[int] = set(workers)  # the supervisor's (or the env's) workers
        self.members: set[int] = set(workers)  # those a BSP step waits for
        self.left: set[int] = set()  # workers that said they leave: never members again
        self.idle: set[int] = set()  # workers waiting for data: steps go on without them
        self._joining: dict[int, int] = {}  # worker -> the step from which it is a member
        self.backup = backup
        self._acc: dict[int, torch.Tensor] = {}
        self._contrib: dict[int, int] = {}  # worker -> samples, for the open step
        self._last_applied: tuple[int, frozenset[int]] = (-1, frozenset())  # BSP: step, workers
        # worker -> (step, blocks) of its last ASP push: one sent again is not applied
        # twice, and a push of other blocks at the same step (blocks a reassignment
        # moved here, sent on) is another push.
        self._asp_last: dict[int, tuple[int, frozenset[int]]] = {}
        # Copy-on-write guard: blocks some send may still read (see ``before_write``).
        self.in_flight: dict[int, list[object]] = {}

    # ---------------------------------------------------------------- blocks

    @property
    def seeded(self) -> bool:
        return self.optimizer is not None

    def seed(
        self, optimizer: OptimizerConfig, blocks: Mapping[int, torch.Tensor], version: int = 0
    ) -> None:
        """Take initial parameters (copies them: the frames they come in are reused).

        ``version`` is above 0 when a worker re-seeds a restarted server that had
        no snapshot with its last pull.
        """
        self.optimizer = optimizer.validate()
        for block_id, value in blocks.items():
            param = value.clone()
            self.params[block_id] = param
            self.states[block_id] = new_state(optimizer, param)
        self.version = self.recovered_at = version

    def offer(self, version: int, blocks: Mapping[int, torch.Tensor]) -> bool:
        """Take a worker's copy of the blocks if it is newer than the store's.

        Copies the tensors; keeps each block's optimizer state (initialises it
        for a block without one); drops the open step. Returns whether it took it
        (not once the store applied an update of its own: see the module docstring).

        Raises:
            ConfigError: not seeded, or blocks that do not match this server's.
        """
        if self.optimizer is None:
            raise ConfigError("this server is not seeded yet; seed it before offering a copy")
        if version <= self.version or self.version != self.recovered_at:
            return False
        if set(blocks) != set(self.params):
            raise ConfigError(
                f"the offered copy has blocks {sorted(blocks)}, this server holds "
                f"{sorted(self.params)}; the worker's placement is stale"
            )
        for block_id, value in blocks.items():
            # A fresh tensor: sends in flight keep reading the old one.
            self.params[block_id] = value.clone()
            self.in_flight.pop(block_id, None)
            if block_id not in self.states:
                self.states[block_id] = new_state(self.optimizer, self.params[block_id])
        self._acc.clear()
        self._contrib = {}
        self._last_applied = (-1, frozenset())
        self.version = self.recovered_at = version
        return True

    def adopt(
        self,
        optimizer: OptimizerConfig,
        version: int,
        blocks: Mapping[int, tuple[torch.Tensor, BlockState]],
    ) -> None:
        """Take migrated (or restored) blocks with their optimizer state.

        Raises:
            ConfigError: the optimizer differs from the one this server runs.
        """
        if self.optimizer is not None and self.optimizer != optimizer:
            raise ConfigError(f"migrated blocks use {optimizer}, this server runs {self.optimizer}")
        self.optimizer = optimizer.validate()
        if not self.params and version != self.version:
            # Nothing of its own to keep in step with: the blocks' version, and no
            # open step of the version it leaves.
            self.version = self.recovered_at = version
            self._contrib = {}
            self._last_applied = (-1, frozenset())
        for block_id, (param, state) in blocks.items():
            self.params[block_id] = param
            self.states[block_id] = state
            self._acc.pop(block_id, None)
        self.version = max(self.version, version)
        self.recovered_at = max(self.recovered_at, version)

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop these blocks and their optimizer state (those not held are ignored)."""
        for block_id in block_ids:
            self.params.pop(block_id, None)
            self.states.pop(block_id, None)
            self._acc.pop(block_id, None)
            self.in_flight.pop(block_id, None)

    @property
    def step_open(self) -> bool:
        """Gradients for the current version are waiting (BSP)."""
        return bool(self._contrib)

    def counts(self, worker: int) -> bool:
        """Whether this server's steps count ``worker`` (ASP: every worker; BSP: an
        assigned one). An unassigned worker's push joins a step only if it comes
        before the step applies, and is dropped after: its records are read again."""
        return self.mode == "asp" or worker in self.assigned

    def waiting_for(self) -> list[int]:
        """BSP: the members whose push the coming step still lacks (ASP: none)."""
        if self.mode != "bsp":
            return []
        return sorted(self.members - set(self._contrib))

    @property
    def open_samples(self) -> int:
        """Records behind the gradients waiting in the open step (0: none, or
        only empty pushes, which change nothing when the step applies)."""
        return sum(self._contrib.values())

    def before_write(self, block_id: int) -> None:
        """Parameters go out zero-copy; if a send may still read this block, give
        the block fresh memory so the update cannot tear what is on its way."""
        trackers = self.in_flight.pop(block_id, None)
        if trackers and not all(getattr(t, "done", True) for t in trackers):
            self.params[block_id] = self.params[block_id].clone()

    # ------------------------------------------------------------ membership

    def set_members(self, workers: Sequence[int], backup: int | None = None) -> PsUpdate | None:
        """New active set (and b); completes the open step if it no longer waits.

        A worker that left (``leave``) is not taken back: its loop ended, and a
        membership sent before its leave arrived must not make steps wait for it.
        A worker new to the membership is a new process (``dtlaunch scale`` added
        its rank, perhaps again): whatever its rank's last process said is forgotten.
        """
        added = set(workers) - self.assigned
        self.left -= added
        self.idle -= added
        self.assigned = set(workers)
        self._joining = {w: s for w, s in self._joining.items() if w in self.assigned}
        self.members = self.assigned - self.left - self.idle - set(self._joining)
        if backup is not None:
            self.backup = backup
        return self._maybe_apply(time.perf_counter())

    def leave(self, worker: int) -> PsUpdate | None:
        self.members.discard(worker)
        self.left.add(worker)
        self.idle.discard(worker)
        self._joining.pop(worker, None)
        return self._maybe_apply(time.perf_counter())

    def set_idle(self, worker: int) -> PsUpdate | None:
        """``worker`` waits for data: steps stop waiting for it (see the module docstring)."""
        self.idle.add(worker)
        self.members.discard(worker)
        self._joining.pop(worker, None)
        return self._maybe_apply(time.perf_counter())

    def activate(self, worker: int) -> int:
        """``worker`` has data again (or is a new process of its rank); returns
        the first step that waits for its push (the current version when it is
        not an assigned member: nothing waits for it)."""
        self.idle.discard(worker)
        if worker not in self.assigned or worker in self.left or self.mode == "asp":
            return self.version
        if worker in self._joining:
            return self._joining[worker]
        if worker not in self.members and self._contrib and worker not in self._contrib:
            self._joining[worker] = self.version + 1  # this step went on without it
            return self.version + 1
        self.members.add(worker)
        return self.version + 1 if worker in self._contrib else self.version

    # ----------------------------------------------------------------- push

    def push(
        self, worker: int, step: int, samples: int, grads: Mapping[int, torch.Tensor]
    ) -> PushResult:
        """Take one worker's gradients for ``step``; apply when the step is complete.

        Raises:
            ConfigError: not seeded, blocks that do not match this server's, a
                gradient from the future.
        """
        if self.optimizer is None:
            raise ConfigError("this server is not seeded yet; push after the first pull")
        if step > self.version:
            raise ConfigError(
                f"gradient for version {step}, the server is at {self.version}: pull first"
            )
        started = time.perf_counter()
        if self.mode == "asp":
            self._check_blocks(grads, subset=True)
            key = (step, frozenset(grads))
            if samples == 0 or self._asp_last.get(worker) == key:
                # No records behind it (weight 0, as in a BSP step), or sent again.
                return PushResult(True, None)
            self._asp_last[worker] = key
            return PushResult(True, self._apply_asp(worker, step, samples, grads, started))
        if worker in self._contrib and step == self.version:
            return PushResult(True, None)  # sent again: the open step holds it already
        applied_step, applied_workers = self._last_applied
        if step == applied_step and worker in applied_workers:
            return PushResult(True, None)  # sent again: its step applied with it
        if step < self.version:
            # The step went ahead without it (BACKUP), or, before ``recovered_at``,
            # an earlier process applied it: with backup 0 only once every member's
            # gradient was in, so this one too; with backup > 0 it cannot be known,
            # and "dropped" sends its records back to the DDS rather than lose them.
            return PushResult(step < self.recovered_at and self.backup == 0, None)
        # Only now: none of a push answered above is applied, and a late one may
        # name the blocks of a placement that changed since its step (a reassignment).
        self._check_blocks(grads)
        for block_id, grad in grads.items():
            acc = self._acc.get(block_id)
            if not self._contrib or acc is None:
                if acc is None:
                    acc = self._acc[block_id] = torch.empty_like(self.params[block_id])
                torch.mul(grad, samples, out=acc)
            else:
                acc.add_(grad, alpha=samples)
        self._contrib[worker] = samples
        return PushResult(True, self._maybe_apply(started))

    def _check_blocks(self, grads: Mapping[int, torch.Tensor], *, subset: bool = False) -> None:
        """Raises: ConfigError when ``grads`` are not for exactly the blocks held
        (``subset``, ASP: for some of them; each block is updated on its own)."""
        named, held = set(grads), set(self.params)
        fits = named <= held if subset else named == held
        if not fits:
            raise ConfigError(
                f"push names blocks {sorted(grads)}, this server holds {sorted(self.params)}; "
                "the worker's placement is stale: fetch the current one"
            )

    def _maybe_apply(self, started: float) -> PsUpdate | None:
        if not self._contrib:
            return None
        waiting_for = self.members - set(self._contrib)
        if len(waiting_for) > min(self.backup, max(0, len(self.members) - 1)):
            return None
        total = sum(self._contrib.values())
        if waiting_for and total == 0:
            # BACKUP: only empty gradients are in (workers without data at the end
            # of the data set): leaving out the last one, which has records, would
            # drop exactly the work that is left, step after step.
            return None
        if total > 0:
            assert self.optimizer is not None
            for block_id, acc in self._acc.items():
                acc.div_(total)
                self.before_write(block_id)
                apply_update(self.optimizer, self.params[block_id], acc, self.states[block_id])
        update = PsUpdate(
            version=self.version + 1,
            step=self.version,
            update_s=time.perf_counter() - started,
            samples=total,
            applied=sorted(self._contrib),
            dropped=sorted(waiting_for),
        )
        self._last_applied = (self.version, frozenset(self._contrib))
        self.version += 1
        self._contrib = {}
        for worker in [w for w, step in self._joining.items() if step <= self.version]:
            del self._joining[worker]
            self.members.add(worker)
        return update

    def _apply_asp(
        self, worker: int, step: int, samples: int, grads: Mapping[int, torch.Tensor], t0: float
    ) -> PsUpdate:
        assert self.optimizer is not None
        for block_id, grad in grads.items():
            self.before_write(block_id)
            apply_update(self.optimizer, self.params[block_id], grad, self.states[block_id])
        self.version += 1
        return PsUpdate(
            version=self.version,
            step=step,
            update_s=time.perf_counter() - t0,
            samples=samples,
            applied=[worker],
        )
