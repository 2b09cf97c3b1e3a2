"""The parameter server's data plane: CURVE sockets carrying a message plus tensor frames.

A PS message is a multipart ZeroMQ message: frame 0 is a wire message (msgpack,
validated by ``dtlaunch.wire.codec``), the frames after it are raw tensor bytes,
sent and received without copies (``copy=False``: a ``memoryview`` of the tensor
goes out, a ``zmq.Frame`` comes in and is read in place with ``torch.frombuffer``).

Security is the control wire's (``dtlaunch.wire.sockets``): CURVE with a ZAP
authenticator that admits only the run's client key, domain enforced so nothing
falls back to unauthenticated mode. A PS server has no key of its own: it uses the
run's client keypair as its CURVE server key, which every peer of the run holds
(``DTLAUNCH_KEYS``), so any process of the run may serve and only processes of
the run may connect. The sockets are blocking (``zmq.Context``, not asyncio):
the server is one loop and the client waits for its answers anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from dtlaunch.errors import ConfigError, WireError
from dtlaunch.wire.codec import decode, encode
from dtlaunch.wire.keys import PeerKeys
from dtlaunch.wire.messages import Message

# The control wire's ZAP provider: one rule for who may connect, in one place.
from dtlaunch.wire.sockets import ZAP_DOMAIN, _OneClientKey

__all__ = ["MAX_TENSOR_FRAME", "Incoming", "ServerLink", "ServerSocket"]

logger = logging.getLogger(__name__)

# A tensor frame is one block (<= --ps-block-bytes unless one row is larger);
# libzmq cuts off a peer sending more than this in one frame.
MAX_TENSOR_FRAME = 1 << 31
_SNDHWM = 100_000  # messages; a pull reply to many workers must not be dropped
_IO_THREADS = 2


Buffer = Any  # anything exposing the buffer protocol (memoryview, numpy array)


class Incoming:
    """A received message with its tensor frames (``zmq.Frame``, not copied)."""

    __slots__ = ("frames", "message", "peer", "received")

    def __init__(self, peer: bytes, message: Message, frames: list[zmq.Frame]) -> None:
        self.peer = peer
        self.message = message
        self.frames = frames
        self.received = time.monotonic()  # how long a request waited here is measured from it

    @property
    def payload_bytes(self) -> int:
        return sum(len(f) for f in self.frames)


def new_context() -> zmq.Context[zmq.Socket[bytes]]:
    """A context with enough I/O threads to keep CURVE encryption off one core."""
    return zmq.Context(io_threads=_IO_THREADS)


class ServerSocket:
    """A PS server's ROUTER (CURVE server, ZAP-enforced); one per context."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], keys: PeerKeys, bind: str) -> None:
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger(f"{__name__}.zap"))
        self._auth.start()
        self._zap = _OneClientKey(keys.client.public)
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self._zap)
        sock = ctx.socket(zmq.ROUTER)
        self.sock: zmq.Socket[bytes] = sock
        sock.linger = 0
        sock.zap_domain = ZAP_DOMAIN.encode()
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.curve_server = True
        sock.curve_publickey = keys.client.public
        sock.curve_secretkey = keys.client.secret
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.maxmsgsize = MAX_TENSOR_FRAME
        sock.sndhwm = _SNDHWM
        sock.rcvhwm = _SNDHWM
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigError(
                f"cannot bind the parameter server to {bind!r}: {exc}. Fix: use "
                "tcp://ADDRESS:PORT with a local address and a free port (0 picks one)"
            ) from exc
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.dropped = 0

    @property
    def refused_keys(self) -> int:
        return self._zap.refused

    def recv(self, timeout_ms: int) -> Incoming | None:
        """The next valid message, or None after ``timeout_ms``; bad frames are dropped."""
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart(copy=False)
        peer = frames[0].bytes
        if len(frames) < 2:
            self._drop(peer, "no message frame")
            return None
        try:
            message = decode(frames[1].bytes)
        except WireError as exc:
            self._drop(peer, str(exc))
            return None
        return Incoming(peer, message, frames[2:])

    def send(
        self, peer: bytes, message: Message, payloads: Sequence[Buffer] = (), *, track: bool = False
    ) -> zmq.MessageTracker | None:
        """Queue ``message`` and ``payloads`` for ``peer`` without copying the payloads.

        With ``track`` the returned tracker says when ZeroMQ no longer reads them.
        """
        parts: list[Any] = [peer, encode(message), *payloads]
        tracker = self.sock.send_multipart(parts, copy=False, track=track)
        return tracker if track else None

    def close(self, linger_ms: int = 0) -> None:
        sock = getattr(self, "sock", None)
        if sock is not None:
            sock.close(linger=linger_ms)
        self._auth.stop()

    def _drop(self, peer: bytes, reason: str) -> None:
        self.dropped += 1
        logger.warning("ps: dropped a message from peer %r: %s", peer[:64], reason)


class ServerLink:
    """A client's DEALER to one PS server (CURVE client with the run's keys)."""

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, keys: PeerKeys, identity: bytes
    ) -> None:
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.curve_serverkey = keys.client.public
            sock.curve_publickey = keys.client.public
            sock.curve_secretkey = keys.client.secret
            sock.routing_id = identity
            sock.maxmsgsize = MAX_TENSOR_FRAME
            sock.sndhwm = _SNDHWM
            sock.rcvhwm = _SNDHWM
            sock.linger = 0
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ConfigError(
                f"cannot connect to the parameter server at {endpoint!r}: {exc}. "
                "Fix: give endpoints as tcp://HOST:PORT"
            ) from exc
        self.sock: zmq.Socket[bytes] = sock
        self.endpoint = endpoint
        self.dropped = 0

    def send(self, message: Message, payloads: Sequence[Buffer] = ()) -> None:
        """Queue ``message`` and ``payloads`` (not copied: keep them unchanged until
        the answer arrives)."""
        self.sock.send_multipart([encode(message), *payloads], copy=False)

    def recv_now(self) -> tuple[Message, list[zmq.Frame]] | None:
        """One waiting message (call after a poll said so); None if it was malformed."""
        frames = self.sock.recv_multipart(copy=False)
        try:
            return decode(frames[0].bytes), frames[1:]
        except WireError as exc:
            self.dropped += 1
            logger.warning("ps: dropped a message from %s: %s", self.endpoint, exc)
            return None

    def close(self) -> None:
        self.sock.close(linger=0)
