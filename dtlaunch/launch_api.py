"""``dtlaunch.launch()``: a supervised job from Python, for notebooks and pipelines.

(The package face exports ``launch``; this module is ``launch_api`` so that
importing it never replaces the function ``dtlaunch.launch`` with a module.)

Like torch's ``elastic_launch``, but it is the same job ``dtlaunch run`` starts:
the same options (as keyword arguments, the command line's defaults), the same
supervisor, run directory, restarts and straggler policies::

    import dtlaunch

    result = dtlaunch.launch("train.py", ["--epochs", "3"], workers=4, policy="nd")
    print(result.summary["jct_s"], result.run_dir)

    # or a function that every worker runs, importable by name on every host:
    result = dtlaunch.launch(mypackage.train.main, [0.1], hosts="hosts.txt", workers=8)

A job that does not succeed raises :class:`~dtlaunch.errors.JobFailed` carrying
its summary and a message naming the root cause. ``DTLAUNCH_*`` environment
variables and job files are the command line's: here every option is explicit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from dtlaunch.config import RunOptions
from dtlaunch.errors import ConfigError, JobFailed

__all__ = ["CALL_MODULE", "LaunchResult", "launch"]

# The module a worker runs to call a launched function (``python -m CALL_MODULE``).
CALL_MODULE = "dtlaunch.runtime.call"


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """A job that succeeded: its run directory and its ``summary.json``."""

    run_dir: Path
    summary: dict[str, Any]


def launch(
    target: str | Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    console: TextIO | None = None,
    **options: Any,
) -> LaunchResult:
    """Run ``target`` as a supervised job and wait for its end.

    ``target`` is a script path (a module name with ``module=True``) whose
    arguments are ``args``, or a function every worker calls with ``args``: it
    must be defined at the top level of a module the hosts can import (not in
    ``__main__`` or a notebook), and ``args`` must be JSON values. ``options``
    are ``dtlaunch run``'s options by their Python names (``workers=4``,
    ``hosts="hosts.txt"``, ``policy="nd"``, ``run_dir=...``). The processes'
    output goes to ``console`` (default: this process's stdout).

    Raises:
        ConfigError: an unknown option (the nearest is named), a function that
            the hosts cannot import, arguments that are not JSON, or any option
            ``dtlaunch run`` would refuse; nothing was started.
        HostfileError, RunDirError: as ``dtlaunch run`` reports them.
        JobFailed: the job ended without succeeding.
    """
    known = {f.name for f in dataclasses.fields(RunOptions)} - {"script", "script_args"}
    for name in options:
        if name not in known:
            nearest = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {nearest[0]}=?" if nearest else ""
            raise ConfigError(f"dtlaunch.launch() has no option {name!r}{hint}")
    options = _paths_as_paths(options)
    script, script_args, module = _command(target, args, bool(options.pop("module", False)))
    spec = RunOptions(script=script, script_args=script_args, module=module, **options).job_spec()
    summary = _run(spec, console)
    if summary["status"] != "succeeded":
        raise JobFailed(_failure_message(summary, spec.run_dir), summary, spec.run_dir)
    return LaunchResult(run_dir=spec.run_dir, summary=summary)


def _paths_as_paths(options: dict[str, Any]) -> dict[str, Any]:
    """Path options given as ``str`` (as most callers write them) become ``Path``."""
    fixed = dict(options)
    for name in ("run_dir", "env_file"):
        if isinstance(fixed.get(name), str | os.PathLike):
            fixed[name] = Path(fixed[name])
    configs = fixed.get("ssh_config")
    if isinstance(configs, str | os.PathLike):
        configs = [configs]
    if isinstance(configs, list | tuple):
        fixed["ssh_config"] = [Path(c) for c in configs]
    return fixed


def _command(
    target: str | Callable[..., Any], args: Sequence[Any], module: bool
) -> tuple[str, list[str], bool]:
    """``(script, script_args, module)`` that run ``target`` in every worker."""
    if isinstance(target, str | Path):
        return str(target), [str(a) for a in args], module
    if not callable(target):
        raise ConfigError(f"dtlaunch.launch() runs a script path or a function, not {target!r}")
    where = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", "")
    if not where or where == "__main__" or "<" in name:
        raise ConfigError(
            f"dtlaunch.launch() cannot run {name or target!r}: workers import the function "
            "by name on every host, so define it at the top level of a module there "
            "(not in __main__, a notebook cell or another function)"
        )
    try:
        encoded = json.dumps(list(args))
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"dtlaunch.launch() passes a function's args as JSON to every worker: {err}; "
            "pass numbers, strings, lists and dicts (and load anything bigger from a file)"
        ) from None
    return CALL_MODULE, [f"{where}:{name}", encoded], True


def _run(spec: Any, console: TextIO | None) -> dict[str, Any]:
    """Run the job on an event loop of its own; in a thread when this one has a
    loop running (a notebook), since asyncio allows one loop per thread."""
    from dtlaunch.supervisor.job import run_job_to_end  # heavy: only when a job runs

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_job_to_end(spec, console=console).summary
    outcome: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            outcome.append(run_job_to_end(spec, console=console).summary)
        except BaseException as err:  # handed to the caller's thread below
            errors.append(err)

    # No timeout on the join: the job's own watchdogs (heartbeats, the stall
    # timeout, the restart budget) bound it, exactly as for ``dtlaunch run``.
    worker = threading.Thread(target=in_thread, name=f"dtlaunch-{spec.run_id}")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return outcome[0]


def _failure_message(summary: dict[str, Any], run_dir: Path) -> str:
    failures = summary.get("failures") or []
    root = next((f for f in failures if f.get("root_cause")), failures[0] if failures else None)
    message = f"job {summary['run_id']} {summary['status']}"
    if root is not None:
        rank = root.get("rank", -1)
        process = root.get("role", "process") + (str(rank) if rank >= 0 else "")
        message += f": root cause {process} on {root.get('host', '?')}: {root.get('error', '')}"
    return f"{message.rstrip(': ')} (logs and events in {run_dir})"
