"""Python stacks of a running process, with py-spy, for the stall diagnosis.

When the supervisor's stall watchdog fires it asks each agent for the stacks of
its stuck processes (``DumpStacks``) before restarting them, so the event log
says *where* they were stuck, not only that they were. py-spy reads another
process's memory; it needs no cooperation from the script and works on a
process that is blocked in C code or SIGSTOPped. ``--nonblocking`` never pauses
the target (pausing fails on a stopped process and is not needed: a stuck stack
does not move), and ``--subprocesses`` includes a worker's children (data
loader workers, a launcher's python).

py-spy is optional (``pip install 'dtlaunch[diag]'``). Without it, or when the
kernel refuses the read (ptrace rules for non-root users), the answer says so
and what to do; the stall is handled the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

__all__ = ["DUMP_TIMEOUT_S", "MAX_STACK_BYTES", "dump_stacks", "find_py_spy"]

DUMP_TIMEOUT_S = 10.0  # a dump takes tens of milliseconds; a hung one is killed
MAX_STACK_BYTES = 64 << 10  # per process: enough for dozens of threads


def find_py_spy() -> str | None:
    """py-spy next to the agent's Python (a venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    import shutil  # here: only a stall needs it, and it costs every agent's start ~3 ms

    return shutil.which("py-spy")


async def dump_stacks(pid: int, *, timeout_s: float = DUMP_TIMEOUT_S) -> str:
    """py-spy's dump of ``pid`` and its children, or a line saying why there is none."""
    tool = find_py_spy()
    if tool is None:
        return (
            "no stacks: py-spy is not installed on this host "
            "(pip install 'dtlaunch[diag]' into the Python that runs the agent)"
        )
    argv = [tool, "dump", "--nonblocking", "--subprocesses", "--pid", str(pid)]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group, stopped as one on timeout
        env={**os.environ, "RUST_BACKTRACE": "0"},
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return f"no stacks: py-spy did not answer within {timeout_s:g} s"
    except BaseException:  # cancelled: never leave py-spy behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        detail = " ".join(text.split())[:500] or f"exit {proc.returncode}"
        hint = (
            " (as a non-root user, allow ptrace: sysctl kernel.yama.ptrace_scope=0)"
            if "ermission" in text
            else ""
        )
        return f"no stacks: py-spy failed for pid {pid}: {detail}{hint}"
    if len(text) > MAX_STACK_BYTES:
        text = text[:MAX_STACK_BYTES] + f"\n[cut at {MAX_STACK_BYTES} bytes]\n"
    return text
