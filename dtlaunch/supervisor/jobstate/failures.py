"""Classify a process exit as success, retryable or unretryable (AntDT §V-D).

Retryable: the process was killed by a signal (including our own KILL_RESTART,
an OOM kill, a preemption), its host's agent or connection was lost, or it died
with an ordinary runtime error later in training. Unretryable: the user's code
or command line is broken, which restarting cannot fix — a Python traceback of
a syntax/import type, or a usage error, within the first seconds of the run.
Pure functions; no I/O.
"""

from __future__ import annotations

import re
import signal as signal_module
from dataclasses import dataclass

# Exceptions that mean "this program cannot run as written".
UNRETRYABLE_EXCEPTIONS = frozenset(
    {
        "SyntaxError",
        "IndentationError",
        "TabError",
        "ImportError",
        "ModuleNotFoundError",
        "ConfigError",  # dtlaunch's own: e.g. dtlaunch.init() disagrees with the run options
    }
)
# An exit later than this is a failure during training, worth retrying.
EARLY_EXIT_S = 30.0

_EXC_LINE_RE = re.compile(
    r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(?::|$)"
)
_USAGE_MARKERS = ("usage:", "error: unrecognized arguments", "error: the following arguments")
_CANT_OPEN_RE = re.compile(r"can't open file .*\[Errno 2\]")
# ``python -m no_such_module`` prints this (no traceback) and exits 1.
_NO_MODULE_RE = re.compile(r"No module named \S+")
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
_LIBRARY_FRAME_RE = re.compile(r"^<|[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python3[\d.]*[/\\]")
# An attempt that ran this long made progress, whether or not it reported steps.
CRASH_LOOP_RUNTIME_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitVerdict:
    succeeded: bool
    retryable: bool
    reason: str  # short, for tables: "killed by SIGKILL", "ImportError", ...
    error: str  # one line for a person: the exception line or the exit status


def signal_name(signum: int) -> str:
    try:
        return signal_module.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def last_exception_line(stderr_tail: list[str]) -> str:
    """The last ``SomeError: message`` line of a Python traceback, or ``""``."""
    for line in reversed(stderr_tail):
        stripped = line.strip()
        if _EXC_LINE_RE.match(stripped):
            return stripped
    return ""


def exception_name(line: str) -> str:
    match = _EXC_LINE_RE.match(line)
    if match is None:
        return ""
    return match.group("name").rsplit(".", 1)[-1]


def classify_exit(
    *,
    exit_code: int | None,
    signal: int | None,
    runtime_s: float,
    stderr_tail: list[str],
    oom_killed: bool = False,
) -> ExitVerdict:
    """Decide what a process exit means for the job."""
    if oom_killed:
        return ExitVerdict(
            succeeded=False,
            retryable=True,
            reason="oom-kill",
            error="killed by the kernel's OOM killer (out of memory)",
        )
    if signal is None and exit_code is not None and exit_code > 128 and exit_code - 128 < 65:
        # A shell or wrapper that reports a signal death the POSIX way.
        signal = exit_code - 128
    if signal is not None:
        name = signal_name(signal)
        return ExitVerdict(
            succeeded=False, retryable=True, reason=f"killed by {name}", error=f"killed by {name}"
        )
    if exit_code == 0:
        return ExitVerdict(succeeded=True, retryable=False, reason="succeeded", error="")

    exc_line = last_exception_line(stderr_tail)
    exc = exception_name(exc_line)
    early = runtime_s <= EARLY_EXIT_S
    text = "\n".join(stderr_tail)
    if early and exc in UNRETRYABLE_EXCEPTIONS:
        return ExitVerdict(succeeded=False, retryable=False, reason=exc, error=exc_line)
    if early and not exc and _NO_MODULE_RE.search(text):
        line = next(ln.strip() for ln in stderr_tail if _NO_MODULE_RE.search(ln))
        return ExitVerdict(succeeded=False, retryable=False, reason="module not found", error=line)
    if early and _CANT_OPEN_RE.search(text):
        line = next(ln.strip() for ln in stderr_tail if _CANT_OPEN_RE.search(ln))
        return ExitVerdict(succeeded=False, retryable=False, reason="script not found", error=line)
    if early and not exc and exit_code == 2 and any(m in text for m in _USAGE_MARKERS):
        line = next(
            (ln.strip() for ln in reversed(stderr_tail) if "error:" in ln),
            f"exit code {exit_code}",
        )
        return ExitVerdict(succeeded=False, retryable=False, reason="bad arguments", error=line)
    error = exc_line or f"exit code {exit_code}"
    return ExitVerdict(
        succeeded=False, retryable=True, reason=exc or f"exit code {exit_code}", error=error
    )


def failure_signature(stderr_tail: list[str]) -> str:
    """What makes two crashes "the same": the exception's type and the innermost
    frame of the traceback (``KeyError at train.py:12``); ``""`` without a
    traceback (a signal, a lost host: the environment, not the code)."""
    exc = exception_name(last_exception_line(stderr_tail))
    frames = [m for ln in stderr_tail if (m := _FRAME_RE.match(ln))]
    if not exc or not frames:
        return ""
    # The user's code, not the library it called (os.environ raises in <frozen os>).
    own = [m for m in frames if not _LIBRARY_FRAME_RE.search(m.group("file"))] or frames
    return f"{exc} at {own[-1].group('file')}:{own[-1].group('line')}"


def traceback_tail(stderr_tail: list[str], lines: int = 6) -> list[str]:
    """The last lines of the traceback (or of stderr) worth showing in a table."""
    # Python 3.11+ marks the failing expression with lines of ^ and ~: noise in a table.
    kept = [ln.rstrip() for ln in stderr_tail if ln.strip() and ln.strip(" ^~")]
    return kept[-lines:]
