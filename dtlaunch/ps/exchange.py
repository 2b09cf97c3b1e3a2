"""Requests to parameter servers, all at once, that notice a server's restart.

A client sends one request to each server it needs and handles each answer as
it arrives. A server silent for ``PROBE_AFTER_S`` gets a ``PsPing`` (again and
again, backing off to ``PROBE_MAX_S``): an answer from the same process means
the request is only waiting (a BSP pull waits for the slowest worker's push);
no answer means the server is gone, and the pings queue in the DEALER until a
new process binds the same endpoint (ZeroMQ reconnects by itself).

A ping names the request it waits for, and the server says whether that
request waits there. It answers a peer's messages in order, so "not held" with
no answer before it means the request never reached this process: it went to
one that died before answering (a server killed while a client's first
request, or a seed, was on its way). The request goes again, as a new one.

Every answer names the server's *incarnation*, a random id per process, and
pulls and pushes name the one the client knows; a server refuses a request sent
to an earlier process. So an answer with a new incarnation means the process
restarted and our request was lost: ``on_restart(server, incarnation)`` brings
the new process up to date (the client's resync) and the request goes again,
with a fresh id, so a late answer to the old one is ignored.

A server whose blocks migrated answers ``PsReply(moved_to=E)``: the link to it
is replaced by one to ``E`` (``connect``) and the request goes again there. The
new server is a new process: its incarnation is learnt from its first answer.

A server whose blocks were reassigned to others (PSLD) answers
``PsReply(placement_version=V)``: the job's map from version ``V`` on says where
they are. The other servers' answers are taken as usual, then ``run`` raises
``PlacementChanged``; ``run_following`` has the caller follow the map
(``use_endpoints`` keeps the links it can) and sends the requests again, built
anew for it.

Timings (``ServerTiming``, the Monitor's per-server profile) are each server's
own service time: from sending the request to having the answer, less the time
a pull waited at the server for its version (``PsParams.waited_s``: the other
workers' pushes, a barrier that says nothing of this server).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import zmq

from dtlaunch.errors import PlacementChanged, PsError, ServerRestarted
from dtlaunch.ps.transport import ServerLink
from dtlaunch.wire.messages import Message, PsParams, PsPing, PsReply

__all__ = [
    "PROBE_AFTER_S",
    "PROBE_MAX_S",
    "Exchanger",
    "PlacementChanged",
    "PsError",
    "ServerRestarted",
    "ServerTiming",
    "expect",
    "expecting",
]

PROBE_AFTER_S = 0.5  # a loopback answer takes milliseconds; a ping costs ~100 bytes
PROBE_MAX_S = 2.0  # bounds how long a restarted server goes unnoticed

Request = tuple[Message, list[Any]]  # a message and its tensor payloads
Take = Callable[[int, Message, list[zmq.Frame]], int]  # -> tensor bytes received
OnRestart = Callable[[int, int], None]  # (server, new incarnation)
Follow = Callable[[PlacementChanged], None]  # switches to the job's newer map
Connect = Callable[[str], ServerLink]  # endpoint -> a new link

logger = logging.getLogger(__name__)

AnswerT = TypeVar("AnswerT", bound=Message)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServerTiming:
    """One exchange with one server, for the Monitor (PSLD §4.1's Pred(r, s))."""

    server: int
    op: str  # "pull" or "push"
    bytes: int  # tensor bytes moved
    # From sending the request to having the answer, less the time a pull
    # waited at the server for its version (the barrier): the server's service.
    seconds: float


@dataclasses.dataclass(slots=True)
class _Pending:
    request_id: int
    sent_at: float  # perf_counter, for timings
    sent_bytes: int
    deadline: float  # monotonic
    next_probe: float
    probe_every: float
    probes: set[int]


class Exchanger:
    """The links to the servers, their known incarnations, and ``run``."""

    def __init__(self, timeout: float, connect: Connect | None = None) -> None:
        self.timeout = timeout
        self.connect = connect  # None: a move (``moved_to``) is an error
        self.links: list[ServerLink] = []
        self.endpoints: list[str] = []
        self.incarnations: list[int] = []  # 0: not heard from yet
        self.timings: list[ServerTiming] = []
        self.restarts = 0  # server restarts noticed (resyncs started)
        self.moves = 0  # servers followed to where their blocks migrated
        self._ids = itertools.count(1)

    def run(
        self,
        op: str,
        requests: Mapping[int, Request],
        take: Take,
        *,
        on_restart: OnRestart | None = None,
        timeout: float | None = None,
    ) -> None:
        """Send every request, then ``take`` each answer as it arrives.

        Without ``on_restart`` an answer from a new incarnation is taken as it is.

        Raises:
            PsError: a server refused, or did not answer within ``timeout``
                (default: the exchanger's) of the last (re)send.
            PlacementChanged: servers answered that blocks asked of them were
                reassigned (after every other answer was taken).
            ServerRestarted: from ``on_restart``, when it raises it.
        """
        wait_s = self.timeout if timeout is None else timeout
        poller = zmq.Poller()
        pending: dict[int, _Pending] = {}
        reassigned: dict[int, int] = {}  # server -> the placement version it named
        for j, (msg, payloads) in requests.items():
            pending[j] = self._send(j, msg, payloads, wait_s)
            poller.register(self.links[j].sock, zmq.POLLIN)
        socket_of = {self.links[j].sock: j for j in pending}
        while pending:
            now = time.monotonic()
            for j, p in pending.items():
                if now >= p.deadline:
                    raise PsError(
                        f"{op}: no answer from parameter server {j} ({self.endpoints[j]}) "
                        f"within {wait_s:.0f}s; check that it runs (DTLAUNCH_PS_TIMEOUT sets "
                        "the wait)"
                    )
                if now >= p.next_probe:
                    probe_id = next(self._ids)
                    self.links[j].send(PsPing(request_id=probe_id, awaiting=p.request_id))
                    p.probes.add(probe_id)
                    p.probe_every = min(2 * p.probe_every, PROBE_MAX_S)
                    p.next_probe = now + p.probe_every
            soonest = min(min(p.next_probe, p.deadline) for p in pending.values())
            for sock, _ in poller.poll(max(1, int((soonest - now) * 1000) + 1)):
                j = socket_of[sock]
                got = self.links[j].recv_now()
                if got is None or j not in pending:
                    continue
                reply, frames = got
                p = pending[j]
                reply_id = getattr(reply, "request_id", None)
                if reply_id != p.request_id and reply_id not in p.probes:
                    continue  # an answer to a request given up on or sent again
                incarnation = getattr(reply, "incarnation", 0)
                known = self.incarnations[j]
                if incarnation and incarnation != known:
                    self.incarnations[j] = incarnation
                    if known and on_restart is not None:
                        self.restarts += 1
                        on_restart(j, incarnation)
                        msg, payloads = requests[j]
                        pending[j] = self._send(j, msg, payloads, wait_s)
                        continue
                if reply_id != p.request_id:
                    if isinstance(reply, PsReply) and not reply.holding:
                        # Not held and not answered first: it was lost with a dead process.
                        logger.warning(
                            "%s: parameter server %d (%s) lost the request; sending it again",
                            op,
                            j,
                            self.endpoints[j],
                        )
                        msg, payloads = requests[j]
                        pending[j] = self._send(j, msg, payloads, wait_s)
                    continue  # else the request waits there (a BSP pull for the step)
                if isinstance(reply, PsReply) and not reply.ok and reply.moved_to:
                    if self.connect is None:
                        raise PsError(f"{op}: parameter server {j}: {reply.detail}")
                    poller.unregister(sock)
                    del socket_of[sock]
                    self.move(j, reply.moved_to)
                    msg, payloads = requests[j]
                    pending[j] = self._send(j, msg, payloads, wait_s)
                    poller.register(self.links[j].sock, zmq.POLLIN)
                    socket_of[self.links[j].sock] = j
                    continue
                if isinstance(reply, PsReply) and not reply.ok and reply.placement_version:
                    # The others' answers still count (a pull's parameters are
                    # fresh): the caller follows the map once every one is in.
                    reassigned[j] = reply.placement_version
                    del pending[j]
                    poller.unregister(sock)
                    continue
                if isinstance(reply, PsReply) and not reply.ok:
                    raise PsError(
                        f"{op}: parameter server {j} ({self.endpoints[j]}): {reply.detail}"
                    )
                received = take(j, reply, frames)
                del pending[j]
                poller.unregister(sock)
                if op in ("pull", "push"):
                    barrier = reply.waited_s if isinstance(reply, PsParams) else 0.0
                    self.timings.append(
                        ServerTiming(
                            server=j,
                            op=op,
                            bytes=received + p.sent_bytes,
                            seconds=max(0.0, time.perf_counter() - p.sent_at - barrier),
                        )
                    )
        if reassigned:
            raise PlacementChanged(max(reassigned.values()), sorted(reassigned))

    def run_following(
        self,
        op: str,
        requests: Callable[[], Mapping[int, Request]],
        take: Take,
        *,
        follow: Follow,
        on_restart: OnRestart | None = None,
    ) -> float:
        """``run`` that follows a reassignment: on ``PlacementChanged``, ``follow``
        switches to the job's map and the requests, built anew by ``requests``,
        go again. Returns the seconds of the rounds cut short: a pause, not
        communication (their timings are dropped: the next round does it again).

        Raises:
            PsError: as ``run``, and from ``follow``.
        """
        paused = 0.0
        while True:
            started, mark = time.perf_counter(), len(self.timings)
            try:
                self.run(op, requests(), take, on_restart=on_restart)
                return paused
            except PlacementChanged as changed:
                del self.timings[mark:]
                follow(changed)
                paused += time.perf_counter() - started

    def use_endpoints(self, endpoints: Sequence[str]) -> None:
        """Server ``j`` is the one at ``endpoints[j]`` from now on: the link to an
        endpoint that stays is kept, with its incarnation; others are made anew."""
        assert self.connect is not None
        links, incarnations = [], []
        for j, endpoint in enumerate(endpoints):
            if j < len(self.endpoints) and self.endpoints[j] == endpoint:
                links.append(self.links[j])
                incarnations.append(self.incarnations[j])
            else:
                links.append(self.connect(endpoint))
                incarnations.append(0)
        for link in self.links:
            if link not in links:
                link.close()
        self.links, self.endpoints, self.incarnations = links, list(endpoints), incarnations

    def move(self, j: int, endpoint: str) -> None:
        """Server ``j`` is now the process at ``endpoint`` (its blocks migrated)."""
        assert self.connect is not None
        logger.info("parameter server %d moved: %s -> %s", j, self.endpoints[j], endpoint)
        old = self.links[j]
        self.links[j] = self.connect(endpoint)
        self.endpoints[j] = endpoint
        self.incarnations[j] = 0
        self.moves += 1
        old.close()

    def _send(self, j: int, msg: Message, payloads: list[Any], wait_s: float) -> _Pending:
        request_id = next(self._ids)
        changes: dict[str, Any] = {"request_id": request_id}
        if "incarnation" in _field_names(type(msg)):
            changes["incarnation"] = self.incarnations[j]
        sent_at = time.perf_counter()
        self.links[j].send(dataclasses.replace(msg, **changes), payloads)
        now = time.monotonic()
        return _Pending(
            request_id=request_id,
            sent_at=sent_at,
            sent_bytes=sum(memoryview(b).nbytes for b in payloads),
            deadline=now + wait_s,
            next_probe=now + PROBE_AFTER_S,
            probe_every=PROBE_AFTER_S,
            probes=set(),
        )


def expect(answer: type[AnswerT], j: int, reply: Message, request: str) -> AnswerT:
    """``reply`` as the ``answer`` a ``request`` gets from server ``j``, or PsError."""
    if not isinstance(reply, answer):
        raise PsError(f"server {j} answered {request} with {reply.TYPE}")
    return reply


def expecting(answer: type[Message], request: str) -> Take:
    """A ``Take`` for a request whose answer only has to be ``answer``."""

    def take(j: int, reply: Message, frames: list[zmq.Frame]) -> int:
        expect(answer, j, reply, request)
        return 0

    return take


_FIELDS: dict[type[Message], frozenset[str]] = {}


def _field_names(cls: type[Message]) -> frozenset[str]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names
