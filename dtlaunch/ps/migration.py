"""Block migration and reassignment on a server (PSLD §5.2): the ``PsExport`` /
``PsImport`` / ``PsRelease`` / ``PsHoldEnd`` handlers of ``PsServer`` (a mixin)
and the frames the blocks travel in.

Blocks travel with their optimizer state: ``PsExported``/``PsImport`` records
plus one frame for the parameter and one per optimizer-state tensor, in order.
No copies on the way out; copies on the way in (the frames' memory belongs to
ZeroMQ's message). An export waits for its ``at_version`` and a step boundary,
but no longer than its ``wait_s``: a caller that gave up must not find the
blocks exported to nobody later.

A migration (a whole server replaced) removes the blocks at the export and
imports them into an unseeded server, whatever its version. A reassignment
between running servers (``moved``' docstring has the protocol) exports with
``hold``: refused when the fence is passed already, else the blocks stay here,
held from the fence on. A seeded target takes an import at its own version
only: one ahead waits until the target gets there, one behind is refused (the
blocks would miss the steps the target applied since); a target that holds no
block takes it at any version. ``PsRelease`` drops
blocks (with a placement version: requests for them are answered with it) and
refuses an import of them still waiting; ``PsHoldEnd`` serves held blocks again
and refuses an export on hold of them still waiting for its fence: a request of
a rolled-back reassignment must not take effect later. Both are no-ops for
blocks they do not concern (the supervisor repeats them after a crash).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import zmq

from dtlaunch.errors import ConfigError, WireError
from dtlaunch.ps.frames import (
    as_buffer,
    block_spec,
    optimizer_from_wire,
    optimizer_to_wire,
    tensor_from_frame,
)
from dtlaunch.ps.moved import MovedBlocks
from dtlaunch.ps.optim import BlockState
from dtlaunch.ps.store import ParamStore
from dtlaunch.ps.transport import Incoming, ServerSocket
from dtlaunch.wire.messages import (
    PsBlockState,
    PsExport,
    PsExported,
    PsHoldEnd,
    PsImport,
    PsPull,
    PsPush,
    PsRelease,
)

__all__ = ["Migrations", "blocks_from_frames", "export_frames"]

logger = logging.getLogger("dtlaunch.ps.server")


class Migrations:
    """``PsServer``'s migration handlers; the attributes are ``PsServer``'s."""

    store: ParamStore
    _sock: ServerSocket
    _moved: MovedBlocks
    _waiting_exports: list[Incoming]
    _export_deadlines: dict[int, float]
    _waiting_inits: list[Incoming]
    _waiting_imports: list[Incoming]
    _waiting_pulls: list[Incoming]
    _waiting_pushes: list[Incoming]

    if TYPE_CHECKING:  # defined by PsServer

        def _refuse(
            self,
            incoming: Incoming,
            why: str,
            *,
            moved_to: str = "",
            placement_version: int = 0,
        ) -> None: ...

        def _reply(self, incoming: Incoming, detail: str = "") -> None: ...

        def _on_init(self, incoming: Incoming) -> None: ...

        def _answer_waiting(self) -> None: ...

    def _on_export(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsExport)
        missing = [b for b in msg.blocks if b not in self.store.params]
        if missing:
            raise ConfigError(f"cannot export blocks {missing}: not on this server")
        asp = self.store.mode == "asp"
        if msg.hold:
            # Checked on arrival and each time it waits on: the fence passes while
            # a step is open at it (that step's pushes were computed on the fence's pull).
            # ASP has no step boundary: the blocks are held from the export on, and
            # every push for them waits for the new map (``moved.holds_push``).
            if msg.remove:
                raise ConfigError("an export on hold keeps its blocks: send it with remove=False")
            too_late = self._moved.fence_passed(msg.blocks, msg.at_version, self.store.version)
            if too_late and not asp:
                raise ConfigError(f"cannot hold blocks from version {msg.at_version}: {too_late}")
            already = self._moved.held(msg.blocks)
            if already:
                raise ConfigError(f"blocks {already} are on hold for another reassignment")
        if not asp and (self.store.version < msg.at_version or self.store.step_open):
            if incoming not in self._waiting_exports:
                self._waiting_exports.append(incoming)
                self._export_deadlines[id(incoming)] = (
                    time.monotonic() + msg.wait_s if msg.wait_s > 0 else 0.0
                )
            return
        self._export_deadlines.pop(id(incoming), None)
        store = self.store
        assert store.optimizer is not None
        records, payloads = export_frames(store, msg.blocks)
        self._sock.send(
            incoming.peer,
            PsExported(
                request_id=msg.request_id,
                version=store.version,
                optimizer=optimizer_to_wire(store.optimizer),
                blocks=records,
                workers=sorted(store.members),
                backup=store.backup,
            ),
            payloads,
        )
        if msg.hold:
            self._moved.hold(msg.blocks, store.version)
            logger.info("exported blocks %s at version %d; on hold", msg.blocks, store.version)
        if msg.remove:  # the frames keep the tensors alive until they are sent
            store.release(msg.blocks)
            if msg.moved_to:
                self._moved.moved(msg.blocks, msg.moved_to)
            logger.info(
                "exported blocks %s at version %d%s",
                msg.blocks,
                store.version,
                f" to {msg.moved_to}" if msg.moved_to else "",
            )

    def _expire_exports(self) -> None:
        """Refuse exports kept waiting past their ``wait_s``: their caller gave up."""
        now = time.monotonic()
        for incoming in list(self._waiting_exports):
            deadline = self._export_deadlines.get(id(incoming), 0.0)
            if deadline and now >= deadline:
                self._waiting_exports.remove(incoming)
                del self._export_deadlines[id(incoming)]
                self._refuse(incoming, "export expired before a step boundary; nothing moved")

    def _answer_exports(self) -> None:
        waiting, self._waiting_exports = self._waiting_exports, []
        for incoming in waiting:
            try:
                self._on_export(incoming)
            except ConfigError as exc:
                self._export_deadlines.pop(id(incoming), None)
                self._refuse(incoming, str(exc))

    def _on_import(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsImport)
        store = self.store
        # A server that holds no block has no steps a block could miss: it takes
        # the import at the blocks' version (a server added by a scale-out whose
        # first try was rolled back, one every block was moved off).
        # ASP versions count pushes, each server its own: an import is taken as it comes.
        if store.seeded and store.params and msg.version != store.version and store.mode != "asp":
            if msg.version > store.version:  # a target still finishing the step before
                if incoming not in self._waiting_imports:
                    self._waiting_imports.append(incoming)
                return
            raise ConfigError(
                f"cannot import blocks of version {msg.version}: this server is at version "
                f"{store.version}, so they would miss the steps it applied since; export them "
                "at a later version"
            )
        blocks = blocks_from_frames(msg.blocks, incoming.frames)
        store.adopt(optimizer_from_wire(msg.optimizer), msg.version, blocks)
        if msg.with_members:  # before any queued push counts toward a step
            store.set_members(msg.workers, msg.backup)
        self._moved.returned(blocks)
        logger.info("imported blocks %s at version %d", sorted(blocks), msg.version)
        self._reply(incoming)
        waiting, self._waiting_inits = self._waiting_inits, []
        for init in waiting:
            self._on_init(init)
        self._answer_waiting()

    def _answer_imports(self) -> None:
        waiting, self._waiting_imports = self._waiting_imports, []
        for incoming in waiting:
            try:
                self._on_import(incoming)
            except (ConfigError, WireError) as exc:
                self._refuse(incoming, str(exc))

    def _on_release(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsRelease)
        held = [b for b in msg.blocks if b in self.store.params]
        self._moved.end_hold(msg.blocks)
        self.store.release(msg.blocks)
        if msg.placement_version > 0:
            self._moved.reassigned(msg.blocks, msg.placement_version)
        self._drop_waiting(
            self._waiting_imports, msg.blocks, "the blocks were released before the import"
        )
        if held:
            logger.info(
                "released blocks %s%s",
                held,
                f": placement map version {msg.placement_version} put them elsewhere"
                if msg.placement_version
                else "",
            )
        # The requests held for them learn the new map before the supervisor hears
        # the release is done.
        self._answer_waiting()
        self._reply(incoming)

    def _on_hold_end(self, incoming: Incoming) -> None:
        msg = incoming.message
        assert isinstance(msg, PsHoldEnd)
        ended = self._moved.end_hold(msg.blocks)
        self._drop_waiting(
            [w for w in self._waiting_exports if _holds(w)],
            msg.blocks,
            "the reassignment was rolled back before its fence",
        )
        if ended:
            logger.info("blocks %s are served here again (reassignment rolled back)", ended)
        self._answer_waiting()
        self._reply(incoming)

    def _held_workers(self) -> list[int]:
        """Workers whose pull or push waits here only because a block it names is
        on hold for a reassignment (``moved``): they move on once the hold ends."""
        held: set[int] = set()
        for incoming in self._waiting_pulls:
            msg = incoming.message
            if isinstance(msg, PsPull) and self._moved.fence_of(msg.blocks) is not None:
                held.add(msg.worker)
        for incoming in self._waiting_pushes:
            msg = incoming.message
            if isinstance(msg, PsPush) and self._moved.holds_push(
                msg, asp=self.store.mode == "asp"
            ):
                held.add(msg.worker)
        return sorted(held)

    def _drop_waiting(self, requests: list[Incoming], blocks: Sequence[int], why: str) -> None:
        """Refuse the waiting exports and imports among ``requests`` that name one
        of ``blocks``: a reassignment rolled back, so none may take effect later."""
        dropped = set(blocks)
        for incoming in list(requests):
            if dropped.isdisjoint(_named_blocks(incoming)):
                continue
            for queue in (self._waiting_exports, self._waiting_imports):
                if incoming in queue:
                    queue.remove(incoming)
            self._export_deadlines.pop(id(incoming), None)
            self._refuse(incoming, why)


def _holds(incoming: Incoming) -> bool:
    return isinstance(incoming.message, PsExport) and incoming.message.hold


def _named_blocks(incoming: Incoming) -> list[int]:
    msg = incoming.message
    if isinstance(msg, PsExport):
        return list(msg.blocks)
    if isinstance(msg, PsImport):
        return [b.block.block_id for b in msg.blocks]
    return []


def export_frames(store: ParamStore, blocks: Sequence[int]) -> tuple[list[PsBlockState], list[Any]]:
    """The records and frame payloads of ``blocks`` (views of the store's tensors)."""
    records: list[PsBlockState] = []
    payloads: list[Any] = []
    for b in blocks:
        param, state = store.params[b], store.states[b]
        names = sorted(state.tensors)
        records.append(PsBlockState(block=block_spec(b, param), step=state.step, tensors=names))
        payloads.append(as_buffer(param))
        payloads += [as_buffer(state.tensors[n]) for n in names]
    return records, payloads


def blocks_from_frames(
    records: Sequence[PsBlockState], frames: Sequence[zmq.Frame]
) -> dict[int, tuple[torch.Tensor, BlockState]]:
    """Each block's parameter and optimizer state, copied out of the frames.

    Raises:
        WireError: the frames do not match the records.
    """
    expected = sum(1 + len(b.tensors) for b in records)
    if len(frames) != expected:
        raise WireError(f"{len(frames)} frames, the blocks need {expected}")
    it = iter(frames)
    blocks: dict[int, tuple[torch.Tensor, BlockState]] = {}
    for record in records:
        spec = record.block
        param = tensor_from_frame(next(it), spec).clone()
        state = {n: tensor_from_frame(next(it), spec).clone() for n in record.tensors}
        blocks[spec.block_id] = (param, BlockState(step=record.step, tensors=state))
    return blocks
