"""dtlaunch: launch and supervise distributed training on plain SSH clusters."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
