"""Router and Dealer over real ZeroMQ on loopback: endpoints, malformed frames, queues, handover."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import msgpack
import pytest
import zmq
import zmq.asyncio

from dtlaunch.errors import ConfigError, WireError
from dtlaunch.wire.codec import MAX_MESSAGE_BYTES, encode
from dtlaunch.wire.keys import create_run_keys
from dtlaunch.wire.messages import Bye, Hello, Ping, Spawned, Welcome
from dtlaunch.wire.messages.base import PROTOCOL_VERSION
from dtlaunch.wire.sockets import SOCKET_MAX_FRAME, Dealer, Router


def run(test):
    """Run ``test(ctx)`` on a fresh loop and context, then destroy the context."""

    async def main():
        ctx = zmq.asyncio.Context()
        try:
            await asyncio.wait_for(test(ctx), timeout=20)
        finally:
            ctx.destroy(linger=0)

    asyncio.run(main())


@pytest.fixture
def keys(tmp_path):
    return create_run_keys(tmp_path / "keys")


def curve_dealer(ctx, endpoint, keys, identity=b"raw"):
    """A bare DEALER with the run's keys: sends whatever frames a test wants."""
    sock = ctx.socket(zmq.DEALER)
    sock.curve_serverkey = keys.server.public
    sock.curve_publickey = keys.client.public
    sock.curve_secretkey = keys.client.secret
    sock.routing_id = identity
    sock.connect(endpoint)
    return sock


async def recv_within(router: Router, seconds: float = 3.0):
    return await asyncio.wait_for(router.recv(), seconds)


# ---------------------------------------------------------------- endpoints


def test_endpoint_reports_the_bound_port(keys):
    async def test(ctx):
        router = Router(ctx, keys)
        with pytest.raises(RuntimeError, match="not started"):
            _ = router.endpoint
        await router.start()
        try:
            assert router.port > 0
            assert router.endpoint == f"tcp://127.0.0.1:{router.port}"
        finally:
            router.close()
            router.close()  # idempotent
        with pytest.raises(RuntimeError, match="not started"):
            await router.recv()

    run(test)


def test_bind_errors_are_config_errors(keys):
    async def test(ctx):
        async with Router(ctx, keys) as first:
            other_ctx = zmq.asyncio.Context()
            try:
                taken = Router(other_ctx, keys, bind=first.endpoint)
                with pytest.raises(ConfigError, match="cannot bind"):
                    await taken.start()
                bad = Router(other_ctx, keys, bind="not-an-endpoint")
                with pytest.raises(ConfigError, match="tcp://ADDRESS:PORT"):
                    await bad.start()
            finally:
                other_ctx.destroy(linger=0)
            # ZeroMQ has one ZAP endpoint per context.
            with pytest.raises(RuntimeError, match=r"its own zmq\.asyncio\.Context"):
                await Router(ctx, keys).start()
            # The first Router is unharmed by all of that.
            async with Dealer(ctx, first.endpoint, keys.peer(), b"p") as dealer:
                assert await dealer.send(Ping(seq=1))
                assert await recv_within(first) == (b"p", Ping(seq=1))

    run(test)


def test_router_can_be_replaced_in_the_same_context(keys):
    async def test(ctx):
        for seq in range(5):
            async with (
                Router(ctx, keys) as router,
                Dealer(ctx, router.endpoint, keys.peer(), b"p") as dealer,
            ):
                assert await dealer.send(Ping(seq=seq))
                assert await recv_within(router) == (b"p", Ping(seq=seq))

    run(test)


def test_dealer_rejects_bad_identity_and_endpoint(keys):
    async def test(ctx):
        for identity in (b"", b"\0abc", b"x" * 256):
            with pytest.raises(ValueError, match="routing id"):
                Dealer(ctx, "tcp://127.0.0.1:1", keys.peer(), identity)
        with pytest.raises(ConfigError, match="tcp://HOST:PORT"):
            Dealer(ctx, "nowhere", keys.peer(), b"p")

    run(test)


# ------------------------------------------------------------ malformed frames


def test_router_drops_malformed_frames_and_keeps_serving(keys):
    async def test(ctx):
        async with Router(ctx, keys) as router:
            raw = curve_dealer(ctx, router.endpoint, keys)
            try:
                garbage = [
                    [os.urandom(64)],
                    [msgpack.packb([1, 2, 3])],
                    [msgpack.packb({"t": "ping", "v": PROTOCOL_VERSION})],  # missing field
                    [msgpack.packb({"t": "ping", "v": PROTOCOL_VERSION, "seq": "1"})],  # wrong type
                    [encode(Ping(seq=1)), encode(Ping(seq=2))],  # multi-frame
                    [b"\x92" + b"\0" * MAX_MESSAGE_BYTES],  # over the codec's limit
                ]
                for frames in garbage:
                    await raw.send_multipart(frames)
                await raw.send(encode(Ping(seq=3)))
                # Frames from one peer arrive in order: all garbage was seen and dropped.
                assert await recv_within(router) == (b"raw", Ping(seq=3))
                assert router.dropped == len(garbage)
                async with Dealer(ctx, router.endpoint, keys.peer(), b"good") as good:
                    assert await good.send(Ping(seq=4))
                    assert await recv_within(router) == (b"good", Ping(seq=4))
                    await router.send(b"good", Welcome(run_id="r", heartbeat_interval=1))
                    assert await good.recv(timeout=3) == Welcome(run_id="r", heartbeat_interval=1.0)
                assert router.dropped == len(garbage)
            finally:
                raw.close(linger=0)

    run(test)


def test_router_cuts_off_a_peer_sending_a_huge_frame(keys):
    async def test(ctx):
        async with Router(ctx, keys) as router:
            raw = curve_dealer(ctx, router.endpoint, keys, identity=b"huge")
            try:
                await raw.send(b"\0" * (SOCKET_MAX_FRAME + 1))
                async with Dealer(ctx, router.endpoint, keys.peer(), b"good") as good:
                    for seq in range(3):
                        assert await good.send(Ping(seq=seq))
                        # Only the good peer's messages come through.
                        assert await recv_within(router) == (b"good", Ping(seq=seq))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(router.recv(), 0.3)
                assert router.dropped == 0  # never buffered, never decoded
            finally:
                raw.close(linger=0)

    run(test)


def test_dealer_drops_malformed_frames(keys):
    async def test(ctx):
        # A bare CURVE server standing in for a broken supervisor.
        server = ctx.socket(zmq.ROUTER)
        server.curve_server = True
        server.curve_secretkey = keys.server.secret
        port = server.bind_to_random_port("tcp://127.0.0.1")
        try:
            async with Dealer(ctx, f"tcp://127.0.0.1:{port}", keys.peer(), b"agent") as dealer:
                assert await dealer.send(Bye(reason="hi"))
                peer, _ = await asyncio.wait_for(server.recv_multipart(), 3)
                await server.send_multipart([peer, b"\xc1"])
                await server.send_multipart([peer, msgpack.packb({"t": "welcome", "v": 9})])
                await server.send_multipart([peer, b"a", b"b"])
                await server.send_multipart([peer, encode(Ping(seq=5))])
                assert await dealer.recv(timeout=3) == Ping(seq=5)
                assert dealer.dropped == 3
        finally:
            server.close(linger=0)

    run(test)


# ------------------------------------------------------------------ queues


def test_dealer_recv_times_out_with_none(keys):
    async def test(ctx):
        async with (
            Router(ctx, keys) as router,
            Dealer(ctx, router.endpoint, keys.peer(), b"p") as dealer,
        ):
            start = time.monotonic()
            assert await dealer.recv(timeout=0.2) is None
            assert 0.15 <= time.monotonic() - start < 2
            assert await dealer.recv(timeout=0) is None

    run(test)


def test_dealer_send_reports_a_full_queue_instead_of_blocking(keys):
    async def test(ctx):
        # Nothing listens on that port, so nothing drains the queue.
        holder = ctx.socket(zmq.REP)
        port = holder.bind_to_random_port("tcp://127.0.0.1")
        holder.close(linger=0)
        dealer = Dealer(ctx, f"tcp://127.0.0.1:{port}", keys.peer(), b"p", sndhwm=4)
        try:
            results = [await asyncio.wait_for(dealer.send(Ping(seq=i)), 1) for i in range(50)]
        finally:
            dealer.close(linger_ms=0)
        assert results[0] is True
        assert results[-1] is False
        assert dealer.send_failures == results.count(False) > 0
        with pytest.raises(RuntimeError, match="closed"):
            await dealer.send(Ping(seq=0))

    run(test)


def test_send_refuses_invalid_messages(keys):
    async def test(ctx):
        async with (
            Router(ctx, keys) as router,
            Dealer(ctx, router.endpoint, keys.peer(), b"p") as dealer,
        ):
            with pytest.raises(WireError, match="pid"):
                await dealer.send(Spawned(proc_id="w", attempt=0, pid=0))
            with pytest.raises(WireError, match="pid"):
                await router.send(b"p", Spawned(proc_id="w", attempt=0, pid=-5))

    run(test)


def test_router_send_to_unknown_peer_is_dropped_quietly(keys):
    async def test(ctx):
        async with Router(ctx, keys) as router:
            await asyncio.wait_for(router.send(b"nobody", Ping(seq=1)), 1)
            async with Dealer(ctx, router.endpoint, keys.peer(), b"p") as dealer:
                assert await dealer.send(Ping(seq=2))
                assert await recv_within(router) == (b"p", Ping(seq=2))
                assert await dealer.recv(timeout=0.2) is None  # "nobody"'s Ping went nowhere

    run(test)


def test_reconnecting_peer_with_same_identity_takes_over(keys):
    async def test(ctx):
        hello = Hello(role="agent", run_id="r", host="h", pid=1, version="0")
        async with (
            Router(ctx, keys) as router,
            Dealer(ctx, router.endpoint, keys.peer(), b"agent-h") as old,
        ):
            assert await old.send(hello)
            assert await recv_within(router) == (b"agent-h", hello)
            async with Dealer(ctx, router.endpoint, keys.peer(), b"agent-h") as new:
                assert await new.send(Ping(seq=1))
                assert await recv_within(router) == (b"agent-h", Ping(seq=1))
                await router.send(b"agent-h", Ping(seq=2))
                assert await new.recv(timeout=3) == Ping(seq=2)
                assert await old.recv(timeout=0.2) is None

    run(test)


def test_recv_many_takes_what_is_queued_without_waiting_for_more(keys):
    """Issue 18: the supervisor takes queued messages in batches; the first is
    waited for, the rest only if already there, a bad frame is dropped, the
    limit is kept."""

    async def scenario() -> tuple[list[int], list[int], int]:
        ctx = zmq.asyncio.Context()
        try:
            async with Router(ctx, keys) as router:
                dealer = Dealer(ctx, router.endpoint, keys.peer(), b"worker:0@0")
                for seq in range(5):
                    await dealer.send(Ping(seq=seq))
                await dealer.send_frame(b"not msgpack")  # dropped by the codec
                await dealer.send(Ping(seq=5))
                first = [await router.recv()]
                await asyncio.sleep(0.3)  # the rest is queued by now
                batch = first + await router.recv_many(3)
                rest = await router.recv_many(100)
                with pytest.raises(ValueError, match="limit"):
                    await router.recv_many(0)
                dealer.close()
                seqs = [[m.seq for _, m in got if isinstance(m, Ping)] for got in (batch, rest)]
                return seqs[0], seqs[1], router.dropped
        finally:
            ctx.destroy(linger=0)

    batch, rest, dropped = asyncio.run(scenario())
    assert batch == [0, 1, 2, 3]
    assert rest == [4, 5]
    assert dropped == 1


def test_a_receiver_cancelled_as_it_is_woken_ends_in_a_loop(keys):
    """A cancellation that comes together with the wake-up must end the receiver
    (asyncio.wait_for in Python 3.11 swallowed it: the supervisor's receive loop
    then never ended and a finished job never exited)."""

    async def test(ctx):
        async with (
            Router(ctx, keys) as router,
            Dealer(ctx, router.endpoint, keys.peer(), b"p") as dealer,
        ):
            for seq in range(200):
                receiver = asyncio.ensure_future(router.recv_many(8))
                await asyncio.sleep(0)  # the receiver now waits on the socket
                if seq % 2:
                    await router.send(b"p", Ping(seq=seq))  # a send wakes the receiver
                else:
                    router._wake()  # as the FD's signal does
                receiver.cancel()
                done, _ = await asyncio.wait({receiver}, timeout=2.0)
                assert done, f"round {seq}: the cancelled receiver did not end"
                assert receiver.cancelled()
                assert await dealer.send(Ping(seq=seq))
                assert await recv_within(router) == (b"p", Ping(seq=seq))
                await dealer.recv(timeout=0.1) if seq % 2 else None

    run(test)


def test_a_router_nobody_reads_leaves_the_loop_idle(keys):
    """ZMQ_FD stays readable until the socket handles its commands and the loop
    watches it level-triggered: with no receiver waiting (the receive loop busy,
    or gone at a job's end) the loop must not spin on it."""

    async def test(ctx):
        async with (
            Router(ctx, keys) as router,
            Dealer(ctx, router.endpoint, keys.peer(), b"p") as dealer,
        ):
            for seq in range(3):
                assert await dealer.send(Ping(seq=seq))
            await asyncio.sleep(0.3)  # they arrive; nobody receives
            began = time.process_time()
            await asyncio.sleep(1.0)
            assert time.process_time() - began < 0.3  # a spin takes the whole second
            assert [await recv_within(router) for _ in range(3)] == [
                (b"p", Ping(seq=seq)) for seq in range(3)
            ]

    run(test)


def test_a_receive_loop_with_messages_always_queued_still_lets_other_tasks_run(keys):
    """Scale benchmark finding: with messages always queued, recv_many returned
    without ever suspending, so a receive loop held the event loop for as long
    as the flood lasted (status answers and timers waited 150-280 ms). Every
    call now yields to the loop once."""

    async def test(ctx):
        async with (
            Router(ctx, keys) as router,
            Dealer(ctx, router.endpoint, keys.peer(), b"flood") as dealer,
        ):
            for seq in range(640):
                assert await dealer.send(Ping(seq=seq))
            first = await asyncio.wait_for(router.recv_many(64), 5.0)
            # Let the rest reach the router's queue (loopback: milliseconds). Had
            # some not arrived, recv_many would wait for them and the ticker run:
            # this can only make the test pass without the yield, never fail with it.
            await asyncio.sleep(0.5)
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)

            task = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            seen, batches, ticks_between = len(first), 0, []
            while seen < 640:
                before = ticks
                # Awaited directly, as the supervisor's receive loop does (wait_for
                # would run it as a task, which always suspends).
                batch = await router.recv_many(64)
                ticks_between.append(ticks - before)
                seen += len(batch)
                batches += 1
            task.cancel()
            assert batches >= 9  # full batches: the pings were queued
            assert min(ticks_between) >= 1, ticks_between

    run(test)


@contextlib.asynccontextmanager
async def _receiver_waiting(ctx, keys):
    """A Router and a Dealer after one Ping, the Dealer's receiver waiting on its
    FD: (router, dealer, the waiting task)."""
    async with (
        Router(ctx, keys) as router,
        Dealer(ctx, router.endpoint, keys.peer(), b"d") as dealer,
    ):
        assert await dealer.send(Ping(seq=1))
        assert await recv_within(router) == (b"d", Ping(seq=1))
        waiter = asyncio.create_task(dealer._ready.wait(5.0))
        await asyncio.sleep(0)  # the wait is awaiting its future now
        assert dealer._ready._waiting is not None
        yield router, dealer, waiter


def test_a_signal_that_comes_with_the_recheck_timer_is_no_lost_wakeup(keys, caplog):
    """Scale benchmark finding: simulated workers logged "a message was queued but
    the loop was not told" a few times a minute. uvloop runs due timers before
    I/O callbacks: when a message arrived in the iteration in which a wait's
    recheck timer came due, the timer resolved the wait first, the FD's signal
    found it resolved, and the wait took the message for a lost wakeup (a false
    alarm and a needless re-watch). The signal now counts."""
    import logging

    from dtlaunch.wire import readiness

    async def test(ctx):
        async with _receiver_waiting(ctx, keys) as (router, dealer, waiter):
            ready = dealer._ready
            await router.send(b"d", Welcome(run_id="r", heartbeat_interval=1.0))
            time.sleep(0.3)  # the loop does not run: the message reaches the queue
            # One iteration in uvloop's order: the recheck timer, then the FD.
            readiness._resolve(ready._waiting, False)
            ready._signalled()
            with caplog.at_level(logging.WARNING, logger=readiness.__name__):
                await asyncio.wait_for(waiter, 5.0)
            assert "was not told" not in caplog.text
            assert await dealer.recv(timeout=1.0) == Welcome(run_id="r", heartbeat_interval=1.0)

    run(test)


@pytest.mark.parametrize("signal", ["pending", "consumed"])
def test_only_a_message_queued_with_the_fd_quiet_is_a_lost_wakeup(keys, caplog, signal):
    """Scale benchmark finding: the supervisor's routers logged "a message was
    queued but the loop was not told" a few times in ten minutes at 1,000
    workers. uvloop resumes a receiver whose recheck timer came due in that same
    iteration, before the iteration's poll: a message that had arrived since the
    last poll (the loop busy with other callbacks meanwhile) had made the FD
    readable, its signal simply not dispatched yet, and the wait took it for a
    lost wakeup. Here the loop does not watch the FD while the message arrives,
    so its signal cannot be dispatched before the receiver resumes ("pending":
    no lost wakeup). A signal consumed behind the receiver's back (someone asks
    ZMQ_EVENTS) leaves the FD quiet with a message queued ("consumed"): that
    one is said, the FD watched afresh, and the message received."""
    import logging

    from dtlaunch.wire import readiness

    async def test(ctx):
        async with _receiver_waiting(ctx, keys) as (router, dealer, waiter):
            ready = dealer._ready
            asyncio.get_running_loop().remove_reader(dealer._sock.FD)
            await router.send(b"d", Welcome(run_id="r", heartbeat_interval=1.0))
            time.sleep(0.3)  # the message reaches the queue, the FD is readable
            if signal == "consumed":
                assert dealer._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN
            readiness._resolve(ready._waiting, False)  # the recheck timer came due
            with caplog.at_level(logging.WARNING, logger=readiness.__name__):
                await asyncio.wait_for(waiter, 5.0)
            assert ("was not told" in caplog.text) == (signal == "consumed")
            ready.watch()
            assert await dealer.recv(timeout=1.0) == Welcome(run_id="r", heartbeat_interval=1.0)

    run(test)
