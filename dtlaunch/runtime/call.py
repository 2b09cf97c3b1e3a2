"""``python -m dtlaunch.runtime.call MODULE:QUALNAME JSON_ARGS``: how a worker runs
a function given to ``dtlaunch.launch`` (it imports it by name, so it must be
importable on the worker's host; the arguments come as a JSON list).

The function's return value is not sent back: a worker's results belong in its
outputs (files, the model it saves), as with a script. An exception ends the
process with a traceback and exit code 1, so the job's failure table shows it.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["load_function", "main"]


def load_function(reference: str) -> Callable[..., Any]:
    """The function named ``MODULE:QUALNAME``.

    Raises:
        SystemExit: (code 2) the reference is malformed or names nothing callable.
    """
    module_name, sep, qualname = reference.partition(":")
    if not sep or not module_name or not qualname:
        raise SystemExit(f"dtlaunch.runtime.call: expected MODULE:QUALNAME, got {reference!r}")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise SystemExit(
                f"dtlaunch.runtime.call: {module_name} has no {qualname!r}; is the same "
                "version of that module installed on this host?"
            )
    if not callable(target):
        raise SystemExit(f"dtlaunch.runtime.call: {reference} is not callable")
    return target  # type: ignore[no-any-return]


def main(argv: Sequence[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m dtlaunch.runtime.call MODULE:QUALNAME JSON_ARGS")
    function = load_function(argv[0])
    args = json.loads(argv[1])
    function(*args)


if __name__ == "__main__":
    main(sys.argv[1:])
