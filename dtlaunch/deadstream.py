"""A standard stream whose reader went away (a closed terminal, a dropped ssh
session, ``| head`` that exited): point its file descriptor at /dev/null, so
that later writes, and Python's last flush at exit, meet no broken pipe again.
Used by the CLI's consoles and by the supervisor's echo of the processes'
output: both go on after their reader left, their record is in the run
directory."""

from __future__ import annotations

import os
from typing import Protocol

__all__ = ["silence"]


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def silence(stream: _HasFileno) -> None:
    """Point ``stream``'s file descriptor at /dev/null. A stream without a real
    descriptor (a test's buffer) is left as it is: its caller stops writing to
    it anyway."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):  # io.UnsupportedOperation is a ValueError and an OSError
        pass
    finally:
        os.close(devnull)
