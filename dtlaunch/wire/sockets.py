"""The supervisor's ROUTER and the peers' DEALERs, secured with CURVE and ZAP.

Security model: the ROUTER is a CURVE server with a ZAP domain and
``ZAP_ENFORCE_DOMAIN`` set, and a ZAP authenticator in the same context accepts
exactly one client public key, the run's. libzmq without a ZAP handler lets any
CURVE client in; enforcement makes it refuse instead, so a missing handler fails
closed. A peer speaking plain ZMTP fails the handshake (mechanism mismatch), a
peer with another run's keys is refused by ZAP; neither ever delivers a frame.

Robustness: every received frame goes through ``codec.decode``; a frame that
fails is logged and dropped (``dropped`` counts them), so a bad peer cannot
crash the receiver. libzmq disconnects a peer whose frame exceeds twice the
codec's limit before it is buffered whole; frames between the two limits
arrive and are dropped by the codec, with a log line naming the peer.

One ``Router`` per ``zmq.asyncio.Context``: ZeroMQ has one ZAP endpoint per
context.

Cost: the ROUTER carries every message of a job (thousands a second at 1,000
workers), so it is a plain ``zmq.Socket`` watched by the event loop rather than a
``zmq.asyncio`` socket, which builds a future and schedules callbacks for every
send and receive. A send never blocks (``DONTWAIT``), so it needs no future; a
receive drains what is queued and waits only when nothing is. ZeroMQ's
``ZMQ_FD`` is edge-triggered: it signals a change of the socket's events, not
their level, so the receiver asks ``ZMQ_EVENTS`` before it waits and again after
every wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import typing
from types import TracebackType
from typing import Self

import zmq
import zmq.asyncio

from dtlaunch.errors import ConfigError, WireError
from dtlaunch.wire.codec import MAX_MESSAGE_BYTES, decode, encode
from dtlaunch.wire.keys import PeerKeys, RunKeys
from dtlaunch.wire.messages import Message
from dtlaunch.wire.readiness import Readiness

if typing.TYPE_CHECKING:
    from zmq.auth.asyncio import AsyncioAuthenticator

__all__ = ["ZAP_DOMAIN", "Dealer", "Router"]

logger = logging.getLogger(__name__)

ZAP_DOMAIN = "dtlaunch"

# libzmq cuts a peer off at this frame size; see the module docstring.
SOCKET_MAX_FRAME = 2 * MAX_MESSAGE_BYTES
ROUTER_SNDHWM = 10_000  # per peer; ROUTER drops (does not block) beyond it
DEALER_SNDHWM = 1_000
DEALER_RECONNECT_IVL_MS = 100
DEALER_RECONNECT_IVL_MAX_MS = 2_000
DEALER_CLOSE_LINGER_MS = 100  # long enough to flush a final Bye, short enough not to hang

_HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27; zmq.auth binds it
_SEND_FIRST = zmq.SNDMORE | zmq.DONTWAIT
_WARN_EVERY_S = 30.0  # refused peers retry every few seconds; do not flood the log


class _OneClientKey:
    """ZAP credentials provider accepting only the run's client public key."""

    def __init__(self, client_public: bytes) -> None:
        self._client_public = client_public
        self.refused = 0

    def callback(self, domain: str, key: bytes) -> bool:
        # Imported here: only the supervisor's ROUTER authenticates, and hmac
        # brings hashlib and OpenSSL's libcrypto into every agent's and worker's
        # start (~3 ms of CPU each).
        from hmac import compare_digest

        if domain == ZAP_DOMAIN and compare_digest(key, self._client_public):
            return True
        self.refused += 1
        # Public keys are not secret: naming it helps find the stray peer.
        logger.debug("ZAP refused CURVE key %r in domain %r", key, domain)
        return False


class Router:
    """The supervisor's single ROUTER socket; see the module docstring.

    Use ``async with Router(ctx, keys) as router:`` or ``await start()`` then
    ``close()``. ``recv`` and ``send`` must run on the loop that ran ``start``.
    One task receives (the supervisor's receive loop); any task may send. A
    receiver waiting when ``close()`` is called gets ``RuntimeError``.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        keys: RunKeys,
        bind: str = "tcp://127.0.0.1:0",
        *,
        name: str = "router",
    ) -> None:
        self._ctx = ctx
        self._name = name  # in log lines: the job's router, the status router
        self._keys = keys
        self._bind = bind
        self._sock: zmq.Socket[bytes] | None = None
        self._ready: Readiness | None = None  # tells the receiver of new messages
        self._auth: AsyncioAuthenticator | None = None
        self._zap: _OneClientKey | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._endpoint = ""
        self._last_warning = -_WARN_EVERY_S
        self._last_encoded: tuple[Message, bytes] | None = None  # see send()
        self.dropped = 0  # malformed frames dropped by recv
        self.handshake_failures = 0  # peers refused by CURVE/ZAP or speaking plain ZMTP

    @property
    def refused_keys(self) -> int:
        """How many CURVE handshakes ZAP refused for a wrong client key."""
        return self._zap.refused if self._zap is not None else 0

    async def start(self) -> None:
        """Start the ZAP authenticator, then configure and bind the socket.

        Raises:
            ConfigError: the bind address is invalid or in use.
            RuntimeError: already started, or another authenticator runs in ``ctx``.
        """
        if self._sock is not None:
            raise RuntimeError("Router.start() called twice")
        # Imported here: only the supervisor's ROUTER authenticates, and every
        # agent's and worker's start would pay for it (10 ms of CPU each).
        from zmq.auth.asyncio import AsyncioAuthenticator

        auth = AsyncioAuthenticator(self._ctx, log=logging.getLogger(f"{__name__}.zap"))
        try:
            auth.start()
        except zmq.ZMQError as exc:
            auth.stop()
            raise RuntimeError(
                f"cannot start the ZAP authenticator ({exc}); a ZeroMQ context holds one: "
                "give each Router its own zmq.asyncio.Context"
            ) from exc
        self._zap = _OneClientKey(self._keys.client.public)
        auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self._zap)
        self._auth = auth

        # A plain socket of the asyncio context (see the module docstring), known
        # to the context so that destroying it closes the socket too.
        # (pyzmq's stubs type socket_class as the context's own class only.)
        sock = typing.cast(
            "zmq.Socket[bytes]",
            self._ctx.socket(zmq.ROUTER, socket_class=zmq.Socket),  # type: ignore[arg-type]
        )
        self._sock = sock
        try:
            self._configure(sock)
        except BaseException:
            self.close()
            raise
        self._endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._ready = Readiness(sock, self._name)
        self._ready.watch()
        logger.debug("router bound to %s", self._endpoint)

    def _configure(self, sock: zmq.Socket[bytes]) -> None:
        """Security, limits, the handshake monitor, then the bind."""
        sock.linger = 0
        sock.zap_domain = ZAP_DOMAIN.encode()
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.curve_server = True
        sock.curve_publickey = self._keys.server.public
        sock.curve_secretkey = self._keys.server.secret
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.maxmsgsize = SOCKET_MAX_FRAME
        sock.sndhwm = ROUTER_SNDHWM
        # The monitor's own end is an asyncio socket: it carries a few events.
        monitor_addr = f"inproc://dtlaunch.router-monitor.{id(self)}"
        sock.monitor(monitor_addr, _HANDSHAKE_FAILURES)
        self._monitor = self._ctx.socket(zmq.PAIR)
        self._monitor.connect(monitor_addr)
        self._monitor_task = asyncio.ensure_future(self._watch_handshakes(self._monitor))
        try:
            sock.bind(self._bind)
        except zmq.ZMQError as exc:
            raise ConfigError(
                f"cannot bind the supervisor socket to {self._bind!r}: {exc}. Fix: use "
                "tcp://ADDRESS:PORT with a local address and a free port (0 picks one)"
            ) from exc

    @property
    def endpoint(self) -> str:
        """The bound ``tcp://addr:port`` (the real port when bound to port 0)."""
        if not self._endpoint:
            raise RuntimeError("Router is not started")
        return self._endpoint

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    async def recv(self) -> tuple[bytes, Message]:
        """The next valid message and its sender's routing id; bad frames are dropped."""
        return (await self.recv_many(1))[0]

    async def recv_many(self, limit: int) -> list[tuple[bytes, Message]]:
        """The next valid message, then up to ``limit`` - 1 more that are already
        queued, without waiting for them: at thousands of messages a second the
        event loop's round trip per message costs more than the message.

        Raises:
            ValueError: ``limit`` < 1.
        """
        if limit < 1:
            raise ValueError(f"recv_many needs a limit >= 1, got {limit}")
        # Yield to the loop once per call: with messages always queued this would
        # otherwise return without ever suspending, and a receive loop would hold
        # the event loop for as long as the flood lasts (at 1,000 workers, timers
        # and status answers waited 150-280 ms behind it).
        await asyncio.sleep(0)
        batch: list[tuple[bytes, Message]] = []
        while True:
            sock = self._started()  # again after each wait: close() wakes a receiver
            self._take_queued(sock, limit, batch)
            if batch:
                return batch
            await self._until_readable(sock)

    def _take_queued(
        self, sock: zmq.Socket[bytes], limit: int, batch: list[tuple[bytes, Message]]
    ) -> None:
        while len(batch) < limit:
            try:
                frames = sock.recv_multipart(flags=zmq.DONTWAIT)
            except zmq.Again:
                return
            peer, payload = frames[0], frames[1:]
            if len(payload) != 1:
                self._drop(peer, f"{len(payload)} frames, expected 1", sum(map(len, payload)))
                continue
            try:
                batch.append((peer, decode(payload[0])))
            except WireError as exc:
                self._drop(peer, str(exc), len(payload[0]))

    async def _until_readable(self, sock: zmq.Socket[bytes]) -> None:
        """Wait until a message may be queued (``Readiness``)."""
        if self._ready is not None:
            await self._ready.wait()

    def _wake(self) -> None:
        if self._ready is not None:
            self._ready.wake()

    async def send(self, peer: bytes, msg: Message) -> None:
        """Queue ``msg`` for ``peer``; never blocks.

        ZeroMQ drops it silently when ``peer`` is not connected (ROUTER_MANDATORY
        off) or its queue is full; liveness tracking notices such peers.

        Raises:
            WireError: ``msg`` cannot be encoded (a bug in the caller).
        """
        sock = self._started()
        # One message sent to many peers in a row (a batch plan to 1,000 workers,
        # Shutdown to every agent) is encoded once: messages are frozen records,
        # never changed after they are built.
        last = self._last_encoded
        if last is not None and last[0] is msg:
            data = last[1]
        else:
            data = encode(msg)
            self._last_encoded = (msg, data)
        try:
            # Two sends, not send_multipart, whose per-frame checks in Python cost
            # a seventh of a send (2.3 -> 2.0 us on this machine). A ROUTER takes
            # both frames or drops the message whole (ROUTER_MANDATORY off).
            sock.send(peer, _SEND_FIRST)
            sock.send(data, zmq.DONTWAIT)
        except zmq.Again:
            logger.debug("%s: %s to %r dropped, queue full", self._name, msg.TYPE, peer)
        finally:
            # A send (even a refused one) handles the socket's pending commands, so
            # ZMQ_FD may have signalled and been consumed: a waiting receiver
            # checks ZMQ_EVENTS again.
            self._wake()

    def close(self) -> None:
        """Close the socket, its monitor and the authenticator (idempotent)."""
        if self._monitor_task is not None:
            self._monitor_task.cancel()
            self._monitor_task = None
        if self._sock is not None and self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None
        if self._sock is not None:
            if self._ready is not None:
                self._ready.stop()  # a receiver waiting on the FD finds the socket closed
                self._ready = None
            self._sock.close(linger=0)
            self._sock = None
        # Last: while the ROUTER is open, its ZAP handler must be there.
        if self._auth is not None:
            # Unbinding is immediate, closing is not: a Router started next in
            # this context must find the ZAP endpoint free.
            zap_socket = self._auth.zap_socket
            if zap_socket is not None and not zap_socket.closed:
                with contextlib.suppress(zmq.ZMQError):
                    zap_socket.unbind(_ZAP_ENDPOINT)
            self._auth.stop()
            self._auth = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = self._monitor_task
        self.close()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _started(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            raise RuntimeError("Router is not started (or already closed)")
        return self._sock

    def _drop(self, peer: bytes, reason: str, size: int) -> None:
        self.dropped += 1
        logger.warning("dropped a frame from peer %r (%d bytes): %s", peer[:64], size, reason)

    async def _watch_handshakes(self, monitor: zmq.asyncio.Socket) -> None:
        """Count and log peers that fail the CURVE handshake."""
        import zmq.utils.monitor  # the supervisor's only (see AsyncioAuthenticator)

        while True:
            try:
                event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
            except zmq.ZMQError:
                return  # monitor closed
            self.handshake_failures += 1
            kind = zmq.Event(event["event"]).name
            now = time.monotonic()
            log = logger.debug
            if now - self._last_warning >= _WARN_EVERY_S:
                self._last_warning = now
                log = logger.warning
            log(
                "refused a connection on %s (%s, %d so far): a peer without this run's "
                "CURVE keys (another run's agent, or not dtlaunch at all)",
                event["endpoint"].decode(errors="replace"),
                kind,
                self.handshake_failures,
            )


class Dealer:
    """A peer's connection to the supervisor's ROUTER (CURVE client).

    ``identity`` becomes the routing id; a reconnecting peer with the same id
    takes over its old connection (ROUTER_HANDOVER). Like the Router, a plain
    socket whose FD the running loop watches (``Readiness``): an agent or a
    worker wakes for each message it gets, and zmq.asyncio's futures and flag
    arithmetic per receive were most of an idle agent's CPU. One task receives;
    ``recv`` may run on another loop later (the loop that runs it watches).
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        keys: PeerKeys,
        identity: bytes,
        *,
        sndhwm: int = DEALER_SNDHWM,
    ) -> None:
        if not isinstance(identity, bytes):
            raise TypeError(f"routing id must be bytes, got {type(identity).__name__}")
        if not 1 <= len(identity) <= 255 or identity.startswith(b"\0"):
            raise ValueError(
                f"routing id {identity[:64]!r} is invalid: it must be 1..255 bytes and "
                "must not start with a zero byte (ZeroMQ reserves those)"
            )
        # (pyzmq's stubs type socket_class as the context's own class only.)
        sock = typing.cast(
            "zmq.Socket[bytes]",
            ctx.socket(zmq.DEALER, socket_class=zmq.Socket),  # type: ignore[arg-type]
        )
        try:
            sock.curve_serverkey = keys.server_public
            sock.curve_publickey = keys.client.public
            sock.curve_secretkey = keys.client.secret
            sock.routing_id = identity
            sock.reconnect_ivl = DEALER_RECONNECT_IVL_MS
            sock.reconnect_ivl_max = DEALER_RECONNECT_IVL_MAX_MS
            sock.sndhwm = sndhwm
            sock.maxmsgsize = SOCKET_MAX_FRAME
            sock.linger = DEALER_CLOSE_LINGER_MS
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ConfigError(
                f"cannot connect to the supervisor at {endpoint!r}: {exc}. "
                "Fix: use tcp://HOST:PORT as printed by the supervisor"
            ) from exc
        self._sock: zmq.Socket[bytes] | None = sock
        self._ready = Readiness(sock, f"dealer {identity[:64]!r}")
        self.identity = identity
        self.endpoint = endpoint
        self.dropped = 0  # malformed frames dropped by recv
        self.send_failures = 0  # messages refused by send because the queue was full

    async def send(self, msg: Message) -> bool:
        """Queue ``msg`` without blocking; False (and counted) when the queue is full.

        Raises:
            WireError: ``msg`` cannot be encoded (a bug in the caller).
        """
        return await self.send_frame(encode(msg))

    async def send_frame(self, data: bytes) -> bool:
        """Queue one frame encoded already (``send`` encodes it; a load simulator
        may pack its own); False (and counted) when the queue is full."""
        sock = self._open()
        try:
            sock.send(data, flags=zmq.DONTWAIT)
        except zmq.Again:
            self.send_failures += 1
            logger.debug("dealer %r: queue full, %d bytes not sent", self.identity, len(data))
            return False
        finally:
            self._ready.wake()
        return True

    # A timeout parameter, not asyncio.timeout: "nothing arrived" is a normal result here.
    async def recv(self, timeout: float | None = None) -> Message | None:  # noqa: ASYNC109
        """The next valid message, or None after ``timeout`` seconds; bad frames are dropped."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            frame = await self.recv_frame(left)
            if frame is None:
                return None
            try:
                return decode(frame)
            except WireError as exc:
                self._drop(str(exc), len(frame))

    async def recv_frame(self, timeout: float | None = None) -> bytes | None:  # noqa: ASYNC109
        """The next one-frame message, not decoded (``recv`` decodes it), or None
        after ``timeout`` seconds; messages of several frames are dropped."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            sock = self._open()  # again after each wait: close() wakes a receiver
            try:
                frames = sock.recv_multipart(flags=zmq.DONTWAIT)
            except zmq.Again:
                if deadline is None:
                    await self._ready.wait()
                else:
                    left = deadline - loop.time()
                    if left <= 0:
                        return None
                    await self._ready.wait(left)
                continue
            if len(frames) != 1:
                self._drop(f"{len(frames)} frames, expected 1", sum(len(f) for f in frames))
                continue
            return frames[0]

    def close(self, linger_ms: int = DEALER_CLOSE_LINGER_MS) -> None:
        """Close the socket, waiting up to ``linger_ms`` to flush queued messages."""
        if self._sock is not None:
            self._ready.stop()
            self._sock.close(linger=linger_ms)
            self._sock = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            raise RuntimeError("Dealer is closed")
        return self._sock

    def _drop(self, reason: str, size: int) -> None:
        self.dropped += 1
        logger.warning(
            "dealer %r: dropped a frame from the supervisor (%d bytes): %s",
            self.identity,
            size,
            reason,
        )
