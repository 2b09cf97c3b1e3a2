"""Run real ``dtlaunch`` commands from tests and watch their run directories."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def dtlaunch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dtlaunch", *args]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DTLAUNCH_HOSTS", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"  # rich tables in captured output stay on one line each
    env.update(extra or {})
    return env


def run(
    args: list[str], *, env: dict[str, str], timeout: float = 120.0, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run ``dtlaunch ARGS`` to completion, capturing output.

    On timeout the supervisor gets SIGTERM first, so that it stops its job on
    every host instead of leaving agents to their orphan timeout.
    """
    argv = dtlaunch_argv(*args)
    with subprocess.Popen(
        argv,
        env=job_env(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise AssertionError(
                f"dtlaunch {' '.join(args)} timed out after {timeout}s\n{out}\n{err}"
            ) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class Started:
    """A ``dtlaunch run`` in the background, in its own process group."""

    def __init__(
        self, args: list[str], *, env: dict[str, str], log: Path, cwd: Path = REPO
    ) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            dtlaunch_argv(*args),
            env=job_env(env),
            cwd=cwd,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.returncode is not None:
                self._out.close()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def cleanup(self) -> None:
        """Never leave a supervisor behind, whatever the test did."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


@contextlib.contextmanager
def started(args: list[str], *, env: dict[str, str], log: Path) -> Iterator[Started]:
    job = Started(args, env=env, log=log)
    try:
        yield job
    finally:
        job.cleanup()


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def wait_for_event(
    run_dir: Path,
    pred: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 60.0,
    what: str = "event",
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in events(run_dir):
            if pred(event):
                return event
        time.sleep(0.1)
    kinds = [(e["kind"], e.get("host"), e.get("rank")) for e in events(run_dir)]
    raise AssertionError(f"no {what} within {timeout}s; events so far: {kinds}")


def kind(name: str, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["kind"] == name and all(e.get(k) == v for k, v in fields.items())


def summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def alive(pid: int, create_time: float) -> bool:
    """Whether exactly that process (not a reuse of its pid) still runs."""
    try:
        proc = psutil.Process(pid)
        return (
            abs(proc.create_time() - create_time) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.NoSuchProcess:
        return False


def read_line(proc: subprocess.Popen[str], deadline: float, what: str) -> str:
    """The next line of ``proc``'s stdout, failing with ``what`` past ``deadline``
    (a monotonic time) instead of blocking on a process that prints nothing."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(deadline - time.monotonic(), 0))
    assert ready, f"no output from {what} in time"
    return proc.stdout.readline()


def wait_until(cond: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def hostfile(sshd: Any, path: Path, lines: list[str] | None = None) -> Path:
    lines = lines or [f"{addr} slots=1" for addr in sshd.addresses]
    path.write_text("\n".join(lines) + "\n")
    return path


def scale(run_dir: Path, workers: int = 0, servers: int = 0) -> subprocess.CompletedProcess[str]:
    """``dtlaunch scale RUN_DIR --workers N --servers M`` from another shell (0: not
    asked)."""
    asked = [*(["--workers", str(workers)] if workers else [])]
    asked += ["--servers", str(servers)] if servers else []
    return subprocess.run(
        dtlaunch_argv("scale", str(run_dir), *asked, "--timeout", "20"),
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def steps_of(run_dir: Path, rank: int) -> int:
    """Steps with records worker ``rank`` reported (the ``reports`` events)."""
    return sum(
        sum(1 for samples in e["samples"] if samples)
        for e in events(run_dir)
        if e["kind"] == "reports" and e.get("rank") == rank
    )
