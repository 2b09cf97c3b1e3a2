"""Shared fixtures; each lives in its own module and is only registered here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sshd import SshdServer, running_sshd


@pytest.fixture(scope="session")
def sshd() -> Iterator[SshdServer]:
    """A real OpenSSH sshd on 127.0.0.1-3 (one port), for the whole test session."""
    with running_sshd() as server:
        yield server
