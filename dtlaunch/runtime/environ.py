"""The variables ``dtlaunch run`` gives a training process, read and checked.

Errors name the variable and the fix: a script started by hand with half of
them set is told to use ``dtlaunch run`` or to unset ``DTLAUNCH_SUPERVISOR``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dtlaunch.errors import ConfigError
from dtlaunch.runtime.client import Connection
from dtlaunch.wire.keys import load_peer_keys

__all__ = ["connection_from_env", "env_float", "env_int"]

ENV_SUPERVISOR = "DTLAUNCH_SUPERVISOR"
ENV_KEYS = "DTLAUNCH_KEYS"
ENV_RUN_ID = "DTLAUNCH_RUN_ID"
ENV_RANK = "DTLAUNCH_RANK"
ENV_ROLE = "DTLAUNCH_ROLE"
ENV_HEARTBEAT = "DTLAUNCH_HEARTBEAT_INTERVAL"
ENV_INIT_TIMEOUT = "DTLAUNCH_INIT_TIMEOUT"
ENV_REPORT_INTERVAL = "DTLAUNCH_REPORT_INTERVAL"
ENV_RNA = "DTLAUNCH_RNA"  # --policy rna: "staleness=S" (dtlaunch.runtime.rna)
DEFAULT_HEARTBEAT_S = 1.0
# Long enough for a supervisor restarted with --resume to come back.
DEFAULT_INIT_TIMEOUT_S = 300.0


def connection_from_env(env: Mapping[str, str], endpoint: str, attempt: int) -> Connection:
    """The supervisor connection the environment describes (``attempt``: restarts so far)."""
    keys_dir = env.get(ENV_KEYS)
    run_id = env.get(ENV_RUN_ID)
    if not keys_dir or not run_id:
        missing = ENV_KEYS if not keys_dir else ENV_RUN_ID
        raise ConfigError(
            f"{ENV_SUPERVISOR} is set but {missing} is not; run the script with dtlaunch run "
            f"(which sets both), or unset {ENV_SUPERVISOR} to run standalone"
        )
    rank_var = ENV_RANK if ENV_RANK in env else "RANK"
    heartbeat = env_float(env, ENV_HEARTBEAT, DEFAULT_HEARTBEAT_S)
    return Connection(
        endpoint=endpoint,
        keys=load_peer_keys(Path(keys_dir)),
        run_id=run_id,
        rank=env_int(env, rank_var, default=None),
        attempt=attempt,
        heartbeat_interval=heartbeat,
    )


def env_int(env: Mapping[str, str], name: str, *, default: int | None) -> int:
    """``name`` as a whole number >= 0; ``default`` when unset (None: required)."""
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(f"{name} is not set; run the script with dtlaunch run")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must be 0 or more")
    return value


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """``name`` as seconds > 0; ``default`` when unset or empty."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be more than 0 seconds")
    return value
