"""``dtlaunch.ps.Client``: a worker's view of the parameter servers.

::

    job = dtlaunch.init()
    ps = dtlaunch.ps.Client(model, optimizer="adam", lr=1e-3)
    for idx in job.batches():
        ps.pull()                  # the model's parameters, from every server at once
        loss = ...; loss.backward()
        ps.push(len(idx))          # p.grad, weighted by this worker's share of the batch
        job.step()

The model's parameters are cut into blocks and placed on the servers
(``blocks.plan``: the same map in every worker, computed from the model, unless
a ``placement`` is given). A pull asks each server for its blocks and copies
them into the parameters as each answer arrives; a push sends the gradients
straight from ``p.grad`` (no copy) and waits for every server's ack, so ``p.grad``
may change once ``push`` returns. Both time each server (bytes, seconds) for the
Monitor (``take_timings``). The first worker to reach an unseeded server seeds it
with its initial parameters.

Consistency is the servers' business (``dtlaunch.ps.store``); the client only
follows versions: a push carries the version its gradient was computed on, and
the next pull waits until that push's step is applied (BSP) or takes what is
there (ASP, and after a push the server refused because the step went on
without it, as BACKUP_WORKERS does with a late worker; ``dropped`` says so).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import zmq

from dtlaunch.errors import ConfigError, DtlaunchError
from dtlaunch.ps.blocks import Block, ParamSpec, Placement, plan
from dtlaunch.ps.config import (
    ENV_KEYS,
    block_bytes_from,
    endpoints_from,
    timeout_from,
)
from dtlaunch.ps.frames import as_buffer, block_spec, optimizer_to_wire, tensor_from_frame
from dtlaunch.ps.optim import OptimizerConfig
from dtlaunch.ps.transport import ServerLink, new_context
from dtlaunch.runtime.context import current_job
from dtlaunch.wire.keys import PeerKeys, load_peer_keys
from dtlaunch.wire.messages import (
    Message,
    PsInit,
    PsInitReply,
    PsLeave,
    PsParams,
    PsPull,
    PsPush,
    PsPushAck,
    PsReply,
)

__all__ = ["Client", "PsError", "ServerTiming"]

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0


class PsError(DtlaunchError):
    """A parameter server refused a request or did not answer in time."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServerTiming:
    """One exchange with one server, for the Monitor (PSLD §4.1's Pred(r, s))."""

    server: int
    op: str  # "pull" or "push"
    bytes: int  # tensor bytes moved
    seconds: float  # from sending the request to having the answer


class Client:
    """See the module docstring.

    Raises (constructor):
        ConfigError: bad options or environment, a model the placement does not fit.
        KeyFileError: the run's key files are missing or unsafe.
        PsError: a server refused the model or did not answer.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: str = "adam",
        lr: float = 1e-3,
        *,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float | None = None,
        weight_decay: float = 0.0,
        lr_decay: float = 0.0,
        servers: Sequence[str] | None = None,
        placement: Placement | None = None,
        keys: PeerKeys | None = None,
        worker: int | None = None,
        block_bytes: int | None = None,
        job: Any = None,
        timeout: float | None = None,
    ) -> None:
        env = os.environ
        self.config = OptimizerConfig(
            name=optimizer,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            nesterov=nesterov,
            beta1=betas[0],
            beta2=betas[1],
            eps=-1.0 if eps is None else eps,
            weight_decay=weight_decay,
            lr_decay=lr_decay,
        ).validate()
        self.endpoints = list(servers) if servers is not None else endpoints_from(env)
        self.worker = worker if worker is not None else _rank_from(env)
        self._job = job
        self._timeout = timeout if timeout is not None else timeout_from(env)
        self._params = [p for _, p in model.named_parameters()]
        specs = self._specs = _param_specs(model)
        size = block_bytes if block_bytes is not None else block_bytes_from(env)
        self.placement = placement or plan(specs, len(self.endpoints), size)
        _check_layout(self.placement, specs, len(self.endpoints))
        if keys is None:
            keys_dir = env.get(ENV_KEYS)
            if not keys_dir:
                raise ConfigError(f"{ENV_KEYS} is not set: pass keys= or run under dtlaunch run")
            keys = load_peer_keys(Path(keys_dir))
        self._keys = keys
        self._ctx = new_context()
        self._links: list[ServerLink] = []
        self._request_ids = itertools.count(1)
        self._versions = [0] * len(self.endpoints)  # version each server's blocks were pulled at
        self._want = [0] * len(self.endpoints)  # min_version of the next pull
        self._zero_grads: dict[int, torch.Tensor] = {}
        self.timings: list[ServerTiming] = []
        self.dropped: list[int] = []  # servers that refused the last push (step went on)
        self._closed = False
        try:
            for endpoint in self.endpoints:
                identity = b"worker:%d:%d" % (self.worker, os.getpid())
                self._links.append(ServerLink(self._ctx, endpoint, keys, identity))
            self._seed()
        except BaseException:
            self.close(notify=False)
            raise

    # ----------------------------------------------------------------- public

    @property
    def versions(self) -> list[int]:
        """The version of each server's parameters as of the last pull."""
        return list(self._versions)

    def pull(self) -> None:
        """Fill the model's parameters from every server (waits for the pushed step)."""
        requests: dict[int, tuple[Message, list[Any]]] = {
            j: (PsPull(request_id=0, min_version=self._want[j], blocks=self._ids(j)), [])
            for j in range(len(self._links))
        }
        started = time.perf_counter()

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            if not isinstance(reply, PsParams) or len(frames) != len(reply.blocks):
                raise PsError(f"server {j} answered a pull with {reply.TYPE}")
            with torch.no_grad():
                for block_id, frame in zip(reply.blocks, frames, strict=True):
                    view = self._param_view(self.placement.blocks[block_id])
                    view.copy_(tensor_from_frame(frame, block_spec(block_id, view)))
            self._versions[j] = reply.version
            return sum(len(f) for f in frames)

        self._exchange("pull", requests, take)
        self._record_comm(time.perf_counter() - started)

    def push(self, samples: int | None = None) -> None:
        """Send ``p.grad`` of every parameter (zeros where None) to its servers.

        ``samples`` is the number of records behind the gradients (the server
        weights each worker's mean gradient by it); default: the records the
        job (``dtlaunch.init()``'s, unless one was given) handed out since its
        last ``step()``, or 1 without a job.
        """
        job = self._job if self._job is not None else current_job()
        if samples is None:
            samples = int(job.samples_in_step) if job is not None else 1
        if type(samples) is not int or samples < 0:
            raise ConfigError(f"push(samples=...) must be an int >= 0, got {samples!r}")
        requests: dict[int, tuple[Message, list[Any]]] = {}
        for j in range(len(self._links)):
            ids = self._ids(j)
            payloads = [as_buffer(self._grad_view(self.placement.blocks[b])) for b in ids]
            msg = PsPush(
                request_id=0,
                worker=self.worker,
                step=self._versions[j],
                samples=samples,
                blocks=ids,
            )
            requests[j] = (msg, payloads)
        self.dropped = []
        started = time.perf_counter()

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            if not isinstance(reply, PsPushAck):
                raise PsError(f"server {j} answered a push with {reply.TYPE}")
            if reply.accepted:
                self._want[j] = reply.step + 1
            else:
                self._want[j] = reply.version
                self.dropped.append(j)
            return 0

        self._exchange("push", requests, take)
        self._record_comm(time.perf_counter() - started)

    def use_placement(self, placement: Placement, servers: Sequence[str] | None = None) -> None:
        """Follow a new placement (after a migration or a server scale-out/in).

        Call it between steps, after the supervisor says the blocks moved.

        Raises:
            ConfigError: the placement does not fit this model or the server list.
        """
        endpoints = list(servers) if servers is not None else list(self.endpoints)
        _check_layout(placement, self._specs, len(endpoints))
        if placement.version < self.placement.version:
            raise ConfigError(
                f"placement version {placement.version} is older than the one in use "
                f"({self.placement.version})"
            )
        links = []
        for j, endpoint in enumerate(endpoints):
            if j < len(self.endpoints) and self.endpoints[j] == endpoint:
                links.append(self._links[j])
            else:
                identity = b"worker:%d:%d" % (self.worker, os.getpid())
                links.append(ServerLink(self._ctx, endpoint, self._keys, identity))
        for j, link in enumerate(self._links):
            if link not in links:
                self._links[j].close()
        # Servers advance in lockstep under BSP; a new server starts at the version
        # its blocks were moved at, which is the newest any server has.
        want, version = max(self._want), max(self._versions)
        self._links, self.endpoints, self.placement = links, endpoints, placement
        self._want, self._versions = [want] * len(links), [version] * len(links)

    def take_timings(self) -> list[ServerTiming]:
        """Per-server timings since the last call (for the Monitor), oldest first."""
        taken, self.timings = self.timings, []
        return taken

    def close(self, *, notify: bool = True) -> None:
        """Tell the servers this worker leaves (steps stop waiting for it), then close."""
        if self._closed:
            return
        self._closed = True
        if notify and self._links:
            requests: dict[int, tuple[Message, list[Any]]] = {
                j: (PsLeave(request_id=0, worker=self.worker), []) for j in range(len(self._links))
            }
            try:
                self._exchange("leave", requests, lambda j, r, f: 0, timeout=CLOSE_TIMEOUT_S)
            except DtlaunchError as exc:
                logger.warning("ps: leaving: %s", exc)
        for link in self._links:
            link.close()
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- helpers

    def _ids(self, server: int) -> list[int]:
        return [b.block_id for b in self.placement.blocks_on(server)]

    def _param_view(self, block: Block) -> torch.Tensor:
        data = self._params[block.param].data
        return data if data.dim() == 0 else data[block.row_start : block.row_end]

    def _grad_view(self, block: Block) -> torch.Tensor:
        grad = self._params[block.param].grad
        if grad is None:
            zero = self._zero_grads.get(block.block_id)
            if zero is None:
                zero = self._zero_grads[block.block_id] = torch.zeros(
                    block.shape, dtype=self._params[block.param].dtype
                )
            return zero
        view = grad if grad.dim() == 0 else grad[block.row_start : block.row_end]
        return view if view.is_contiguous() else view.contiguous()

    def _seed(self) -> None:
        wire_opt = optimizer_to_wire(self.config)

        def init(j: int, with_data: bool) -> tuple[Message, list[Any]]:
            blocks = self.placement.blocks_on(j)
            views = [self._param_view(b).detach() for b in blocks]
            specs = [block_spec(b.block_id, v) for b, v in zip(blocks, views, strict=True)]
            msg = PsInit(
                request_id=0,
                worker=self.worker,
                optimizer=wire_opt,
                blocks=specs,
                with_data=with_data,
            )
            return msg, [as_buffer(v) for v in views] if with_data else []

        unseeded: list[int] = []

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            if not isinstance(reply, PsInitReply):
                raise PsError(f"server {j} answered PsInit with {reply.TYPE}")
            if not reply.seeded:
                unseeded.append(j)
            return 0

        self._exchange("init", {j: init(j, False) for j in range(len(self._links))}, take)
        if unseeded:
            self._exchange("seed", {j: init(j, True) for j in unseeded}, take)

    def _exchange(
        self,
        op: str,
        requests: Mapping[int, tuple[Message, list[Any]]],
        take: Any,
        *,
        timeout: float | None = None,
    ) -> None:
        """Send every request, then handle each answer as it arrives (in parallel)."""
        poller = zmq.Poller()
        pending: dict[int, int] = {}  # server -> request id
        sent_at: dict[int, float] = {}
        sent_bytes: dict[int, int] = {}
        for j, (msg, payloads) in requests.items():
            request_id = next(self._request_ids)
            msg = dataclasses.replace(msg, request_id=request_id)  # type: ignore[call-arg]
            sent_at[j] = time.perf_counter()
            self._links[j].send(msg, payloads)
            sent_bytes[j] = sum(memoryview(p).nbytes for p in payloads)
            pending[j] = request_id
            poller.register(self._links[j].sock, zmq.POLLIN)
        socket_of = {self._links[j].sock: j for j in pending}
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        while pending:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                names = ", ".join(f"{j} ({self.endpoints[j]})" for j in sorted(pending))
                raise PsError(
                    f"{op}: no answer from parameter server(s) {names} within "
                    f"{self._timeout:.0f}s; check that they run (DTLAUNCH_PS_TIMEOUT sets the wait)"
                )
            for sock, _ in poller.poll(min(left_ms, 1000)):
                j = socket_of[sock]
                got = self._links[j].recv_now()
                if got is None or j not in pending:
                    continue
                reply, frames = got
                if getattr(reply, "request_id", None) != pending[j]:
                    continue  # an answer to an earlier request that timed out
                if isinstance(reply, PsReply) and not reply.ok:
                    raise PsError(
                        f"{op}: parameter server {j} ({self.endpoints[j]}): {reply.detail}"
                    )
                received = take(j, reply, frames)
                del pending[j]
                poller.unregister(sock)
                if op in ("pull", "push"):
                    self.timings.append(
                        ServerTiming(
                            server=j,
                            op=op,
                            bytes=received + sent_bytes[j],
                            seconds=time.perf_counter() - sent_at[j],
                        )
                    )

    def _record_comm(self, seconds: float) -> None:
        job = self._job if self._job is not None else current_job()
        if job is not None:
            job.record_comm(seconds)


def _param_specs(model: torch.nn.Module) -> list[ParamSpec]:
    specs = []
    for name, p in model.named_parameters():
        if p.device.type != "cpu" or not p.data.is_contiguous():
            raise ConfigError(
                f"parameter {name} is on {p.device} or not contiguous; the PS client "
                "needs contiguous CPU parameters (move the model with .cpu() first)"
            )
        specs.append(
            ParamSpec(
                name=name,
                shape=tuple(p.shape),
                dtype=str(p.dtype).removeprefix("torch."),
                itemsize=p.element_size(),
            )
        )
    if not specs:
        raise ConfigError("the model has no parameters to keep on parameter servers")
    return specs


def _check_layout(placement: Placement, specs: Sequence[ParamSpec], servers: int) -> None:
    if placement.servers != servers:
        raise ConfigError(
            f"the placement is for {placement.servers} servers, {servers} endpoints were given"
        )
    for block in placement.blocks:
        if not 0 <= block.param < len(specs) or specs[block.param].name != block.name:
            raise ConfigError(
                f"placement block {block.block_id} ({block.name}) does not match this model's "
                "parameters; every worker must build the same model"
            )
    covered = {b.param for b in placement.blocks}
    if covered != set(range(len(specs))):
        raise ConfigError("the placement does not cover every parameter of the model")


def _rank_from(env: Mapping[str, str]) -> int:
    for name in ("DTLAUNCH_RANK", "RANK", "DMLC_WORKER_ID"):
        raw = env.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not an integer") from None
    return 0
