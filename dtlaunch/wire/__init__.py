"""The control wire: messages, their codec, per-run keys and secured sockets.

* ``messages`` — every message as a frozen dataclass (the protocol's contract).
* ``codec`` — msgpack ``encode``/``decode`` with strict validation; ``to_dict``/
  ``from_dict`` for the JSON form (agent bootstrap line, event logs).
* ``keys`` — CURVE keys made per run, stored 0600 in a 0700 directory.
* ``sockets`` — the supervisor's ``Router`` and the peers' ``Dealer``: CURVE with
  a ZAP authenticator that admits only the run's client key, malformed frames
  logged and dropped.
* ``readiness`` — when such a plain ZeroMQ socket may hold a message, told to its
  one receiver on the event loop.

This package knows no policy: it moves validated messages between authenticated
peers, nothing more.
"""

from __future__ import annotations

from dtlaunch.wire.codec import MAX_MESSAGE_BYTES, decode, encode, from_dict, to_dict
from dtlaunch.wire.keys import (
    KeyPair,
    PeerKeys,
    RunKeys,
    create_run_keys,
    load_peer_keys,
    load_run_keys,
    write_peer_keys,
)
from dtlaunch.wire.messages import (
    PROC_ROLES,
    PROC_STATES,
    PROTOCOL_VERSION,
    ROLES,
    STREAMS,
    Ack,
    AgentBootstrap,
    AgentHeartbeat,
    Bye,
    Exited,
    Hello,
    Kill,
    Message,
    Output,
    Ping,
    ProcReport,
    Record,
    Rehello,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    StopJob,
    Welcome,
)
from dtlaunch.wire.sockets import ZAP_DOMAIN, Dealer, Router

__all__ = [
    "MAX_MESSAGE_BYTES",
    "PROC_ROLES",
    "PROC_STATES",
    "PROTOCOL_VERSION",
    "ROLES",
    "STREAMS",
    "ZAP_DOMAIN",
    "Ack",
    "AgentBootstrap",
    "AgentHeartbeat",
    "Bye",
    "Dealer",
    "Exited",
    "Hello",
    "KeyPair",
    "Kill",
    "Message",
    "Output",
    "PeerKeys",
    "Ping",
    "ProcReport",
    "Record",
    "Rehello",
    "Router",
    "RunKeys",
    "Shutdown",
    "Spawn",
    "SpawnFailed",
    "Spawned",
    "StopJob",
    "Welcome",
    "create_run_keys",
    "decode",
    "encode",
    "from_dict",
    "load_peer_keys",
    "load_run_keys",
    "to_dict",
    "write_peer_keys",
]
