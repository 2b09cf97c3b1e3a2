"""``python -m dtlaunch.agent``: read the bootstrap line from stdin, then run the agent.

The supervisor starts this over SSH (or as a local subprocess) and writes one
JSON line, an ``AgentBootstrap``, to its stdin. Exit codes: 0 after Shutdown,
orphan timeout or SIGTERM/SIGINT; 2 when the bootstrap or the state_dir is bad.

The agent must survive its SSH channel closing: SIGHUP is ignored, logging
errors are swallowed (stderr may be gone) and stderr writes never block (a full
pipe nobody reads must not stall the agent). ``<state_dir>/agent.log`` keeps
the whole log either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import stat
import sys
from pathlib import Path

from dtlaunch.agent.agent import run_agent
from dtlaunch.errors import DtlaunchError, WireError
from dtlaunch.proctitle import name_this_process
from dtlaunch.wire.codec import from_dict
from dtlaunch.wire.messages import AgentBootstrap

EXIT_BAD_BOOTSTRAP = 2
LOG_FORMAT = "%(asctime)s %(levelname)s agent[%(process)d] %(name)s: %(message)s"


class NonBlockingStderrHandler(logging.Handler):
    """Writes records to fd 2 without ever blocking; drops them when it cannot."""

    def __init__(self) -> None:
        super().__init__()
        try:
            mode = os.fstat(2).st_mode
            # Only pipes/sockets (the SSH channel, the supervisor's pipe): the flag is
            # shared with every holder of the descriptor, and a terminal left
            # non-blocking breaks the user's shell.
            if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                flags = fcntl.fcntl(2, fcntl.F_GETFL)
                fcntl.fcntl(2, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        except OSError:
            pass  # no stderr at all: emit drops everything

    def emit(self, record: logging.LogRecord) -> None:
        # A full pipe or a closed channel drops the line; agent.log still has it.
        with contextlib.suppress(OSError):
            os.write(2, (self.format(record) + "\n").encode("utf-8", "replace"))


def parse_bootstrap(line: str) -> AgentBootstrap:
    """Parse the bootstrap line; raise WireError naming what is wrong."""
    if not line.strip():
        raise WireError("stdin was empty or closed before the bootstrap line arrived")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WireError(f"bootstrap line is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WireError(f"bootstrap line holds a JSON {type(data).__name__}, expected an object")
    return from_dict(AgentBootstrap, data)


def setup_logging(state_dir: Path) -> None:
    logging.raiseExceptions = False
    root = logging.getLogger()
    root.setLevel(os.environ.get("DTLAUNCH_AGENT_LOG_LEVEL", "INFO").upper())
    formatter = logging.Formatter(LOG_FORMAT)
    handlers: list[logging.Handler] = [
        NonBlockingStderrHandler(),
        logging.FileHandler(state_dir / "agent.log", encoding="utf-8"),
    ]
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)


def main(bootstrap_line: str | None = None) -> int:
    """Run the agent; its bootstrap is ``bootstrap_line`` when the caller read it
    already (the launcher's one-session start, ``supervisor.launcher``), else the
    first line of stdin."""
    # The SSH channel closing must not take the agent (and the job) down.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.raiseExceptions = False
    if bootstrap_line is None:
        bootstrap_line = sys.stdin.readline()
    try:
        boot = parse_bootstrap(bootstrap_line)
    except (WireError, UnicodeDecodeError) as exc:
        print(
            f"dtlaunch.agent: invalid bootstrap on stdin: {exc}. The supervisor must write "
            "one JSON line (an AgentBootstrap) to the agent's stdin; run the same dtlaunch "
            "version on both sides",
            file=sys.stderr,
        )
        return EXIT_BAD_BOOTSTRAP
    name_this_process("agent", boot.run_id, f"host={boot.host}")
    state_dir = Path(boot.state_dir)
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        setup_logging(state_dir)
    except OSError as exc:
        print(
            f"dtlaunch.agent: cannot use state_dir {boot.state_dir!r}: {exc}. Fix: give a "
            "writable directory on this host",
            file=sys.stderr,
        )
        return EXIT_BAD_BOOTSTRAP
    try:
        return asyncio.run(run_agent(boot))
    except DtlaunchError as exc:
        logging.getLogger("dtlaunch.agent").error("%s", exc)
        return EXIT_BAD_BOOTSTRAP


if __name__ == "__main__":
    sys.exit(main())
