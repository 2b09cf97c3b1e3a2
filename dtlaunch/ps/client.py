"""``dtlaunch.ps.Client``: a worker's view of the parameter servers.

::

    job = dtlaunch.init()
    ps = dtlaunch.ps.Client(model, optimizer="adam", lr=1e-3)
    for idx in job.batches():
        ps.pull()                  # the model's parameters, from every server at once
        model.zero_grad()
        loss = ...; loss.backward()
        ps.push(len(idx))          # p.grad, weighted by this worker's share of the batch
        job.step()

The model's parameters are cut into blocks and placed on the servers
(``blocks.plan``, unless a ``placement`` is given); under ``dtlaunch run`` the
supervisor keeps the job's map, the first worker's plan, and every worker follows
it (``Job.ps_placement``). A pull asks each server for its blocks and copies
them into the parameters as each answer arrives; a push sends the gradients
straight from ``p.grad`` (no copy) and waits for every server's ack, so ``p.grad``
may change once ``push`` returns. Both time each server (bytes, seconds) for the
Monitor (``take_timings``): a pull's seconds leave out the time the server kept
it waiting for its version (the other workers' pushes: the BSP barrier, which
the job records as this worker's wait), so they are the server's own service.
The first worker to reach an unseeded server seeds it with its initial
parameters.

The map may change while the job trains (PSLD's live reassignment: some blocks
move between running servers at a step boundary). A server that gave blocks
away answers a request naming them "reassigned in map version V"; the client
fetches the job's map (``placement_source``; under ``dtlaunch run`` the
supervisor's), follows it (``use_placement``) and sends the request again: a
pull is pulled again from the new owners, the time it was held counts as wait,
not communication. A push can meet it only when it is late (BACKUP_WORKERS
applied its step without it, before the blocks moved): it counts as dropped,
as any late push, and the next pull takes what is there.

A worker whose ``job.batches()`` waits for data (at the end of an epoch or of
the data set, the other workers hold the last shards) steps aside: the client,
a listener of the job's (``Job.add_data_wait_listener``), tells the servers it
is idle, so BSP steps do not wait for its push, which would come only after the
others' steps finish their shards. When data comes it rejoins every server at
one common step (pushing zeros for any step a server expects from it before
that one), so the loop above is correct as written.

Consistency is the servers' business (``dtlaunch.ps.store``); the client only
follows versions: a push carries the version its gradient was computed on, and
the next pull waits until that push's step is applied (BSP) or takes what is
there (ASP, and after a push the server refused because the step went on
without it, as BACKUP_WORKERS does with a late worker; ``dropped`` says so).

A server that dies is noticed (``dtlaunch.ps.exchange``: pings, incarnations)
and, once a new process serves its endpoint, resynced: the client offers the
blocks it last pulled from it with their version (the server keeps the newer of
that and its snapshot), re-sends its last gradient if the server's version shows
it was lost (from ``p.grad``, when it is still the tensor that was pushed and
unchanged; else a zero-weight push, so the step does not wait for it), then
sends its request again. Between ``push`` and the next ``pull``, leave
``p.grad`` alone (``zero_grad`` after ``pull``, as in the loop above) and do not
change the parameters, and a restart loses no gradient.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import zmq

from dtlaunch.errors import ConfigError, DtlaunchError
from dtlaunch.ps.blocks import Placement, check_layout, plan
from dtlaunch.ps.client_catchup import CatchUp
from dtlaunch.ps.config import (
    ENV_KEYS,
    block_bytes_from,
    endpoints_from,
    timeout_from,
    worker_rank_from,
)
from dtlaunch.ps.exchange import (
    Exchanger,
    PlacementChanged,
    PsError,
    Request,
    ServerTiming,
    expect,
)
from dtlaunch.ps.frames import as_buffer, block_spec, optimizer_to_wire, tensor_from_frame
from dtlaunch.ps.model_blocks import GradMark, ModelTensors
from dtlaunch.ps.optim import OptimizerConfig
from dtlaunch.ps.placement_map import job_map
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
)

__all__ = ["Client", "PsError", "ServerTiming"]

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0


class Client(CatchUp):
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
        placement_source: Callable[[], Placement | tuple[Placement, Sequence[str]]]
        | None = None,
    ) -> None:
        """``placement_source``: the job's current map, asked when a server says
        blocks were reassigned (default: the job's, under ``dtlaunch run``); with
        the servers' endpoints when they changed too (servers added or removed)."""
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
        endpoints = list(servers) if servers is not None else endpoints_from(env)
        self.worker = worker if worker is not None else worker_rank_from(env)
        self._job = job
        self._placement_source = placement_source
        self._timeout = timeout if timeout is not None else timeout_from(env)
        self._tensors = ModelTensors(model)
        specs = self._tensors.specs
        size = block_bytes if block_bytes is not None else block_bytes_from(env)
        if placement is None:
            placement = plan(specs, len(endpoints), size)
            job = job if job is not None else current_job()
            if job is not None:  # under dtlaunch run: follow the supervisor's map
                # A scale may have changed the servers since this process started.
                placement, endpoints = job_map(job, placement, endpoints)
        self.placement = placement
        check_layout(self.placement, specs, len(endpoints))
        if keys is None:
            keys_dir = env.get(ENV_KEYS)
            if not keys_dir:
                raise ConfigError(f"{ENV_KEYS} is not set: pass keys= or run under dtlaunch run")
            keys = load_peer_keys(Path(keys_dir))
        self._keys = keys
        self._ctx = new_context()
        self._exch = Exchanger(self._timeout, connect=self._link)
        n = len(endpoints)
        self._versions = [0] * n  # version each server's blocks were pulled at
        self._want = [0] * n  # min_version of the next pull
        # The last accepted push to each server: its step, and the server version
        # from which the server's parameters include it (resync re-sends it below).
        self._pushed_step = [0] * n
        self._applied_by = [0] * n
        self._pushed_samples = 0
        self._pushed_grads: list[GradMark] = []
        self._pushing = False  # p.grad holds the gradient being pushed, not the last one
        self.dropped: list[int] = []  # servers that refused the last push (step went on)
        self._closed = False
        self._left = False  # told the servers it takes no more steps
        self._idle = False  # told the servers it waits for data
        self._asp = False  # the servers apply each push at once (their PsInitReply says)
        self._job_listened: Any = None  # the job this client listens to for data waits
        try:
            for endpoint in endpoints:
                self._exch.links.append(self._link(endpoint))
                self._exch.endpoints.append(endpoint)
                self._exch.incarnations.append(0)
            self._seed()
            # A new process of a rank whose last one was idle is a member again;
            # under dtlaunch run, one a scale added first waits to be counted.
            under_job = (job if job is not None else current_job()) is not None
            self._rejoin(until_counted=under_job)
        except BaseException:
            self.close(notify=False)
            raise
        # The job tells this client when its worker waits for data (see above).
        listened = job if job is not None else current_job()
        if listened is not None and hasattr(listened, "add_data_wait_listener"):
            listened.add_data_wait_listener(self)
            self._job_listened = listened

    # ----------------------------------------------------------------- public

    @property
    def endpoints(self) -> list[str]:
        """Each server's endpoint, in rank order (it changes when a server's blocks move)."""
        return list(self._exch.endpoints)

    @property
    def versions(self) -> list[int]:
        """The version of each server's parameters as of the last pull."""
        return list(self._versions)

    @property
    def timings(self) -> list[ServerTiming]:
        """Per-server timings not taken yet (``take_timings``), oldest first."""
        return self._exch.timings

    @property
    def moves(self) -> int:
        """Servers this client followed to where their blocks migrated."""
        return self._exch.moves

    @property
    def restarts(self) -> int:
        """Server restarts this client noticed and resynced."""
        return self._exch.restarts

    def pull(self, *, final: bool | None = None) -> None:
        """Fill the model's parameters from every server (waits for the pushed step).

        ``final``: this worker takes no more steps and wants the trained model.
        The pull first tells the servers so (as ``close()`` would), then waits
        until no open step holds records. Without that, a worker that heard
        "data set done" right after another pushed the last records would pull
        the model without them, while that step waits for its push. Default:
        final once the job's data set has ended (its ``batches()`` loop is over).
        """
        if final is None:
            job = self._job if self._job is not None else current_job()
            final = job is not None and job.data_ended
        if final and not self._left:
            self._leave()
        waited: list[float] = []

        def requests() -> dict[int, Request]:
            waited.clear()  # only the round that completes says what the barrier was
            return {
                j: (
                    PsPull(
                        request_id=0,
                        # Final: its own step need not apply (the others may never
                        # push it); "settled" waits for any step that holds records.
                        min_version=self._versions[j] if final else self._want[j],
                        blocks=self._ids(j),
                        worker=self.worker,
                        settled=final,
                    ),
                    [],
                )
                for j in range(len(self._exch.links))
            }

        started, mark = time.perf_counter(), len(self._exch.timings)

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            if not isinstance(reply, PsParams) or len(frames) != len(reply.blocks):
                raise PsError(f"server {j} answered a pull with {reply.TYPE}")
            waited.append(reply.waited_s)
            with torch.no_grad():
                for block_id, frame in zip(reply.blocks, frames, strict=True):
                    view = self._tensors.param_view(self.placement.blocks[block_id])
                    view.copy_(tensor_from_frame(frame, block_spec(block_id, view)))
            self._versions[j] = reply.version
            return sum(len(f) for f in frames)

        paused = self._exch.run_following(
            "pull", requests, take, follow=self._follow_placement, on_restart=self._resync
        )
        # What every server spent waiting for the step (the other workers' pushes)
        # is the BSP barrier, not this worker's time: the Monitor leaves it out, as
        # the time a reassignment held the pull (every worker waits it alike).
        wait_s = min(waited, default=0.0) + paused
        elapsed = time.perf_counter() - started
        self._record_comm(elapsed - wait_s, self._exch.timings[mark:], wait_s=wait_s)

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
        requests: dict[int, Request] = {
            j: self._push_request(j, self._versions[j], samples, zeros=False)
            for j in range(len(self._exch.links))
        }
        marks = self._tensors.grad_marks()
        self.dropped = []
        started, mark = time.perf_counter(), len(self._exch.timings)

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            reply = expect(PsPushAck, j, reply, "a push")
            if reply.accepted:
                self._want[j] = reply.step + 1
                self._note_applied(j, reply)
            else:
                self._want[j] = reply.version
                self._applied_by[j] = 0
                self.dropped.append(j)
            return 0

        self._pushing = True
        try:
            self._exch.run("push", requests, take, on_restart=self._resync)
        except PlacementChanged as changed:
            if self._asp:
                # Held for the new map while the blocks moved: sent on to their
                # new servers (ASP applies a push whenever it comes).
                self._push_moved(changed, samples)
                changed = PlacementChanged(changed.version, [])
            # BSP: only a late push meets blocks that left (their fence is after
            # its step, which went on without it): dropped, as a late push is
            # anywhere; the next pull takes what is there.
            for j in changed.servers:
                self._want[j] = 0
                self._applied_by[j] = 0
            self.dropped += changed.servers
            if changed.servers:
                self._follow_placement(changed)
        finally:
            self._pushing = False
        self._pushed_samples, self._pushed_grads = samples, marks
        self.dropped.sort()
        if self.dropped and samples > 0 and job is not None:
            # BACKUP_WORKERS applied the step without us: the records go back.
            job.mark_dropped()
        self._record_comm(time.perf_counter() - started, self._exch.timings[mark:])

    def use_placement(self, placement: Placement, servers: Sequence[str] | None = None) -> None:
        """Follow a new placement (after a migration, a reassignment, or a server
        scale-out/in).

        Call it between steps, after the supervisor says the blocks moved (a
        reassignment's new map is followed without it: see the module docstring).

        Raises:
            ConfigError: the placement does not fit this model or the server list.
        """
        endpoints = list(servers) if servers is not None else list(self.endpoints)
        check_layout(placement, self._tensors.specs, len(endpoints))
        if placement.version < self.placement.version:
            raise ConfigError(
                f"placement version {placement.version} is older than the one in use "
                f"({self.placement.version})"
            )
        progress = self._progress_under(placement, endpoints)
        self._exch.use_endpoints(endpoints)
        self.placement = placement
        self._versions, self._want, self._pushed_step, self._applied_by = progress

    def _progress_under(
        self, placement: Placement, endpoints: Sequence[str]
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """``_versions``, ``_want``, ``_pushed_step`` and ``_applied_by`` for each
        server of ``placement``, from where its blocks were until now.

        A server with the same endpoint and blocks keeps its own. For another,
        the worker's copy of its blocks is as old as the oldest pull they came
        from (what a resync offers it, labelled with that version), and its next
        pull waits for the newest step the worker pushed for them: the servers
        they came from applied it before letting them go, at the step boundary
        they moved at. So nothing pushed before needs sending again after a
        restart either.
        """
        old = self.placement
        old_endpoints = self.endpoints
        same_layout = placement.blocks == old.blocks
        every_old_server = set(range(old.servers))
        versions, want, pushed_step, applied_by = [], [], [], []
        for j, endpoint in enumerate(endpoints):
            blocks = {b.block_id for b in placement.blocks_on(j)}
            same_server = j < len(old_endpoints) and old_endpoints[j] == endpoint
            if same_server and same_layout and blocks == set(self._ids(j)):
                versions.append(self._versions[j])
                want.append(self._want[j])
                pushed_step.append(self._pushed_step[j])
                applied_by.append(self._applied_by[j])
                continue
            came_from = {old.owner[b] for b in blocks} if same_layout else set(every_old_server)
            if same_server:
                came_from.add(j)
            # Under BSP the servers advance in lockstep, so a server with no block
            # of its own (nor a past) is as far as any.
            came_from = came_from or every_old_server
            versions.append(min(self._versions[i] for i in came_from))
            want.append(max(self._want[i] for i in came_from))
            pushed_step.append(0)
            applied_by.append(0)
        return versions, want, pushed_step, applied_by

    def take_timings(self) -> list[ServerTiming]:
        """Per-server timings since the last call (for the Monitor), oldest first."""
        taken, self._exch.timings = self._exch.timings, []
        return taken

    def close(self, *, notify: bool = True) -> None:
        """Tell the servers this worker leaves (steps stop waiting for it), then close."""
        if self._closed:
            return
        self._closed = True
        if self._job_listened is not None:
            self._job_listened.remove_data_wait_listener(self)
        if notify and not self._left:
            try:
                self._leave()
            except DtlaunchError as exc:
                logger.warning("ps: leaving: %s", exc)
        for link in self._exch.links:
            link.close()
        self._ctx.term()

    def _leave(self) -> None:
        """Tell every server this worker takes no more steps (they stop waiting for it)."""
        self._left = True
        links = self._exch.links
        requests: dict[int, Request] = {
            j: (PsLeave(request_id=0, worker=self.worker), []) for j in range(len(links))
        }
        if requests:
            self._exch.run("leave", requests, lambda j, r, f: 0, timeout=CLOSE_TIMEOUT_S)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- helpers

    def _ids(self, server: int) -> list[int]:
        return [b.block_id for b in self.placement.blocks_on(server)]

    def _link(self, endpoint: str) -> ServerLink:
        identity = b"worker:%d:%d" % (self.worker, os.getpid())
        return ServerLink(self._ctx, endpoint, self._keys, identity)

    def _init_request(self, j: int, with_data: bool) -> Request:
        """Seed server ``j`` with, or offer it, this worker's copy of its blocks."""
        blocks = self.placement.blocks_on(j)
        views = [self._tensors.param_view(b).detach() for b in blocks]
        msg = PsInit(
            request_id=0,
            worker=self.worker,
            optimizer=optimizer_to_wire(self.config),
            blocks=[block_spec(b.block_id, v) for b, v in zip(blocks, views, strict=True)],
            with_data=with_data,
            version=self._versions[j],
        )
        return msg, [as_buffer(v) for v in views] if with_data else []

    def _push_request(
        self, j: int, step: int, samples: int, *, zeros: bool, blocks: Sequence[int] = ()
    ) -> Request:
        ids = list(blocks) or self._ids(j)
        grad = self._tensors.zero_grad if zeros else self._tensors.grad_view
        payloads = [as_buffer(grad(self.placement.blocks[b])) for b in ids]
        msg = PsPush(request_id=0, worker=self.worker, step=step, samples=samples, blocks=ids)
        return msg, payloads

    def _note_applied(self, j: int, ack: PsPushAck) -> None:
        # BSP: the step's update makes version step + 1; ASP: the ack's version.
        self._pushed_step[j] = ack.step
        self._applied_by[j] = max(ack.step + 1, ack.version)

    def _seed(self) -> None:
        unseeded: list[int] = []

        def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
            answer = expect(PsInitReply, j, reply, "PsInit")
            self._asp = self._asp or answer.mode == "asp"
            if not answer.seeded:
                unseeded.append(j)
            return 0

        def offers() -> dict[int, Request]:
            unseeded.clear()  # asked again after a reassignment cut the round short
            return self._init_requests(range(len(self._exch.links)), with_data=False)

        follow = self._follow_placement
        self._exch.run_following("init", offers, take, follow=follow)
        if unseeded:
            seeding = list(unseeded)
            seeds = functools.partial(self._init_requests, seeding, with_data=True)
            self._exch.run_following("seed", seeds, take, follow=follow)

    def _init_requests(self, servers: Sequence[int], *, with_data: bool) -> dict[int, Request]:
        return {j: self._init_request(j, with_data) for j in servers}

    def _follow_placement(self, changed: PlacementChanged) -> None:
        """Follow the job's map: servers ``changed.servers`` said blocks asked of
        them were reassigned in its version ``changed.version``.

        Raises:
            PsError: the job's map cannot be fetched, is older than that version
                (the supervisor commits a map before the blocks are released), or
                is the one followed already (it and the servers disagree).
            ConfigError: the map does not fit this model or the servers.
        """
        said = (
            f"parameter servers {changed.servers} say blocks asked of them were reassigned "
            f"in placement map version {changed.version}"
        )
        if changed.version <= self.placement.version:
            raise PsError(
                f"{said}, but this worker follows version {self.placement.version}, which "
                "places them there: the map and the servers disagree"
            )
        placement, endpoints = self._job_placement(said)
        if placement.version < changed.version:
            raise PsError(
                f"{said}, but the job's map is at version {placement.version}: the "
                "supervisor must commit a map before the blocks are released"
            )
        logger.info(
            "ps: worker %d follows placement map version %d (servers %s gave blocks away)",
            self.worker,
            placement.version,
            changed.servers,
        )
        self.use_placement(placement, endpoints)

    def _job_placement(self, said: str) -> tuple[Placement, list[str] | None]:
        """The job's current map (``placement_source``'s, else the supervisor's)
        and where its servers listen (None: where they did).

        Raises:
            PsError: there is neither.
        """
        if self._placement_source is not None:
            given = self._placement_source()
            if isinstance(given, Placement):
                return given, None
            placement, endpoints = given
            return placement, list(endpoints)
        job = self._job if self._job is not None else current_job()
        if job is None:
            raise PsError(
                f"{said}, and this client has no way to fetch the job's map: run it "
                "under dtlaunch run, or give Client(placement_source=...)"
            )
        # Registering the map in use answers with the job's: the owners are not compared.
        return job_map(job, self.placement, self.endpoints)

    def _record_comm(
        self, seconds: float, timings: list[ServerTiming], *, wait_s: float = 0.0
    ) -> None:
        job = self._job if self._job is not None else current_job()
        if job is not None:
            job.record_comm(max(0.0, seconds))
            job.record_wait(wait_s)
            for t in timings:
                job.record_server_comm(t.server, t.bytes, t.seconds)

