"""The parameter-server process: one loop on one CURVE ROUTER (``python -m dtlaunch.ps``).

It holds the blocks the placement gives it (``ParamStore``), answers pulls,
aggregates pushes under BSP / BACKUP(b) / ASP, and serves the supervisor's
commands: membership, snapshots, block export/import for migration and
reassignment, statistics with its per-step update times (AntDT's T_s), shutdown.

Requests it cannot answer yet wait in the loop, never in a thread: a pull for a
version not applied yet, an export before its ``at_version`` or while a step is
open, an import ahead of this server's version, a request for blocks on hold.
Every request names a ``request_id`` its answer echoes; a refused request gets
``PsReply(ok=False, detail=why)``, and the server goes on.

A pull's answer says how long it waited here for its version (``waited_s``:
from its arrival until the version it asked for was applied, the BSP barrier),
so the client can tell that from this server's own service time; a delay
injected into the server (``--inject ...role=server``) is service time, as on a
really slow server, and not in it.

Live reassignment (PSLD §5.2, the protocol in ``moved``' docstring): a source
exports blocks at a fence version and holds them until ``PsRelease`` or
``PsHoldEnd``; a target takes them at its own version. Waiting exports are
answered before waiting pulls whenever the version moves, so no pull of the
fence version for a block to be held is answered first.

Failover: every answer carries the process's random ``incarnation``, and a
pull or push addressed to an earlier one is refused, so clients notice a
restart and resync first (``_on_init`` takes a worker's newer copy). What that
guarantees and what it can lose: ``dtlaunch.ps``'s docstring.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dtlaunch.errors import ConfigError, WireError
from dtlaunch.ps.config import ServerConfig
from dtlaunch.ps.frames import (
    as_buffer,
    block_spec,
    optimizer_from_wire,
    tensor_from_frame,
)
from dtlaunch.ps.membership import Membership
from dtlaunch.ps.migration import Migrations
from dtlaunch.ps.moved import MovedBlocks
from dtlaunch.ps.slowdown import ServerSlowdown
from dtlaunch.ps.snapshot import Snapshot, read_snapshot, write_snapshot, write_text_atomically
from dtlaunch.ps.store import ParamStore
from dtlaunch.ps.transport import Incoming, ServerSocket, new_context
from dtlaunch.wire.keys import PeerKeys
from dtlaunch.wire.messages import (
    Message,
    PsBlockSpec,
    PsExport,
    PsHoldEnd,
    PsIdle,
    PsImport,
    PsInit,
    PsInitReply,
    PsLeave,
    PsMembership,
    PsParams,
    PsPing,
    PsPull,
    PsPush,
    PsPushAck,
    PsRelease,
    PsReply,
    PsShutdown,
    PsSnapshotNow,
    PsStats,
    PsStatsRequest,
    PsUpdate,
)

__all__ = ["PsServer", "ServerConfig"]  # ServerConfig: re-exported from config

logger = logging.getLogger(__name__)

POLL_MS = 100  # how often the loop looks at its stop flag and snapshot timer
UPDATES_KEPT = 10_000
SHUTDOWN_LINGER_MS = 1000


class PsServer(Migrations, Membership):
    """See the module docstring. ``serve()`` runs until shutdown or ``stop``."""

    def __init__(self, config: ServerConfig, keys: PeerKeys) -> None:
        self.config = config
        # A new random id per process: clients that see it change know the server
        # restarted and lost what it held since its snapshot (see the module docstring).
        self.incarnation = secrets.randbits(48) + 1
        self.store = ParamStore(mode=config.mode, workers=config.workers, backup=config.backup)
        if config.restore is not None and not config.restore.exists() and config.restore_optional:
            # A restarted server that died before its first snapshot: nothing to
            # restore, the first worker to reach it seeds it again.
            logger.warning("no snapshot at %s yet; starting unseeded", config.restore)
        elif config.restore is not None:
            snap = read_snapshot(config.restore)
            self.store.adopt(snap.optimizer, snap.version, snap.blocks)
            logger.info("restored %d blocks at version %d", len(snap.blocks), snap.version)
        self.updates: collections.deque[PsUpdate] = collections.deque(maxlen=UPDATES_KEPT)
        self._slowdown = ServerSlowdown(
            config.injections,
            rank=config.rank,
            host=config.host,
            job_start_wall=config.job_start_wall,
            seed=config.seed,
        )
        self._moved = MovedBlocks()
        self._waiting_pushes: list[Incoming] = []  # a migration's target before its import
        self._waiting_inits: list[Incoming] = []  # likewise (config.await_import)
        self._waiting_imports: list[Incoming] = []  # ahead of this server's version
        self._hold_until = 0.0  # an injected delay: pulls wait until then (monotonic)
        self._ctx = new_context()
        self._sock = ServerSocket(self._ctx, keys, config.bind)
        self.endpoint = self._sock.endpoint
        self._waiting_pulls: list[Incoming] = []
        # When the version a waiting pull asked for was applied (its ``waited_s`` ends there).
        self._pull_version_at: dict[Incoming, float] = {}
        self._waiting_exports: list[Incoming] = []
        self._export_deadlines: dict[int, float] = {}  # id(request) -> monotonic (0: none)
        self._last_snapshot = time.monotonic()
        self._running = False
        self._linger_ms = 0
        if config.endpoint_file is not None:
            write_text_atomically(config.endpoint_file, self.endpoint + "\n")
        self._handlers: dict[type[Message], Callable[[Incoming], None]] = {
            PsInit: self._on_init,
            PsPull: self._on_pull,
            PsPush: self._on_push,
            PsMembership: self._on_membership,
            PsLeave: self._on_leave,
            PsIdle: self._on_idle,
            PsSnapshotNow: self._on_snapshot,
            PsExport: self._on_export,
            PsImport: self._on_import,
            PsRelease: self._on_release,
            PsHoldEnd: self._on_hold_end,
            PsStatsRequest: self._on_stats,
            PsShutdown: self._on_shutdown,
            PsPing: self._on_ping,
        }

    def serve(self, stop: threading.Event | None = None) -> None:
        self._running = True
        logger.info(
            "ps server %d serving on %s (%s, incarnation %d, version %d)",
            self.config.rank, self.endpoint, self.config.mode, self.incarnation, self.store.version,
        )  # fmt: skip
        try:
            while self._running and not (stop is not None and stop.is_set()):
                wait_ms = self._slowdown.wait_ms(POLL_MS)
                if self._hold_until:  # an injected delay ends sooner than a poll
                    left_ms = int((self._hold_until - time.monotonic()) * 1000)
                    wait_ms = max(1, min(wait_ms, left_ms))
                incoming = self._sock.recv(wait_ms)
                if incoming is not None:
                    self._arrived(incoming)
                self._slowdown.run_due()  # transfers a slow link held back
                if self._hold_until and time.monotonic() >= self._hold_until:
                    self._hold_until = 0.0
                    self._answer_pulls()
                self._expire_exports()
                self._maybe_snapshot()
        finally:
            if self._running and self.config.snapshot_path is not None and self.store.params:
                self.snapshot()  # stopped by a signal: keep the freshest state
            self.close()

    def close(self) -> None:
        self._running = False
        self._sock.close(self._linger_ms)
        self._ctx.term()

    def snapshot(self) -> Path:
        """Write blocks + optimizer state now.

        Raises:
            ConfigError: no snapshot path was configured.
        """
        path = self.config.snapshot_path
        if path is None:
            raise ConfigError("this server has no snapshot file; start it with --snapshot PATH")
        assert self.store.optimizer is not None
        write_snapshot(
            path,
            Snapshot(
                server=self.config.rank,
                version=self.store.version,
                optimizer=self.store.optimizer,
                blocks={b: (p, self.store.states[b]) for b, p in self.store.params.items()},
            ),
        )
        self._last_snapshot = time.monotonic()
        return path

    # ---------------------------------------------------------------- dispatch

    def _arrived(self, incoming: Incoming) -> None:
        """A request off the socket; a push on a slow link only once it came over."""
        delay = 0.0
        if isinstance(incoming.message, PsPush):
            delay = self._slowdown.transfer_delay(incoming.payload_bytes)
        if delay > 0:
            self._slowdown.defer(delay, incoming, functools.partial(self._handle, incoming))
        else:
            self._handle(incoming)

    def _handle(self, incoming: Incoming) -> None:
        handler = self._handlers.get(type(incoming.message))
        if handler is None:
            logger.warning("ps: %s is not a request for a server; dropped", incoming.message.TYPE)
            return
        stale = getattr(incoming.message, "incarnation", 0)
        if stale not in (0, self.incarnation) and isinstance(incoming.message, PsPull | PsPush):
            # Sent to an earlier process of this server: the client resyncs, then resends.
            self._refuse(
                incoming,
                f"server {self.config.rank} restarted (incarnation {stale} is gone, "
                f"this is {self.incarnation}); offer your copy, then resend",
            )
            return
        if self._redirect(incoming):
            return
        try:
            handler(incoming)
        except (ConfigError, WireError) as exc:
            self._refuse(incoming, str(exc))

    def _redirect(self, incoming: Incoming) -> bool:
        """Answer a request for blocks that left with where they are now
        (``moved``): the server they migrated to, or the placement map version
        that reassigned them."""
        placement_version = self._moved.placement_version(incoming.message)
        if placement_version:
            self._refuse(
                incoming,
                f"blocks asked for were reassigned in placement map version {placement_version}",
                placement_version=placement_version,
            )
            return True
        where = self._moved.redirect(incoming.message, holds_blocks=bool(self.store.params))
        if where:
            self._refuse(incoming, f"the blocks moved to {where}", moved_to=where)
        return bool(where)

    def _refuse(
        self, incoming: Incoming, why: str, *, moved_to: str = "", placement_version: int = 0
    ) -> None:
        request_id = getattr(incoming.message, "request_id", 0)
        if moved_to:
            logger.info("ps: %s redirected to %s", incoming.message.TYPE, moved_to)
        elif placement_version:
            logger.info("ps: %s: %s", incoming.message.TYPE, why)
        else:
            logger.warning("ps: refused %s: %s", incoming.message.TYPE, why)
        self._sock.send(
            incoming.peer,
            PsReply(
                request_id=request_id,
                ok=False,
                detail=why,
                version=self.store.version,
                incarnation=self.incarnation,
                moved_to=moved_to,
                placement_version=placement_version,
            ),
        )

    def _reply(self, incoming: Incoming, detail: str = "") -> None:
        request_id = getattr(incoming.message, "request_id", 0)
        self._sock.send(
            incoming.peer,
            PsReply(
                request_id=request_id,
                ok=True,
                detail=detail,
                version=self.store.version,
                incarnation=self.incarnation,
            ),
        )

    # ------------------------------------------------------------ data plane

    def _on_init(self, incoming: Incoming) -> None:
        """Seed an unseeded server, or take a worker's newer copy (resync after a restart)."""
        msg = incoming.message
        assert isinstance(msg, PsInit)
        if msg.version < 0:
            raise ConfigError(f"PsInit.version {msg.version} must be 0 or more")
        store = self.store
        if self.config.await_import and not store.seeded and msg.blocks:
            # A migration's target: its blocks come with the import, not from a
            # worker's initial copy (that would be version 0). An init naming no
            # block (a server a scale-out added that the map gives none yet) has
            # nothing to wait for.
            self._waiting_inits.append(incoming)
            return
        if store.seeded:
            for spec in msg.blocks:
                held = store.params.get(spec.block_id)
                if held is not None and block_spec(spec.block_id, held) != spec:
                    raise ConfigError(
                        f"block {spec.block_id} is {list(held.shape)} {held.dtype} here, the "
                        f"worker's is {spec.shape} {spec.dtype}: every worker must build "
                        "the same model"
                    )
        if msg.with_data and (not store.seeded or msg.version > store.version):
            held_version = store.version
            tensors = self._tensors(incoming, msg.blocks)
            if not store.seeded:
                store.seed(optimizer_from_wire(msg.optimizer), tensors, msg.version)
                logger.info(
                    "seeded by worker %d: %d blocks at version %d",
                    msg.worker,
                    len(tensors),
                    msg.version,
                )
            elif store.offer(msg.version, tensors):
                logger.warning(
                    "took worker %d's copy of %d blocks at version %d (held %d; optimizer "
                    "state kept)",
                    msg.worker,
                    len(tensors),
                    msg.version,
                    held_version,
                )
            self._answer_waiting()
        self._sock.send(
            incoming.peer,
            PsInitReply(
                request_id=msg.request_id,
                seeded=store.seeded,
                version=store.version,
                incarnation=self.incarnation,
                recovered_at=store.recovered_at,
                mode=store.mode,
            ),
        )

    def _on_ping(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsPing)
        self._sock.send(
            incoming.peer,
            PsReply(
                request_id=msg.request_id,
                ok=True,
                version=self.store.version,
                incarnation=self.incarnation,
                holding=bool(msg.awaiting) and self._holds(incoming.peer, msg.awaiting),
            ),
        )

    def _holds(self, peer: bytes, request_id: int) -> bool:
        """Whether ``peer``'s request ``request_id`` waits here for its answer."""
        waiting = (
            self._waiting_pulls,
            self._waiting_pushes,
            self._waiting_inits,
            self._waiting_exports,
            self._waiting_imports,
        )
        return self._slowdown.holds(peer, request_id) or any(
            w.peer == peer and getattr(w.message, "request_id", 0) == request_id
            for queue in waiting
            for w in queue
        )

    def _on_pull(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsPull)
        store = self.store
        missing = [b for b in msg.blocks if b not in store.params]
        if store.seeded and missing:
            raise ConfigError(f"blocks {missing} are not on this server; the placement changed")
        # What the other workers' pushes decide: the version, and for a settled
        # pull a step without records. Once there, the barrier (``waited_s``) ends.
        has_version = store.seeded and store.version >= msg.min_version
        unsettled = msg.settled and store.open_samples > 0
        if has_version and not unsettled:
            self._pull_version_at.setdefault(incoming, time.monotonic())
        injected = self._hold_until and time.monotonic() < self._hold_until
        # A held block is at its fence (a hold begins there, and no step after it
        # can apply): whatever version it asked for, the answer would be the fence's.
        reassigning = self._moved.fence_of(msg.blocks) is not None
        if not has_version or unsettled or injected or reassigning:
            # A client has one pull out per server: a newer one replaces the older.
            for older in [w for w in self._waiting_pulls if w.peer == incoming.peer]:
                self._waiting_pulls.remove(older)
                self._pull_version_at.pop(older, None)
            self._waiting_pulls.append(incoming)
            return
        version_at = self._pull_version_at.pop(incoming)
        waited_s = max(0.0, version_at - incoming.received)
        # Answered now: no hold may begin for this version any more (``moved``),
        # though a slow link sends it later.
        self._moved.sent(msg.blocks, store.version)
        nbytes = sum(store.params[b].nbytes for b in msg.blocks)
        delay = self._slowdown.transfer_delay(nbytes)
        if delay > 0:
            send = functools.partial(self._send_params, incoming, msg, waited_s=waited_s)
            self._slowdown.defer(delay, incoming, send)
        else:
            self._send_params(incoming, msg, waited_s=waited_s)

    def _send_params(self, incoming: Incoming, msg: PsPull, *, waited_s: float) -> None:
        store = self.store
        if any(b not in store.params for b in msg.blocks):  # gone while a slow link held it
            self._waiting_pulls.append(incoming)
            self._answer_pulls()
            return
        tracker = self._sock.send(
            incoming.peer,
            PsParams(
                request_id=msg.request_id,
                version=store.version,
                blocks=msg.blocks,
                incarnation=self.incarnation,
                waited_s=waited_s,
            ),
            [as_buffer(store.params[b]) for b in msg.blocks],
            track=True,
        )
        self._moved.sent(msg.blocks, store.version)
        for b in msg.blocks:
            pending = [t for t in store.in_flight.get(b, []) if not getattr(t, "done", True)]
            pending.append(tracker)
            store.in_flight[b] = pending

    def _answer_pulls(self) -> None:
        waiting, self._waiting_pulls = self._waiting_pulls, []
        for incoming in waiting:
            if self._redirect(incoming):  # its blocks left while it waited
                self._pull_version_at.pop(incoming, None)
                continue
            try:
                self._on_pull(incoming)
            except ConfigError as exc:
                self._pull_version_at.pop(incoming, None)
                self._refuse(incoming, str(exc))

    def _answer_waiting(self) -> None:
        """Answer what can be answered now, after the version or the blocks
        changed otherwise than by an update (``_after_update``'s order)."""
        self._answer_exports()
        self._answer_imports()
        self._answer_pulls()
        self._answer_pushes()

    def _on_push(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsPush)
        if not self.store.seeded or self._moved.holds_push(msg, asp=self.store.mode == "asp"):
            # Only a migration's target sees the first: a client redirected to it
            # before the supervisor's import arrived. The second: a step a held
            # block may no longer take here (a late push of an earlier step is
            # answered as ever). Both wait like a pull.
            self._waiting_pushes.append(incoming)
            return
        specs = []
        for b in msg.blocks:
            held = self.store.params.get(b)
            if held is None:
                raise ConfigError(f"block {b} is not on this server; the placement changed")
            specs.append(block_spec(b, held))
        grads = self._tensors(incoming, specs)
        result = self.store.push(msg.worker, msg.step, msg.samples, grads)
        if not result.accepted:
            logger.info(
                "worker %d's gradient for step %d came after the step; dropped",
                msg.worker,
                msg.step,
            )
        self._sock.send(
            incoming.peer,
            PsPushAck(
                request_id=msg.request_id,
                step=msg.step,
                accepted=result.accepted,
                version=self.store.version,
                incarnation=self.incarnation,
            ),
        )
        self._after_update(result.update)

    def _tensors(self, incoming: Incoming, specs: list[PsBlockSpec]) -> dict[int, torch.Tensor]:
        if len(incoming.frames) != len(specs):
            raise WireError(f"{len(incoming.frames)} tensor frames for {len(specs)} blocks")
        return {
            s.block_id: tensor_from_frame(f, s) for s, f in zip(specs, incoming.frames, strict=True)
        }

    def _answer_pushes(self) -> None:
        waiting, self._waiting_pushes = self._waiting_pushes, []
        for incoming in waiting:
            if self._redirect(incoming):
                continue
            try:
                self._on_push(incoming)
            except (ConfigError, WireError) as exc:
                self._refuse(incoming, str(exc))

    def _after_update(self, update: PsUpdate | None) -> None:
        if update is None:
            return
        # A contended server is slow at what it does per step: the pulls waiting
        # for this update are answered only after the injected delay (the loop
        # goes on answering control requests meanwhile).
        update, delay = self._slowdown.apply(update)
        if delay > 0:
            self._hold_until = time.monotonic() + delay
        self.updates.append(dataclasses.replace(update, ended_s=time.monotonic() + delay))
        if update.dropped:
            logger.info(
                "step %d applied without workers %s (backup %d)",
                update.step,
                update.dropped,
                self.store.backup,
            )
        # Exports first: one on hold from this version must hold its blocks before
        # a pull of this version for them is answered (the old placement's copy).
        self._answer_exports()
        self._answer_imports()
        self._answer_pulls()

    # ------------------------------------------------------------ control plane

    def _on_snapshot(self, incoming: Incoming) -> None:
        if not self.store.seeded:
            raise ConfigError("nothing to snapshot: this server is not seeded yet")
        self._reply(incoming, str(self.snapshot()))

    def _maybe_snapshot(self) -> None:
        interval = self.config.snapshot_interval_s
        if (
            interval > 0
            and self.store.params  # a server that gave its blocks away keeps its last one
            and self.config.snapshot_path is not None
            and time.monotonic() - self._last_snapshot >= interval
        ):
            self.snapshot()

    def _on_stats(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsStatsRequest)
        store = self.store
        self._sock.send(
            incoming.peer,
            PsStats(
                request_id=msg.request_id,
                server=self.config.rank,
                version=store.version,
                mode=store.mode,
                backup=store.backup,
                workers=sorted(store.members),
                blocks=sorted(store.params),
                updates=[u for u in self.updates if u.version > msg.since_version],
                incarnation=self.incarnation,
                redirected=self._moved.redirected,
                now_s=time.monotonic(),
                assigned=sorted(store.assigned),
                waiting_for=store.waiting_for(),
                held=self._held_workers(),
            ),
        )


    def _on_shutdown(self, incoming: Incoming) -> None:
        if self.config.snapshot_path is not None and self.store.params:
            self.snapshot()
        self._reply(incoming)
        self._linger_ms = SHUTDOWN_LINGER_MS  # let the answer reach the wire
        self._running = False
