"""Wait for a child process from asyncio without a helper thread and without
asyncio's subprocess transport (which kills a still-running child when it is
garbage-collected: an agent must be able to outlive the supervisor's loop)."""

from __future__ import annotations

import asyncio
import os
import subprocess


async def wait_popen(popen: subprocess.Popen[bytes]) -> int:
    """Wait until ``popen`` exits (pidfd readable), then reap it; its return code."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(popen.pid)
    except ProcessLookupError:
        return popen.wait()
    try:
        readable: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(pidfd, on_readable)
        try:
            await readable
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    return popen.wait()
