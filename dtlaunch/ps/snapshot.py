"""A server's blocks and optimizer state in one file, written atomically.

The file is ``torch.save`` of plain containers (tensors, ints, floats, strings),
read back with ``weights_only=True``. It is written to a temporary name, fsynced
and renamed, so a server killed mid-write leaves the previous snapshot intact.
What a restore alone loses: the updates applied after the snapshot was taken;
the workers' resync then brings back the parameters from their last pulls, so
only the optimizer state since the snapshot is gone (``dtlaunch.ps.server``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from dtlaunch.errors import ConfigError
from dtlaunch.ps.optim import BlockState, OptimizerConfig

__all__ = ["FORMAT", "Snapshot", "read_snapshot", "write_snapshot", "write_text_atomically"]

FORMAT = "dtlaunch-ps-snapshot-1"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    server: int
    version: int
    optimizer: OptimizerConfig
    blocks: dict[int, tuple[torch.Tensor, BlockState]]


def write_snapshot(path: Path, snap: Snapshot) -> None:
    """Raises: OSError when the file cannot be written (the old one stays)."""
    data: dict[str, Any] = {
        "format": FORMAT,
        "server": snap.server,
        "version": snap.version,
        "optimizer": dataclasses.asdict(snap.optimizer),
        "blocks": {
            block_id: {"param": param, "step": state.step, "state": dict(state.tensors)}
            for block_id, (param, state) in snap.blocks.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_snapshot(path: Path) -> Snapshot:
    """Raises: ConfigError when the file is missing or not a PS snapshot."""
    try:
        data = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"PS snapshot {path} does not exist; check --restore") from None
    except Exception as exc:  # torch.load raises many types for a bad file
        raise ConfigError(f"{path} is not a readable PS snapshot: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a dtlaunch PS snapshot ({FORMAT})")
    try:
        blocks = {
            int(block_id): (
                entry["param"],
                BlockState(step=int(entry["step"]), tensors=dict(entry["state"])),
            )
            for block_id, entry in data["blocks"].items()
        }
        return Snapshot(
            server=int(data["server"]),
            version=int(data["version"]),
            optimizer=OptimizerConfig(**data["optimizer"]).validate(),
            blocks=blocks,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} is a damaged PS snapshot: {exc!r}") from exc


def write_text_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
