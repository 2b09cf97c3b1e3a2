"""Session fixtures that a test run builds once, not once per pytest-xdist worker.

Under ``pytest -n 2`` every worker is a session of its own, so a session fixture
that tests on both workers use is built twice: the shared elastic job (two real
3-worker jobs side by side, each slower for the other) and the wheel venv.
:func:`build_once` lets the first worker that needs the thing build it while it
holds a lock in the folder the workers of one run share (the controller's
basetemp), and leave a JSON record of it there; a worker that needs it later
waits for that lock and rebuilds the value from the record. A build that raised
is recorded too, so the other worker fails with the same error instead of
building it a second time. Without xdist it just builds.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def build_once(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    build: Callable[[Path], T],
    encode: Callable[[T], dict[str, Any]],
    decode: Callable[[dict[str, Any]], T],
) -> T:
    """``build(folder)`` in one worker of this run; ``decode`` of its ``encode``d
    value in the others."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return build(tmp_path_factory.mktemp(name))
    # xdist gives each worker <the controller's basetemp>/popen-<id> as its basetemp.
    shared = tmp_path_factory.getbasetemp().parent
    record = shared / f"{name}.json"
    with (shared / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if record.exists():
                data = json.loads(record.read_text())
                if "error" in data:
                    pytest.fail(
                        f"{name} failed in {data['worker']}, which built it:\n{data['error']}",
                        pytrace=False,
                    )
                return decode(data["value"])
            folder = shared / name
            folder.mkdir()
            try:
                value = build(folder)
            except BaseException as exc:
                error = f"{type(exc).__name__}: {exc}"
                record.write_text(json.dumps({"worker": worker, "error": error}))
                raise
            record.write_text(json.dumps({"worker": worker, "value": encode(value)}))
            return value
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
