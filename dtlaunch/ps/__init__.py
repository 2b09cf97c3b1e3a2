"""The built-in parameter server (``--servers M``, PS mode).

* ``blocks`` — parameters cut into blocks, placed on servers by bytes; versioned map.
* ``optim`` — server-side SGD (momentum), Adagrad, Adam, state per block.
* ``store`` — a server's blocks, version counter and BSP / BACKUP(b) / ASP aggregation.
* ``server`` — the server process's loop (``python -m dtlaunch.ps``); ``config`` its env.
* ``client`` — ``Client(model, optimizer=..., lr=...)`` with ``pull()``/``push()``.
* ``exchange`` — requests to all servers at once; notices a restarted server.
* ``transport``, ``frames`` — CURVE sockets carrying a message plus zero-copy tensor frames.
* ``snapshot`` — a server's blocks and optimizer state in one atomic file.

Failover (a server SIGKILLed and started again on its endpoint, restoring its
periodic snapshot when there is one): every answer carries the process's random
``incarnation``, and a pull or push addressed to an earlier one is refused, so
each client notices the restart (``exchange``: pings, incarnations) and resyncs
before anything else: it offers the blocks it last pulled, with their version, and the
server keeps per block the freshest copy, the worker's when it is newer than the
snapshot (keeping the snapshot's optimizer state, or a fresh one without a
snapshot), else the snapshot. A client whose last gradient the kept copy lacks
sends it again. Under BSP a step cannot complete before every member has
resynced (their old-incarnation pushes are refused), so the restarted server
ends up at the newest version any worker or the snapshot had, with every
gradient of the interrupted step applied exactly once: the workers go on in
lockstep, and no step is lost or applied twice.

What a failover can lose:

* parameters: nothing that any worker pulled or the snapshot holds; the
  interrupted step's gradients are re-sent from ``p.grad``, so nothing at all
  when workers leave ``p.grad`` alone between ``push`` and the next ``pull`` (a
  worker whose gradient changed pushes a zero-weight one, and that step applies
  without it);
* optimizer state: when a worker's copy is newer than the snapshot, the updates
  to momentum / Adagrad sums / Adam moments since the snapshot (all of it when the
  server died before its first snapshot: the state starts afresh);
* ASP: the store commits to the first copy it takes; updates applied after that
  copy by the dead process are lost except each worker's last gradient, which its
  worker sends again.

A restarted server waits for the workers of ``DTLAUNCH_PS_WORKERS`` (or the
supervisor's next ``PsMembership``), not those of the dead process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dtlaunch.errors import PsError
from dtlaunch.ps.blocks import DEFAULT_BLOCK_BYTES, Block, ParamSpec, Placement, place_lpt, plan
from dtlaunch.ps.exchange import ServerTiming

if TYPE_CHECKING:
    from dtlaunch.ps.client import Client
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

# Names that need torch, imported on first use: the supervisor imports this package
# (``control``, ``exchange``) and never imports torch.
_LAZY = {"Client": "dtlaunch.ps.client", "OptimizerConfig": "dtlaunch.ps.optim"}


def __getattr__(name: str) -> Any:
    """``Client`` and ``OptimizerConfig`` on first use; a submodule (``dtlaunch.ps.client``)
    as an attribute, as when this package imported them all eagerly."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
