"""Environment variables and options of PS servers and clients, parsed and checked.

The names are the contract with the supervisor and agent (which set them):

* every process: ``DTLAUNCH_KEYS`` (peer key folder), ``DTLAUNCH_RANK``.
* servers: ``DTLAUNCH_INJECT`` (``role=server`` specs; with ``DTLAUNCH_HOST``,
  ``DTLAUNCH_JOB_START`` and ``DTLAUNCH_SEED`` for their windows and coins),
  ``DTLAUNCH_PS_BIND``, ``DTLAUNCH_PS_MODE``, ``DTLAUNCH_PS_BACKUP``,
  ``DTLAUNCH_PS_WORKERS`` (or ``DMLC_NUM_WORKER``), ``DTLAUNCH_PS_SNAPSHOT``,
  ``DTLAUNCH_PS_SNAPSHOT_INTERVAL``, ``DTLAUNCH_PS_RESTORE`` (``DTLAUNCH_PS_RESTORE_OPTIONAL=1``:
  a missing file means start unseeded), ``DTLAUNCH_PS_AWAIT_IMPORT=1`` (a
  migration's target: seeded by the import only),
  ``DTLAUNCH_PS_ENDPOINT_FILE``.
* workers: ``DTLAUNCH_PS_SERVERS`` (comma-separated endpoints, server rank
  order), ``DTLAUNCH_PS_BLOCK_BYTES``, ``DTLAUNCH_PS_TIMEOUT``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dtlaunch.errors import ConfigError
from dtlaunch.inject import InjectionSpec, parse_injections
from dtlaunch.ps.blocks import DEFAULT_BLOCK_BYTES

__all__ = [
    "ENV_BLOCK_BYTES",
    "ENV_KEYS",
    "ENV_SERVERS",
    "ENV_TIMEOUT",
    "ServerConfig",
    "block_bytes_from",
    "endpoints_from",
    "server_config",
    "timeout_from",
    "worker_rank_from",
]

ENV_KEYS = "DTLAUNCH_KEYS"
ENV_SERVERS = "DTLAUNCH_PS_SERVERS"
ENV_BLOCK_BYTES = "DTLAUNCH_PS_BLOCK_BYTES"
ENV_TIMEOUT = "DTLAUNCH_PS_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0  # a BSP pull waits for the slowest worker's push


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    rank: int
    bind: str = "tcp://127.0.0.1:0"
    mode: str = "bsp"  # "bsp" (BACKUP when backup > 0) or "asp"
    workers: tuple[int, ...] = ()  # the workers a BSP step waits for at start
    backup: int = 0
    snapshot_path: Path | None = None
    snapshot_interval_s: float = 0.0  # 0: only on PsSnapshotNow and shutdown
    restore: Path | None = None
    restore_optional: bool = False  # a missing restore file means "start unseeded"
    endpoint_file: Path | None = None  # the bound endpoint is written here
    # A migration's target: its blocks come by import (PsImport), so a worker's
    # PsInit waits for it instead of seeding the server with a version-0 copy.
    await_import: bool = False
    # --inject specs for role=server, and what their windows and coins need
    injections: tuple[InjectionSpec, ...] = ()
    host: str = ""
    job_start_wall: float = 0.0
    seed: int = 0


# option name -> environment variable
_SERVER_ENV = {
    "bind": "DTLAUNCH_PS_BIND",
    "mode": "DTLAUNCH_PS_MODE",
    "backup": "DTLAUNCH_PS_BACKUP",
    "workers": "DTLAUNCH_PS_WORKERS",
    "snapshot": "DTLAUNCH_PS_SNAPSHOT",
    "snapshot_interval": "DTLAUNCH_PS_SNAPSHOT_INTERVAL",
    "restore": "DTLAUNCH_PS_RESTORE",
    "endpoint_file": "DTLAUNCH_PS_ENDPOINT_FILE",
    "keys": ENV_KEYS,
}


def server_config(
    options: Mapping[str, str | None], env: Mapping[str, str]
) -> tuple[ServerConfig, Path]:
    """``ServerConfig`` and the key folder from options (winning) and ``env``.

    Raises:
        ConfigError: a missing or bad value, named with its option and variable.
    """

    def get(name: str) -> str | None:
        value = options.get(name)
        return value if value is not None else env.get(_SERVER_ENV[name]) or None

    keys = get("keys")
    if keys is None:
        raise ConfigError(
            f"no key folder: pass --keys DIR or set {ENV_KEYS} (dtlaunch's agent sets it)"
        )
    rank_text = options.get("rank") or next(
        (env[v] for v in ("DTLAUNCH_RANK", "DMLC_SERVER_ID", "RANK") if env.get(v)), "0"
    )
    rank = _int("--rank / DTLAUNCH_RANK", rank_text, low=0)
    mode = (get("mode") or "bsp").lower()
    if mode not in ("bsp", "asp"):
        raise ConfigError(f"--mode / DTLAUNCH_PS_MODE must be bsp or asp, got {mode!r}")
    workers_text = get("workers")
    if workers_text is not None:
        workers = tuple(
            _int("--workers / DTLAUNCH_PS_WORKERS", w, low=0)
            for w in workers_text.split(",")
            if w.strip()
        )
    else:
        count = _int("DMLC_NUM_WORKER", env.get("DMLC_NUM_WORKER", "0"), low=0)
        workers = tuple(range(count))
    interval = get("snapshot_interval")
    snapshot, restore, endpoint_file = get("snapshot"), get("restore"), get("endpoint_file")
    config = ServerConfig(
        rank=rank,
        bind=get("bind") or "tcp://127.0.0.1:0",
        mode=mode,
        workers=workers,
        backup=_int("--backup / DTLAUNCH_PS_BACKUP", get("backup") or "0", low=0),
        snapshot_path=Path(snapshot) if snapshot else None,
        snapshot_interval_s=_seconds("--snapshot-interval", interval) if interval else 0.0,
        restore=Path(restore) if restore else None,
        restore_optional=env.get("DTLAUNCH_PS_RESTORE_OPTIONAL") == "1",
        await_import=env.get("DTLAUNCH_PS_AWAIT_IMPORT") == "1",
        endpoint_file=Path(endpoint_file) if endpoint_file else None,
        injections=parse_injections(
            t for t in env.get("DTLAUNCH_INJECT", "").split(";") if t.strip()
        ),
        host=env.get("DTLAUNCH_HOST", ""),
        job_start_wall=_float("DTLAUNCH_JOB_START", env.get("DTLAUNCH_JOB_START") or "0"),
        seed=_int("DTLAUNCH_SEED", env.get("DTLAUNCH_SEED") or "0", low=0),
    )
    return config, Path(keys)


def endpoints_from(env: Mapping[str, str]) -> list[str]:
    """Raises: ConfigError when ``DTLAUNCH_PS_SERVERS`` is unset or malformed."""
    raw = env.get(ENV_SERVERS, "")
    endpoints = [e.strip() for e in raw.split(",") if e.strip()]
    if not endpoints:
        raise ConfigError(
            f"no parameter servers: pass servers=[...] to dtlaunch.ps.Client or set "
            f"{ENV_SERVERS}=tcp://HOST:PORT,... (dtlaunch run --servers M sets it)"
        )
    bad = [e for e in endpoints if not e.startswith("tcp://") or ":" not in e[6:]]
    if bad:
        raise ConfigError(f"{ENV_SERVERS}: {bad[0]!r} is not tcp://HOST:PORT")
    return endpoints


def block_bytes_from(env: Mapping[str, str]) -> int:
    raw = env.get(ENV_BLOCK_BYTES)
    return DEFAULT_BLOCK_BYTES if not raw else _int(ENV_BLOCK_BYTES, raw, low=1)


def timeout_from(env: Mapping[str, str]) -> float:
    raw = env.get(ENV_TIMEOUT)
    return DEFAULT_TIMEOUT_S if not raw else _seconds(ENV_TIMEOUT, raw)


def worker_rank_from(env: Mapping[str, str]) -> int:
    """A worker's rank from the launcher's variables (0 when none is set).

    Raises: ConfigError when the variable is not an integer.
    """
    for name in ("DTLAUNCH_RANK", "RANK", "DMLC_WORKER_ID"):
        raw = env.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not an integer") from None
    return 0


def _int(label: str, text: str, *, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{label}: {text!r} is not an integer") from None
    if value < low:
        raise ConfigError(f"{label}: {value} must be {low} or more")
    return value


def _float(label: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{label}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{label}: {text!r} must be a finite number")
    return value


def _seconds(label: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{label}: {text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{label}: {text!r} must be more than 0 seconds")
    return value
