"""Running one benchmark job to completion, the same way in every benchmark."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

__all__ = ["timed_run"]


def timed_run(
    argv: list[str], env: dict[str, str], *, timeout_s: float, cwd: Path
) -> tuple[int, str, float]:
    """Run to completion: (exit code, output, wall seconds). Interrupted (Ctrl-C, the
    timeout), the command gets SIGTERM first: dtlaunch then stops its job on every
    host, and torchrun its workers."""
    start = time.monotonic()
    with subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return proc.returncode, output, time.monotonic() - start
