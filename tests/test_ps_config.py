"""Server/worker configuration from options and env; bad input named with its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtlaunch.errors import ConfigError
from dtlaunch.ps.config import block_bytes_from, endpoints_from, server_config
from dtlaunch.ps.local import LocalServer
from dtlaunch.ps.transport import ServerLink, new_context
from dtlaunch.wire.keys import create_run_keys, load_peer_keys, write_peer_keys
from dtlaunch.wire.messages import PsReply, PsStats, PsStatsRequest


def test_env_gives_the_agent_started_server_its_config():
    env = {
        "DTLAUNCH_KEYS": "/k",
        "DTLAUNCH_RANK": "1",
        "DMLC_NUM_WORKER": "3",
        "DTLAUNCH_PS_MODE": "ASP",
        "DTLAUNCH_PS_SNAPSHOT": "/s/ps-1.pt",
        "DTLAUNCH_PS_SNAPSHOT_INTERVAL": "30",
    }
    config, keys = server_config({"bind": "tcp://10.0.0.2:7000"}, env)
    assert keys == Path("/k")
    assert (config.rank, config.mode, config.workers, config.bind) == (
        1,
        "asp",
        (0, 1, 2),
        "tcp://10.0.0.2:7000",
    )
    assert (config.snapshot_path, config.snapshot_interval_s) == (Path("/s/ps-1.pt"), 30.0)
    config, _ = server_config({"workers": "0,2", "backup": "1"}, env)
    assert (config.workers, config.backup) == ((0, 2), 1)


@pytest.mark.parametrize(
    ("options", "env", "message"),
    [
        ({}, {}, "--keys DIR or set DTLAUNCH_KEYS"),
        ({"mode": "ssp"}, {"DTLAUNCH_KEYS": "/k"}, "must be bsp or asp"),
        ({"backup": "-1"}, {"DTLAUNCH_KEYS": "/k"}, "--backup / DTLAUNCH_PS_BACKUP: -1 must be 0"),
        ({"workers": "0,x"}, {"DTLAUNCH_KEYS": "/k"}, "'x' is not an integer"),
        ({"snapshot_interval": "0"}, {"DTLAUNCH_KEYS": "/k"}, "more than 0 seconds"),
    ],
)
def test_bad_server_settings_are_named(options, env, message):
    with pytest.raises(ConfigError, match=message):
        server_config(options, env)


def test_worker_settings():
    assert endpoints_from({"DTLAUNCH_PS_SERVERS": "tcp://a:1, tcp://b:2"}) == [
        "tcp://a:1",
        "tcp://b:2",
    ]
    with pytest.raises(ConfigError, match="DTLAUNCH_PS_SERVERS=tcp://HOST:PORT"):
        endpoints_from({})
    with pytest.raises(ConfigError, match="is not tcp://HOST:PORT"):
        endpoints_from({"DTLAUNCH_PS_SERVERS": "a:1"})
    assert block_bytes_from({"DTLAUNCH_PS_BLOCK_BYTES": "1024"}) == 1024
    assert block_bytes_from({}) == 4 * 1024 * 1024


def test_the_server_process_exits_2_with_the_fix_on_bad_config():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTLAUNCH_")}
    done = subprocess.run(
        [sys.executable, "-m", "dtlaunch.ps", "--mode", "bsp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "pass --keys DIR or set DTLAUNCH_KEYS" in done.stderr


@pytest.mark.integration
def test_malformed_messages_are_dropped_and_the_server_goes_on(tmp_path):
    write_peer_keys(tmp_path / "keys", create_run_keys(tmp_path / "run").peer())
    keys = load_peer_keys(tmp_path / "keys")
    with LocalServer(rank=0, keys_dir=tmp_path / "keys", state_dir=tmp_path / "ps") as server:
        ctx = new_context()
        link = ServerLink(ctx, server.endpoint, keys, b"prober")
        try:
            link.sock.send_multipart([b"\xc1 not msgpack", b"junk"])
            link.sock.send(b"")
            link.send(PsStatsRequest(request_id=7))
            assert link.sock.poll(10_000)
            reply, _ = link.recv_now()
            assert isinstance(reply, PsStats) and reply.request_id == 7 and reply.version == 0
            link.send(PsReply(request_id=8, ok=True))  # not a request for a server: dropped
            link.send(PsStatsRequest(request_id=9))
            assert link.sock.poll(10_000)
            assert link.recv_now()[0].request_id == 9
        finally:
            link.close()
            ctx.term()
    log = server.log_path.read_text()
    assert "dropped a message" in log and "not a request for a server" in log


def test_ps_messages_are_validated_strictly_on_the_wire():
    import msgpack

    from dtlaunch.errors import WireError
    from dtlaunch.wire.codec import decode
    from dtlaunch.wire.messages import PROTOCOL_VERSION

    push = {
        "t": "ps_push",
        "v": PROTOCOL_VERSION,
        "request_id": 1,
        "worker": -1,
        "step": 0,
        "samples": 1,
        "blocks": [0],
    }
    with pytest.raises(WireError, match="worker: -1 is out of range"):
        decode(msgpack.packb(push))
    init = {
        "t": "ps_init",
        "v": PROTOCOL_VERSION,
        "request_id": 1,
        "worker": 0,
        "blocks": [],
        "optimizer": {"name": "lamb", "lr": 0.1},
    }
    with pytest.raises(WireError, match="'lamb' is not one of sgd, adagrad, adam"):
        decode(msgpack.packb(init))
