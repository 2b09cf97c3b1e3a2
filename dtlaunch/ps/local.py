"""Start a ``python -m dtlaunch.ps`` process on this machine and wait for its endpoint.

The agent starts servers like any process (with the env of
``supervisor/environment.py``); this helper is for embedded use, tests and
benchmarks, where nothing else would: it sets the same ``DTLAUNCH_*`` variables,
waits for the endpoint file, and stops the process (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from dtlaunch.errors import LaunchError

__all__ = ["LocalServer"]

START_TIMEOUT_S = 30.0


class LocalServer:
    """One server process; ``endpoint`` once started. Use as a context manager."""

    def __init__(
        self,
        *,
        rank: int,
        keys_dir: Path,
        state_dir: Path,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.rank = rank
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.endpoint_file = state_dir / f"server-{rank}.endpoint"
        self.endpoint_file.unlink(missing_ok=True)
        self.log_path = state_dir / f"server-{rank}.log"
        full_env = dict(os.environ)
        full_env.update(
            {
                "DTLAUNCH_KEYS": str(keys_dir),
                "DTLAUNCH_RANK": str(rank),
                "DTLAUNCH_PS_ENDPOINT_FILE": str(self.endpoint_file),
                "OMP_NUM_THREADS": full_env.get("OMP_NUM_THREADS", "1"),
            }
        )
        full_env.update(env or {})
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [python, "-m", "dtlaunch.ps"],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.endpoint = ""

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        """The server's endpoint, once it is bound.

        Raises:
            LaunchError: the process exited or did not bind within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.endpoint_file.exists():
                self.endpoint = self.endpoint_file.read_text().strip()
                return self.endpoint
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        tail = self.log_path.read_text(errors="replace")[-2000:]
        raise LaunchError(f"PS server {self.rank} did not start (log {self.log_path}):\n{tail}")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM (the server snapshots and exits), SIGKILL after ``grace``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> LocalServer:
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
