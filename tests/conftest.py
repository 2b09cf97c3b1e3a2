"""Shared fixtures; each lives in its own module and is only registered here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dtlaunch.wire.keys import RunKeys
from tests.elastic_run import ElasticRun, run_elastic_job
from tests.once import build_once
from tests.runtime_fake import make_keys
from tests.sshd import SshdServer, running_sshd
from tests.wheel_venv import WheelVenv, build_wheel_venv


@pytest.fixture(scope="session")
def sshd() -> Iterator[SshdServer]:
    """A real OpenSSH sshd on 127.0.0.1-3 (one port), for the whole test session."""
    with running_sshd() as server:
        yield server


@pytest.fixture(scope="session")
def elastic_run(sshd: SshdServer, tmp_path_factory: pytest.TempPathFactory) -> ElasticRun:
    """A finished allreduce job in which nd replaced a host-bound straggler on the
    spare host (see tests/elastic_run.py); one for the whole run, whichever
    pytest-xdist worker needs it first runs it (tests/once.py)."""
    return build_once(
        tmp_path_factory,
        "elastic",
        lambda base: run_elastic_job(sshd, base),
        ElasticRun.encode,
        ElasticRun.decode,
    )


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """``python -m build``'s wheel installed, without extras, in a fresh venv (see
    tests/wheel_venv.py); built once per run (tests/once.py), for tests/test_wheel.py
    and tests/test_no_torch.py."""
    return build_once(
        tmp_path_factory, "wheel", build_wheel_venv, WheelVenv.encode, WheelVenv.decode
    )


@pytest.fixture
def keys(tmp_path: Path) -> RunKeys:
    """CURVE keys of a fake supervisor, with the worker's copy under tmp_path."""
    return make_keys(tmp_path)
