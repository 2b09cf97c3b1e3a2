"""Commands to PS servers, as the supervisor (or a test, or a benchmark) sends them.

Imports no torch (the supervisor never does): only ``ExportedBlocks.tensors``
needs it, and imports it when called.

``ServerControl`` is a blocking request/answer client for one server:
membership (the workers a BSP step waits for, BACKUP's b), statistics (update
times, dropped workers), snapshots, block export/import, shutdown.
``migrate`` moves blocks between two servers at a step boundary under the
version counter (PSLD §5.2): the source exports them once its version reaches
``at_version`` and no step is open, the destination imports them with their
optimizer state and that version, and only then does the source forget them.

A live reassignment between running servers (the supervisor's
``psfleet.reassign`` drives it) uses the same calls in three steps around the
commit of the job's placement map ``V``: ``export(hold=True)`` at each source
(the blocks stay there, on hold from the fence ``at_version``),
``import_blocks`` at each target (waits there until the target reaches the
fence), then ``release(blocks, V)`` at the sources. Rolled back before the
commit: ``release(blocks, 0)`` at every target, and only then ``hold_end`` at
the sources: the workers the hold lets go push the old map's blocks, which a
target still holding imported ones refuses as a stale placement.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import zmq

from dtlaunch.errors import PsError
from dtlaunch.ps.transport import ServerLink, new_context
from dtlaunch.wire.keys import PeerKeys
from dtlaunch.wire.messages import (
    Message,
    PsExport,
    PsExported,
    PsHoldEnd,
    PsImport,
    PsMembership,
    PsRelease,
    PsReply,
    PsShutdown,
    PsSnapshotNow,
    PsStats,
    PsStatsRequest,
)

if TYPE_CHECKING:
    import torch

__all__ = ["ExportedBlocks", "ServerControl", "migrate"]

DEFAULT_TIMEOUT_S = 60.0
STOP_POLL_S = 0.25  # how soon a request being waited for notices ``stop``
EXPORT_MARGIN_S = 2.0  # the server gives up on an export this much before its caller


@dataclasses.dataclass(frozen=True, slots=True)
class ExportedBlocks:
    """A PsExported with its frames (kept alive for a PsImport elsewhere)."""

    message: PsExported
    frames: list[zmq.Frame]

    def tensors(self) -> dict[int, dict[str, torch.Tensor]]:
        """Each block's ``param`` and state tensors (views of the frames)."""
        # torch only here: the supervisor drives servers through this module without it.
        from dtlaunch.ps.frames import tensor_from_frame

        out: dict[int, dict[str, torch.Tensor]] = {}
        frames = iter(self.frames)
        for record in self.message.blocks:
            named = {"param": tensor_from_frame(next(frames), record.block)}
            for name in record.tensors:
                named[name] = tensor_from_frame(next(frames), record.block)
            out[record.block.block_id] = named
        return out


class ServerControl:
    """See the module docstring. Raises ``PsError`` when the server refuses or is silent."""

    def __init__(
        self,
        endpoint: str,
        keys: PeerKeys,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        stop: threading.Event | None = None,
    ) -> None:
        """``stop``: set it to give up a request being waited for (``PsError``)."""
        self.endpoint = endpoint
        self._timeout = timeout
        self._stop = stop
        self._ctx = new_context()
        self._link = ServerLink(
            self._ctx, endpoint, keys, b"control:%d:%d" % (os.getpid(), id(self))
        )
        self._ids = itertools.count(1)

    def membership(self, workers: Sequence[int], backup: int = 0) -> int:
        """Set the active workers and BACKUP's b; returns the server's version."""
        reply = self._request(PsMembership(request_id=0, workers=list(workers), backup=backup))
        return _ok(reply).version

    def set_backup(self, backup: int) -> int:
        """BACKUP_WORKERS' b alone (the workers a step waits for stay); returns the version."""
        msg = PsMembership(request_id=0, workers=[], backup=backup, backup_only=True)
        return _ok(self._request(msg)).version

    def stats(self, since_version: int = 0) -> PsStats:
        reply = self._request(PsStatsRequest(request_id=0, since_version=since_version))
        if not isinstance(reply, PsStats):
            raise PsError(f"{self.endpoint}: stats answered with {reply.TYPE}")
        return reply

    def snapshot(self) -> str:
        """Write the server's snapshot now; returns its path."""
        return _ok(self._request(PsSnapshotNow(request_id=0))).detail

    def export(
        self,
        blocks: Sequence[int],
        *,
        at_version: int = 0,
        remove: bool = True,
        moved_to: str = "",
        hold: bool = False,
    ) -> ExportedBlocks:
        """The blocks with their optimizer state, once the server's version is
        ``at_version`` and no step is open; ``moved_to`` (with ``remove``) sends the
        clients that still ask for them there. The server drops the request when
        this client's timeout runs out, so nothing is exported to nobody.

        ``hold`` (a reassignment, with ``remove=False``): the server keeps the
        blocks but answers no pull for them from ``at_version`` on, until
        ``release`` or ``hold_end``. Refused (``PsError``) when the server is past
        ``at_version`` already, or at it with a pull of it answered for the blocks:
        pick a later fence."""
        reply, frames = self._request_frames(
            PsExport(
                request_id=0,
                blocks=list(blocks),
                at_version=at_version,
                remove=remove,
                moved_to=moved_to,
                wait_s=max(0.0, self._timeout - EXPORT_MARGIN_S),
                hold=hold,
            )
        )
        if not isinstance(reply, PsExported):
            raise PsError(f"{self.endpoint}: export answered with {reply.TYPE}")
        return ExportedBlocks(reply, frames)

    def import_blocks(self, exported: ExportedBlocks, *, with_members: bool = False) -> int:
        """Take the blocks over; ``with_members``: the exporter's membership and b
        too (a whole server replaced), set before any waiting push counts."""
        msg = exported.message
        request = PsImport(
            request_id=0,
            version=msg.version,
            optimizer=msg.optimizer,
            blocks=msg.blocks,
            with_members=with_members,
            workers=msg.workers,
            backup=msg.backup,
        )
        return _ok(self._request(request, exported.frames)).version

    def release(self, blocks: Sequence[int], placement_version: int) -> int:
        """Drop ``blocks`` (those not held are ignored); with ``placement_version``
        > 0 the requests naming them, those held now and any later, are answered
        that the job's map of that version put them elsewhere. 0: only drop them
        (a target rolling an import back). Returns the server's version."""
        msg = PsRelease(request_id=0, blocks=list(blocks), placement_version=placement_version)
        return _ok(self._request(msg)).version

    def hold_end(self, blocks: Sequence[int]) -> int:
        """Serve held ``blocks`` again (a reassignment rolled back): the requests
        held for them are answered as usual, and an export on hold of them still
        waiting for its fence is refused. Send it once every target that imported
        them dropped them (``release(blocks, 0)``). Returns the server's version."""
        return _ok(self._request(PsHoldEnd(request_id=0, blocks=list(blocks)))).version

    def shutdown(self) -> None:
        _ok(self._request(PsShutdown(request_id=0)))

    def close(self) -> None:
        self._link.close()
        self._ctx.term()

    def __enter__(self) -> ServerControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, msg: Message, payloads: Sequence[Any] = ()) -> Message:
        return self._request_frames(msg, payloads)[0]

    def _request_frames(
        self, msg: Message, payloads: Sequence[Any] = ()
    ) -> tuple[Message, list[zmq.Frame]]:
        request_id = next(self._ids)
        self._link.send(
            dataclasses.replace(msg, request_id=request_id),  # type: ignore[call-arg]
            payloads,
        )
        deadline = time.monotonic() + self._timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._stop is not None and self._stop.is_set():
                raise PsError(f"{self.endpoint}: {msg.TYPE} abandoned (stopping)")
            if not self._link.sock.poll(int(min(left, STOP_POLL_S) * 1000) + 1):
                continue
            got = self._link.recv_now()
            if got is not None and getattr(got[0], "request_id", None) == request_id:
                reply, frames = got
                if isinstance(reply, PsReply) and not reply.ok:
                    raise PsError(f"{self.endpoint}: {msg.TYPE} refused: {reply.detail}")
                return reply, frames
        raise PsError(f"{self.endpoint}: no answer to {msg.TYPE} within {self._timeout:.0f}s")


def migrate(
    source: ServerControl,
    target: ServerControl,
    blocks: Sequence[int],
    *,
    at_version: int = 0,
    redirect: bool = False,
) -> int:
    """Move ``blocks`` from ``source`` to ``target`` with their optimizer state.

    Returns the version they moved at. With ``redirect`` the source sends the
    clients that ask it for the blocks to the target (a server replaced as a
    whole); without, the workers must switch to a new placement themselves
    (``Client.use_placement``) from that version on.
    """
    moved_to = target.endpoint if redirect else ""
    exported = source.export(blocks, at_version=at_version, remove=True, moved_to=moved_to)
    target.import_blocks(exported, with_members=redirect)
    return exported.message.version


def _ok(reply: Message) -> PsReply:
    if not isinstance(reply, PsReply):
        raise PsError(f"expected a reply, got {reply.TYPE}")
    return reply
