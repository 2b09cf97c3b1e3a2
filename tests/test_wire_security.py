"""CURVE keys on disk, and the Router admitting only peers holding this run's keys.

Socket tests use real ZeroMQ over loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import zmq
import zmq.asyncio
import zmq.auth

from dtlaunch.errors import KeyFileError
from dtlaunch.wire.codec import encode
from dtlaunch.wire.keys import (
    KeyPair,
    PeerKeys,
    create_run_keys,
    load_peer_keys,
    load_run_keys,
    write_peer_keys,
)
from dtlaunch.wire.messages import Hello, Ping, Welcome
from dtlaunch.wire.sockets import ZAP_DOMAIN, Dealer, Router

REFUSED_WAIT_S = 0.5  # loopback handshakes take milliseconds
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------- key files


def test_create_run_keys_private_files_and_round_trip(tmp_path):
    keys_dir = tmp_path / "run" / "keys"
    old = os.umask(0)  # the modes must not depend on the caller's umask
    try:
        keys = create_run_keys(keys_dir)
    finally:
        os.umask(old)
    assert mode(keys_dir) == 0o700
    assert sorted(p.name for p in keys_dir.iterdir()) == ["client.key_secret", "server.key_secret"]
    for path in keys_dir.iterdir():
        assert mode(path) == 0o600
    assert load_run_keys(keys_dir) == keys
    assert keys.server != keys.client
    assert zmq.curve_public(keys.server.secret) == keys.server.public
    # The files are ZeroMQ certificates that zmq.auth can read too.
    assert zmq.auth.load_certificate(keys_dir / "client.key_secret") == (
        keys.client.public, keys.client.secret)


def test_create_run_keys_tightens_an_existing_dir(tmp_path):
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir(mode=0o755)
    os.chmod(keys_dir, 0o755)
    create_run_keys(keys_dir)
    assert mode(keys_dir) == 0o700


def test_create_run_keys_never_overwrites(tmp_path):
    keys = create_run_keys(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(KeyFileError, match="already exists"):
        create_run_keys(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert load_run_keys(tmp_path) == keys


def test_secrets_stay_out_of_repr(tmp_path):
    keys = create_run_keys(tmp_path)
    for text in (repr(keys), str(keys), repr(keys.peer())):
        assert keys.client.secret.decode() not in text
        assert keys.server.secret.decode() not in text
    assert keys.client.public.decode() in repr(keys)


@pytest.mark.parametrize("bad_mode", [0o644, 0o640, 0o604, 0o660, 0o610])
def test_load_refuses_keys_readable_by_others(tmp_path, bad_mode):
    create_run_keys(tmp_path)
    path = tmp_path / "client.key_secret"
    os.chmod(path, bad_mode)
    with pytest.raises(KeyFileError) as info:
        load_run_keys(tmp_path)
    message = str(info.value)
    assert f"chmod 600 {path}" in message
    assert f"{bad_mode:04o}" in message
    os.chmod(path, 0o600)
    load_run_keys(tmp_path)


def test_load_accepts_owner_only_modes(tmp_path):
    create_run_keys(tmp_path)
    os.chmod(tmp_path / "server.key_secret", 0o400)
    os.chmod(tmp_path / "client.key_secret", 0o700)
    load_run_keys(tmp_path)


def test_load_names_a_missing_file(tmp_path):
    create_run_keys(tmp_path)
    (tmp_path / "server.key_secret").unlink()
    with pytest.raises(KeyFileError, match=r"server\.key_secret is missing"):
        load_run_keys(tmp_path)
    with pytest.raises(KeyFileError, match="is missing"):
        load_run_keys(tmp_path / "nowhere")


def write_private(path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o600)


def test_load_refuses_malformed_files(tmp_path):
    keys = create_run_keys(tmp_path)
    client_file = tmp_path / "client.key_secret"
    good = client_file.read_text()

    write_private(client_file, "garbage\n")
    with pytest.raises(KeyFileError, match="no public-key line"):
        load_run_keys(tmp_path)

    write_private(client_file, good.replace("    secret-key", "    # secret-key"))
    with pytest.raises(KeyFileError, match="no secret-key line"):
        load_run_keys(tmp_path)

    write_private(client_file, good.replace(keys.client.public.decode(), "short"))
    with pytest.raises(KeyFileError, match="malformed") as info:
        load_run_keys(tmp_path)
    assert str(client_file) in str(info.value)

    # Well-formed keys from two different pairs: the public key must match.
    write_private(client_file, good.replace(keys.client.public.decode(),
                                            keys.server.public.decode()))
    with pytest.raises(KeyFileError, match="does not belong"):
        load_run_keys(tmp_path)
    # A malformed secret is not echoed back.
    write_private(client_file, good.replace(keys.client.secret.decode(), "S" * 39 + "\u00e9"))
    with pytest.raises(KeyFileError) as info:
        load_run_keys(tmp_path)
    assert "S" * 39 not in str(info.value)


def test_keypair_validates_in_memory():
    pair = KeyPair.generate()
    other = KeyPair.generate()
    with pytest.raises(KeyFileError, match="does not belong"):
        KeyPair(public=other.public, secret=pair.secret)
    with pytest.raises(KeyFileError, match="malformed"):
        KeyPair(public=pair.public[:-1], secret=pair.secret)
    with pytest.raises(KeyFileError, match="must be Z85 bytes"):
        KeyPair(public=pair.public.decode(), secret=pair.secret)  # type: ignore[arg-type]
    with pytest.raises(KeyFileError, match="server public key"):
        PeerKeys(server_public=b"x" * 40 + b"y", client=pair)


def test_peer_keys_hold_only_what_a_peer_needs(tmp_path):
    keys = create_run_keys(tmp_path / "supervisor")
    host_dir = tmp_path / "agent-host" / "keys"
    write_peer_keys(host_dir, keys.peer())
    assert mode(host_dir) == 0o700
    assert sorted(p.name for p in host_dir.iterdir()) == ["client.key_secret", "server.key"]
    for path in host_dir.iterdir():
        assert mode(path) == 0o600
        assert keys.server.secret not in path.read_bytes()
    assert load_peer_keys(host_dir) == keys.peer()
    # Rewriting (a restarted agent of the same run) replaces atomically.
    write_peer_keys(host_dir, keys.peer())
    assert load_peer_keys(host_dir) == keys.peer()
    assert sorted(p.name for p in host_dir.iterdir()) == ["client.key_secret", "server.key"]
    os.chmod(host_dir / "server.key", 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_peer_keys(host_dir)


# ------------------------------------------------------------- authentication


def run(test):
    """Run ``test(ctx)`` on a fresh loop and context, then destroy the context."""

    async def main():
        ctx = zmq.asyncio.Context()
        try:
            await asyncio.wait_for(test(ctx), timeout=20)
        finally:
            ctx.destroy(linger=0)

    asyncio.run(main())


async def wait_until(predicate, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def assert_exchange(ctx, router: Router, peer_keys: PeerKeys, identity: bytes) -> None:
    async with Dealer(ctx, router.endpoint, peer_keys, identity) as dealer:
        hello = Hello(role="agent", run_id="r", host="h", pid=os.getpid(), version="0")
        assert await dealer.send(hello)
        peer, msg = await asyncio.wait_for(router.recv(), 3)
        assert (peer, msg) == (identity, hello)
        await router.send(peer, Welcome(run_id="r", heartbeat_interval=1.0))
        assert await dealer.recv(timeout=3) == Welcome(run_id="r", heartbeat_interval=1.0)


async def assert_nothing_received(router: Router) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(router.recv(), REFUSED_WAIT_S)


def test_peer_with_run_keys_exchanges_messages(tmp_path):
    keys = create_run_keys(tmp_path)

    async def test(ctx):
        async with Router(ctx, keys) as router:
            await assert_exchange(ctx, router, keys.peer(), b"agent-node1")
            # The keys as an agent's host stores them work the same.
            write_peer_keys(tmp_path / "host", keys.peer())
            await assert_exchange(ctx, router, load_peer_keys(tmp_path / "host"), b"w-0")
            assert router.handshake_failures == 0
            assert router.refused_keys == 0
            assert router.dropped == 0

    run(test)


def test_plain_unkeyed_peer_is_refused(tmp_path):
    keys = create_run_keys(tmp_path)

    async def test(ctx):
        async with Router(ctx, keys) as router:
            plain = ctx.socket(zmq.DEALER)
            try:
                plain.connect(router.endpoint)
                # Not awaited: once the handshake has failed the DEALER has no
                # pipe until it reconnects, and an awaited send can wait for one
                # (it did once, 20 s, in a full run). Queued or not, it must not
                # arrive.
                with contextlib.suppress(zmq.Again):
                    plain.send(encode(Ping(seq=1)), zmq.NOBLOCK)
                await assert_nothing_received(router)
                # Refused in the handshake (mechanism mismatch), before ZAP is asked.
                await wait_until(lambda: router.handshake_failures >= 1)
                assert router.refused_keys == 0
            finally:
                plain.close(linger=0)
            await assert_exchange(ctx, router, keys.peer(), b"good")

    run(test)


def test_peer_with_another_runs_keys_is_refused(tmp_path):
    keys = create_run_keys(tmp_path / "this")
    other = create_run_keys(tmp_path / "other")

    async def test(ctx):
        async with Router(ctx, keys) as router:
            async with Dealer(ctx, router.endpoint, other.peer(), b"stray") as stray:
                assert await stray.send(Ping(seq=1))
                await assert_nothing_received(router)
                await wait_until(lambda: router.handshake_failures >= 1)
            # The server key is public; knowing it does not help without the client key.
            intruder_keys = PeerKeys(server_public=keys.server.public, client=other.client)
            async with Dealer(ctx, router.endpoint, intruder_keys, b"intruder") as intruder:
                failures = router.handshake_failures
                assert await intruder.send(Ping(seq=2))
                await assert_nothing_received(router)
                await wait_until(lambda: router.refused_keys >= 1)  # ZAP said no
                await wait_until(lambda: router.handshake_failures > failures)
                assert await intruder.recv(timeout=0.1) is None
            await assert_exchange(ctx, router, keys.peer(), b"good")

    run(test)


def test_authenticator_admits_only_its_domain(tmp_path):
    """A CURVE server in another ZAP domain of the same context admits nobody."""
    keys = create_run_keys(tmp_path)

    async def test(ctx):
        async with Router(ctx, keys) as router:
            other = ctx.socket(zmq.ROUTER)
            monitor = other.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            try:
                other.zap_domain = b"not-" + ZAP_DOMAIN.encode()
                other.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
                other.curve_server = True
                other.curve_secretkey = keys.server.secret
                port = other.bind_to_random_port("tcp://127.0.0.1")
                async with Dealer(ctx, f"tcp://127.0.0.1:{port}", keys.peer(), b"p") as peer:
                    assert await peer.send(Ping(seq=1))
                    assert await asyncio.wait_for(monitor.recv_multipart(), 3)
                    assert await other.poll(int(REFUSED_WAIT_S * 1000)) == 0
                assert router.refused_keys == 0  # refused for its domain, the key was right
            finally:
                other.disable_monitor()
                monitor.close(linger=0)
                other.close(linger=0)

    run(test)


def test_router_fails_closed_without_its_authenticator(tmp_path):
    """ZAP_ENFORCE_DOMAIN: with no ZAP handler, libzmq refuses instead of admitting anyone."""
    refuse_without_authenticator(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_router_fails_closed_without_its_authenticator_under_load(tmp_path):
    """The loop that found the reaper race: 60 rounds with three busy loops per core."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(3 * (os.cpu_count() or 1))
    ]
    try:
        for round_ in range(60):
            refuse_without_authenticator(tmp_path / str(round_))
    finally:
        for loop in loops:
            os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()


def refuse_without_authenticator(tmp_path):
    keys = create_run_keys(tmp_path)
    other = create_run_keys(tmp_path / "other")

    async def test(ctx):
        async with Router(ctx, keys) as router:
            # Simulate a dead handler; close() copes with it. close() alone hands the
            # ZAP socket to libzmq's reaper thread, which unbinds its inproc endpoint
            # later: under load the intruder's handshake could still reach the dying
            # socket and wait for an answer that never comes (1 run in 7 at load 6).
            # unbind() removes the endpoint before it returns.
            router._auth.zap_socket.unbind(ZAP_ENDPOINT)
            router._auth.stop()
            intruder_keys = PeerKeys(server_public=keys.server.public, client=other.client)
            async with Dealer(ctx, router.endpoint, intruder_keys, b"intruder") as intruder:
                assert await intruder.send(Ping(seq=1))
                await assert_nothing_received(router)
                await wait_until(lambda: router.handshake_failures >= 1)
            assert router.refused_keys == 0  # nobody asked ZAP

    run(test)
