"""Talk to a running supervisor from outside: ``dtlaunch stop``, ``scale`` and ``status``.

Uses the run directory's CURVE client key, so only someone who can read the run
directory (mode 0700 keys) can control the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import zmq.asyncio

from dtlaunch.errors import ConfigError, DtlaunchError, RunDirError
from dtlaunch.supervisor.rundir import RunDir
from dtlaunch.supervisor.status.tracker import STATUS_PREFIX
from dtlaunch.ui.status_model import snapshot_from_run_dir
from dtlaunch.version import __version__
from dtlaunch.wire.keys import load_run_keys
from dtlaunch.wire.messages import (
    Ack,
    Hello,
    Message,
    ScaleJob,
    StatusReply,
    StatusRequest,
    StatusSnapshot,
    StopJob,
    Welcome,
)
from dtlaunch.wire.sockets import Dealer

__all__ = ["StatusSource", "request_scale", "request_stop"]

# After --timeout without an answer the event log is folded, and an answer that
# still comes meanwhile wins: a busy supervisor answers in seconds, while folding
# the log of a long job of 1,000 workers took a minute. This long at most.
LATE_ANSWER_MAX_S = 120.0


async def request_stop(run_dir: Path, *, timeout: float) -> str:  # noqa: ASYNC109
    """Ask the supervisor of ``run_dir`` to stop its job; returns its answer.

    Raises:
        RunDirError: not a run directory, the job already ended, or no answer.
    """
    answer = await _control_request(run_dir, StopJob(reason="dtlaunch stop"), timeout=timeout)
    return f"stop requested: {answer.detail}"


async def request_scale(
    run_dir: Path,
    *,
    workers: int,
    timeout: float,  # noqa: ASYNC109
    servers: int = 0,
) -> str:
    """Ask the supervisor of ``run_dir`` to run ``workers`` workers and ``servers``
    built-in parameter servers (0: as many as now); returns its answer.

    Raises:
        RunDirError: not a run directory, the job already ended, or no answer.
        ConfigError: the supervisor refused (its reason and the fix).
    """
    request = ScaleJob(workers=workers, servers=servers, reason="dtlaunch scale")
    answer = await _control_request(run_dir, request, timeout=timeout)
    if not answer.ok:
        raise ConfigError(f"scale refused: {answer.detail}")
    return f"scaling: {answer.detail}"


async def _control_request(run_dir: Path, request: Message, *, timeout: float) -> Ack:  # noqa: ASYNC109
    """Say Hello as a control client, send ``request``, return the supervisor's Ack."""
    run = RunDir.open(run_dir)
    if run.summary_path.exists():
        raise RunDirError(f"the job in {run_dir} has already ended (see summary.json)")
    info = run.supervisor()
    keys = load_run_keys(run.keys)
    ctx = zmq.asyncio.Context()
    identity = f"control:{os.getpid()}".encode()
    try:
        async with Dealer(ctx, str(info["endpoint"]), keys.peer(), identity) as dealer:
            await dealer.send(
                Hello(
                    role="control",
                    run_id=run.spec().run_id,
                    host="",
                    pid=os.getpid(),
                    version=__version__,
                )
            )
            welcome = await dealer.recv(timeout=timeout)
            if not isinstance(welcome, Welcome):
                raise RunDirError(
                    f"no supervisor answers at {info['endpoint']} (pid {info['pid']}): the job "
                    "has ended or its supervisor died"
                )
            await dealer.send(request)
            while True:
                answer = await dealer.recv(timeout=timeout)
                if answer is None:
                    raise RunDirError(
                        f"the supervisor did not answer the {request.TYPE} request "
                        f"within {timeout:g} s"
                    )
                if isinstance(answer, Ack):
                    return answer
    finally:
        ctx.destroy(linger=0)


class StatusSource:
    """Snapshots of one run: from its live supervisor while it answers, else its log."""

    def __init__(self, run: RunDir, *, timeout: float) -> None:
        self.run = run
        self.timeout = timeout
        self._ctx: zmq.asyncio.Context | None = None
        self._dealer: Dealer | None = None
        self._run_id = ""
        self._request_id = 0
        self._fold: asyncio.Future[StatusSnapshot] | None = None  # at most one at a time

    async def current(self) -> tuple[StatusSnapshot, str]:
        """The newest snapshot and a note on where it came from ("" when live).

        Raises:
            RunDirError: the job has not started and no supervisor answers.
        """
        if self.run.summary_path.exists():
            self.close()
            snap = snapshot_from_run_dir(self.run)
            return snap, f"job ended ({snap.status or 'unknown'}): shown from the event log"
        asked = time.monotonic()
        request_id = await self._ask()
        if request_id is not None:
            snap_live = await self._answer(request_id, self.timeout)
            if snap_live is not None:
                return snap_live, ""
        # No answer yet: fold the log meanwhile, and take whichever comes first.
        fold = self._folded()
        if request_id is not None:
            late = asyncio.ensure_future(self._answer(request_id, LATE_ANSWER_MAX_S))
            racing: set[asyncio.Future[Any]] = {fold, late}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            snap_late = late.result() if late.done() else None
            if snap_late is not None:
                took = time.monotonic() - asked
                return snap_late, f"the supervisor is busy: it answered after {took:.1f} s"
            late.cancel()
        snap = await fold
        self._fold = None
        if self.run.summary_path.exists():
            return snap, f"job ended ({snap.status or 'unknown'}): shown from the event log"
        return snap, (
            f"the supervisor did not answer within {self.timeout:g} s: shown from the event log"
        )

    def _folded(self) -> asyncio.Future[StatusSnapshot]:
        """The event log's snapshot, folded in a daemon thread: the process may
        exit (a live answer came first) without waiting for it."""
        if self._fold is not None:
            return self._fold
        loop = asyncio.get_running_loop()
        fold: asyncio.Future[StatusSnapshot] = loop.create_future()

        def settle(snap: StatusSnapshot | None, error: BaseException | None) -> None:
            if fold.done():
                return
            if error is not None:
                fold.set_exception(error)
            else:
                assert snap is not None
                fold.set_result(snap)

        def work() -> None:
            snap: StatusSnapshot | None = None
            error: BaseException | None = None
            try:
                snap = snapshot_from_run_dir(self.run, in_background=True)
            except BaseException as exc:  # handed to the waiting task, raised there
                error = exc
            # A live answer may have come first and its loop ended: nobody waits.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, snap, error)

        threading.Thread(target=work, name="fold-event-log", daemon=True).start()
        self._fold = fold
        return fold

    async def _ask(self) -> int | None:
        """Send a status request; its id, or None when no supervisor can be asked."""
        dealer = self._connect()
        if dealer is None:
            return None
        self._request_id += 1
        await dealer.send(StatusRequest(request_id=self._request_id, run_id=self._run_id))
        return self._request_id

    async def _answer(self, request_id: int, wait_s: float) -> StatusSnapshot | None:
        dealer = self._connect()
        if dealer is None:
            return None
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            answer = await dealer.recv(timeout=max(0.0, left))
            if answer is None:
                return None
            # Late answers to earlier requests are skipped.
            if isinstance(answer, StatusReply) and answer.request_id == request_id:
                return answer.snapshot

    def _connect(self) -> Dealer | None:
        if self._dealer is not None:
            return self._dealer
        try:
            info = self.run.supervisor()
            keys = load_run_keys(self.run.keys)
            self._run_id = self.run.spec().run_id
        except (DtlaunchError, OSError, ValueError):
            return None  # no supervisor started yet (or no keys): the log will tell
        self._ctx = zmq.asyncio.Context()
        identity = STATUS_PREFIX + str(os.getpid()).encode()
        # The status socket; a supervisor of an earlier version answered on its
        # only one.
        endpoint = str(info.get("status_endpoint") or info["endpoint"])
        self._dealer = Dealer(self._ctx, endpoint, keys.peer(), identity)
        return self._dealer

    def close(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger_ms=0)
            self._dealer = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
