"""Running one benchmark job to completion, the same way in every benchmark, and
the loopback SSH hosts the jobs run on."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["loopback_sshd", "timed_run"]


@contextlib.contextmanager
def loopback_sshd(
    addresses: Sequence[str], *, name: str, keep: bool
) -> Iterator[tuple[Any, Path, dict[str, str]]]:
    """A real sshd listening on ``addresses`` (loopback "hosts"), a scratch folder
    for run directories (kept if ``keep``) and the environment that makes
    ``dtlaunch`` reach the sshd; all stopped and removed on exit."""
    from tests.sshd import running_sshd

    with (
        contextlib.ExitStack() as stack,
        tempfile.TemporaryDirectory(prefix=f"{name}-sshd-") as tmp,
        running_sshd(Path(tmp), addresses=addresses) as server,
    ):
        root = Path(tempfile.mkdtemp(prefix=f"{name}-runs-"))
        if not keep:
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **server.env())
        env.pop("DTLAUNCH_HOSTS", None)
        yield server, root, env


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
