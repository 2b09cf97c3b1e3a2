"""Every exception dtlaunch defines is a DtlaunchError, lives in errors.py and is drawn there."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import dtlaunch
from dtlaunch import errors
from dtlaunch.errors import DtlaunchError

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TF = importlib.util.find_spec("tensorflow") is not None


def _all_modules() -> list[ModuleType]:
    """Every module under dtlaunch/, imported. Only a missing torch or tensorflow may
    keep one out (torch is installed in the dev venv, so there every module is imported).
    """
    modules = []
    for info in pkgutil.walk_packages(dtlaunch.__path__, "dtlaunch."):
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError as exc:
            missing = (exc.name or "").partition(".")[0]
            if (missing == "torch" and not HAVE_TORCH) or (missing == "tensorflow" and not HAVE_TF):
                continue
            raise
    return modules


def _defined_exceptions() -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in _all_modules():
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.partition(".")[0] == "dtlaunch"
            ):
                found.add(value)
    return found


def _error_classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }


# One drawn node: the box-drawing prefix, then the class name.
_NODE = re.compile(r"^(?P<prefix>[ │├└─]*)(?P<name>[A-Z]\w*)\b")


def _drawn_parents() -> dict[str, str | None]:
    """The tree in errors.py's docstring as {class: parent class} (None for the root)."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name) along the current path
    for line in block.splitlines():
        if not line.strip():
            if parents:
                break  # the drawing ends at its first blank line
            continue
        match = _NODE.match(line)
        assert match, f"not a node of the drawing: {line!r}"
        column, name = len(match["prefix"]), match["name"]
        while stack and stack[-1][0] >= column:
            stack.pop()
        assert name not in parents, f"{name} drawn twice"
        parents[name] = stack[-1][1] if stack else None
        stack.append((column, name))
    return parents


def test_every_exception_is_a_dtlaunch_error() -> None:
    strays = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in _defined_exceptions()
        if not issubclass(cls, DtlaunchError)
    )
    assert strays == []


def test_every_exception_is_defined_in_errors_py() -> None:
    elsewhere = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in _defined_exceptions()
        if cls.__module__ != errors.__name__
    )
    assert elsewhere == []


def test_the_docstring_draws_the_whole_tree() -> None:
    classes = _error_classes()
    drawn = _drawn_parents()
    assert sorted(drawn) == sorted(classes)
    for name, cls in classes.items():
        ours = [base.__name__ for base in cls.__bases__ if issubclass(base, DtlaunchError)]
        expected = drawn[name]
        assert ours == ([expected] if expected else []), f"{name} is drawn under {expected}"


def test_the_docstring_names_every_other_class_too() -> None:
    """Such as ``SshFailure``, the vocabulary of ``SshConnectError.kind``."""
    others = [
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and value.__module__ == errors.__name__
        and not issubclass(value, BaseException)
    ]
    assert [name for name in others if name not in (errors.__doc__ or "")] == []


def test_errors_py_imports_only_the_standard_library() -> None:
    """Every layer may import it, so it imports no layer, not even lazily."""
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = {
        alias.name.partition(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").partition(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert sorted(imported - sys.stdlib_module_names - {"__future__"}) == []


# The modules that defined these before they moved here; tests and users import them there.
OLD_HOMES = {
    "WalCorruptError": "dtlaunch.supervisor.wal.format",
    "WalVersionError": "dtlaunch.supervisor.wal.format",
    "WalFsyncError": "dtlaunch.supervisor.wal.files",
    "LockHeldError": "dtlaunch.supervisor.wal.files",
    "DdsStateError": "dtlaunch.supervisor.dds.records",
    "PsError": "dtlaunch.ps.exchange",
    "ServerRestarted": "dtlaunch.ps.exchange",
    "InfeasibleError": "dtlaunch.solvers.batch",
    "SshConnectError": "dtlaunch.sshconn",
    "SshFailure": "dtlaunch.sshconn",
}


@pytest.mark.parametrize(("name", "module"), sorted(OLD_HOMES.items()))
def test_moved_classes_stay_importable_from_their_old_modules(name: str, module: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_infeasible_is_still_a_value_error() -> None:
    assert issubclass(errors.InfeasibleError, ValueError)
