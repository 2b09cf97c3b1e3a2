"""When a plain ZeroMQ socket may hold a message, told to one receiver on the
running event loop (``Readiness``). The supervisor's ROUTER and the peers'
DEALERs (``sockets.py``) are plain ``zmq.Socket`` objects watched by the loop,
not ``zmq.asyncio`` sockets: at thousands of messages a second a future and
scheduled callbacks per send and receive cost more than the message. This is
the watching, with the traps ZeroMQ's ``ZMQ_FD`` sets (see the class).
"""

from __future__ import annotations

import asyncio
import logging
import select

import zmq

__all__ = ["FD_RECHECK_S", "Readiness"]

logger = logging.getLogger(__name__)

FD_RECHECK_S = 1.0  # the longest a receiver waits without asking ZMQ_EVENTS again


def _resolve(future: asyncio.Future[bool], signalled: bool) -> None:
    if not future.done():
        future.set_result(signalled)


class Readiness:
    """Tells one receiver, on the running event loop, when a plain ZeroMQ socket
    may hold a message: the loop watches its ``ZMQ_FD``, and ``ZMQ_EVENTS`` is
    asked before and after every wait (the FD signals changes, not a level).

    The traps, each with a test in ``tests/test_sockets.py``:

    * the number ZeroMQ gave the FD may still be in the loop's table for a
      closed socket (pyzmq's asyncio poller unregisters its sockets late, or
      never): adding over that entry would leave the kernel watching nothing, so
      any entry is removed first, and a wait is bounded (``FD_RECHECK_S``), after
      which the FD is watched afresh;
    * the FD is watched level-triggered and stays readable until the socket
      handles its pending commands: with no receiver waiting, its signal is
      consumed at once (asking ``ZMQ_EVENTS``), or the loop would spin;
    * a timer, not ``asyncio.wait_for``, bounds a wait: in Python 3.11 that can
      swallow a cancellation that comes with the wake-up;
    * uvloop runs due timers before I/O callbacks: a signal that comes in the
      iteration in which that timer is due finds the wait resolved already, and
      still counts (else it would pass for a lost wakeup); and the receiver
      itself resumes in that iteration before its poll, so a message that came
      since the last poll, its FD readable, is no lost wakeup either (``_lost``).
    """

    def __init__(self, sock: zmq.Socket[bytes], name: str) -> None:
        self._sock: zmq.Socket[bytes] | None = sock
        self._name = name
        self._waiting: asyncio.Future[bool] | None = None
        # The FD signalled after the recheck timer had resolved the wait: uvloop
        # runs due timers before I/O callbacks, so both can come in one iteration.
        self._signal_after_timer = False
        self._loop: asyncio.AbstractEventLoop | None = None  # watching the FD

    def watch(self) -> None:
        """Have the running loop watch the socket's FD (again, if it was already)."""
        sock = self._sock
        if sock is None:
            return
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop and not self._loop.is_closed():
            self._loop.remove_reader(sock.FD)
        self._loop = loop
        loop.remove_reader(sock.FD)
        loop.add_reader(sock.FD, self._signalled)

    async def wait(self, limit: float | None = None) -> None:
        """Return when a message may be queued, or after ``limit`` seconds."""
        sock = self._sock
        if sock is None or int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            return
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self.watch()
        waiting: asyncio.Future[bool] = loop.create_future()
        self._waiting = waiting
        self._signal_after_timer = False
        bound = FD_RECHECK_S if limit is None else min(limit, FD_RECHECK_S)
        recheck = loop.call_later(bound, _resolve, waiting, False)
        try:
            signalled = await waiting or self._signal_after_timer
        finally:
            recheck.cancel()
            self._waiting = None
        if not signalled and self._sock is sock and self._lost(sock):
            logger.warning(
                "%s: a message was queued but the loop was not told; watching the "
                "socket's FD afresh",
                self._name,
            )
            self.watch()

    @staticmethod
    def _lost(sock: zmq.Socket[bytes]) -> bool:
        """After a wait the timer ended: whether a message is queued that the FD
        never told of. uvloop resumes the receiver in the iteration in which the
        timer came due, before that iteration's poll: a message that arrived
        meanwhile has made the FD readable, and its signal is on its way; only
        a message queued with the FD quiet was a lost wakeup. The FD is read
        first: asking ZMQ_EVENTS consumes its signal."""
        poller = select.poll()
        poller.register(sock.FD, select.POLLIN)
        pending = bool(poller.poll(0))
        return bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN) and not pending

    def _signalled(self) -> None:
        waiting = self._waiting
        if waiting is not None:
            if waiting.done():
                self._signal_after_timer = True
            else:
                waiting.set_result(True)
        elif self._sock is not None:
            self._sock.getsockopt(zmq.EVENTS)

    def wake(self) -> None:
        """A send or close changed the socket's events: a waiting receiver checks
        ``ZMQ_EVENTS`` itself (a send handles the socket's pending commands, so
        the FD may have signalled and been consumed)."""
        if self._waiting is not None:
            _resolve(self._waiting, True)

    def stop(self) -> None:
        """Before the socket closes: stop watching, wake a waiting receiver."""
        if self._sock is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.FD)
        self._loop = None
        self.wake()
        self._sock = None
