"""RNA's trainer for training scripts: ``dtlaunch.rna.Trainer`` (see
``dtlaunch.runtime.rna``). Importing this module loads nothing heavy; torch is
loaded when ``Trainer`` is first used, so a launch host without torch can still
import it (and ``dtlaunch --help`` never does)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtlaunch.runtime.rna import Trainer

__all__ = ["Trainer"]


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        from dtlaunch.runtime.rna import Trainer

        return Trainer
    raise AttributeError(f"module 'dtlaunch.rna' has no attribute {name!r}")
