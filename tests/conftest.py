"""Shared fixtures; each lives in its own module and is only registered here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dtlaunch.wire.keys import RunKeys
from tests.runtime_fake import make_keys
from tests.sshd import SshdServer, running_sshd


@pytest.fixture(scope="session")
def sshd() -> Iterator[SshdServer]:
    """A real OpenSSH sshd on 127.0.0.1-3 (one port), for the whole test session."""
    with running_sshd() as server:
        yield server


@pytest.fixture
def keys(tmp_path: Path) -> RunKeys:
    """CURVE keys of a fake supervisor, with the worker's copy under tmp_path."""
    return make_keys(tmp_path)
