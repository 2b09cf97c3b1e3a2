"""The built-in parameter server (``--servers M``, PS mode).

* ``blocks`` — parameters cut into blocks, placed on servers by bytes; versioned map.
* ``optim`` — server-side SGD (momentum), Adagrad, Adam, state per block.
* ``store`` — a server's blocks, version counter and BSP / BACKUP(b) / ASP aggregation.
* ``server`` — the server process's loop (``python -m dtlaunch.ps``); ``config`` its env.
* ``client`` — ``Client(model, optimizer=..., lr=...)`` with ``pull()``/``push()``.
* ``transport``, ``frames`` — CURVE sockets carrying a message plus zero-copy tensor frames.
* ``snapshot`` — a server's blocks and optimizer state in one atomic file.
"""

from __future__ import annotations

from dtlaunch.ps.blocks import DEFAULT_BLOCK_BYTES, Block, ParamSpec, Placement, place_lpt, plan
from dtlaunch.ps.client import Client, PsError, ServerTiming
from dtlaunch.ps.optim import OptimizerConfig

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "Block",
    "Client",
    "OptimizerConfig",
    "ParamSpec",
    "Placement",
    "PsError",
    "ServerTiming",
    "place_lpt",
    "plan",
]
