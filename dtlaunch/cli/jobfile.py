"""``dtlaunch run --config job.toml``: run options from a file, and where each
resolved value came from (``--print-config``).

A job file holds ``dtlaunch run``'s options by name, dashes or underscores alike,
plus ``script`` and ``script_args``; a table groups options by their first word::

    script = "train.py"
    script_args = ["--lr", "0.1"]
    hosts = "hosts.txt"
    nproc-per-node = 4
    policy = "nd"

    [ps]                    # the same as ps_consistency = "asp"
    consistency = "asp"

Precedence, highest first: the command line, ``DTLAUNCH_*`` environment
variables, the job file, the built-in defaults. The file's values become the
command's ``default_map``, which click consults exactly between the environment
and the defaults, so there is one resolution rule for every source. Relative
paths in the file are relative to the current directory, as on the command line.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dtlaunch.cli.app import fail

__all__ = [
    "FILE_ONLY_OPTIONS",
    "args_of_the_given_script",
    "load_job_file",
    "show_resolved_options",
]

# Options that say how to read options (or what to do instead of running): a job
# file that set them would be read too late to matter, so it may not.
FILE_ONLY_OPTIONS = ("config", "print_config", "resume")

# How the four sources are named in --print-config, highest precedence first.
_SOURCE_NAMES = {
    "COMMANDLINE": "command line",
    "ENVIRONMENT": "environment",
    "DEFAULT_MAP": "job file",
    "DEFAULT": "default",
}


def load_job_file(ctx: typer.Context, path: Path | None) -> Path | None:
    """The ``--config`` callback: read ``path`` into the command's ``default_map``.

    It runs eagerly, before any other option takes its value, so every other
    option sees the file as its defaults.

    Raises:
        typer.Exit: (code 2, after printing the reason) the file is unreadable,
            is not TOML, or names an option ``dtlaunch run`` does not have.
    """
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise fail(f"--config {path}: no such file; give the path of a job file") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise fail(f"--config {path}: cannot read it ({reason})") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise fail(f"--config {path}: not valid TOML: {err}; fix the file's syntax") from None
    params = {p.name: p for p in ctx.command.params if p.name and p.name not in FILE_ONLY_OPTIONS}
    values, problems = _flatten(document, params)
    for name, value in values.items():
        param = params[name]
        if isinstance(value, str) and (getattr(param, "multiple", False) or param.nargs == -1):
            values[name] = value = [value]  # one --env or --inject needs no list brackets
        try:  # checked here so that the error names the file, not only the option
            param.process_value(ctx, value)
        except typer.BadParameter as err:
            problems.append(f"{name.replace('_', '-')} = {value!r}: {err.format_message()}")
    if problems:
        raise fail(f"--config {path}: " + "; ".join(problems))
    ctx.default_map = {**(ctx.default_map or {}), **values}
    return path


def _flatten(document: Mapping[str, Any], names: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """The file's ``{option name: value}`` and every key that names no option."""
    known = set(names)
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in document.items():
        if isinstance(value, dict):
            for inner, inner_value in value.items():
                _take(f"{key}_{inner}", f"[{key}] {inner}", inner_value, known, values, problems)
        else:
            _take(key, key, value, known, values, problems)
    return values, problems


def _take(
    key: str,
    shown: str,
    value: Any,
    known: set[str],
    values: dict[str, Any],
    problems: list[str],
) -> None:
    name = key.replace("-", "_")
    if name in known:
        values[name] = value
        return
    refused = FILE_ONLY_OPTIONS if name in FILE_ONLY_OPTIONS else ()
    if refused:
        problems.append(f"{shown!r} cannot be set in a job file; give --{key} on the command line")
        return
    nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    hint = f" (did you mean {nearest[0].replace('_', '-')!r}?)" if nearest else ""
    problems.append(f"unknown key {shown!r}{hint}")


def args_of_the_given_script(ctx: typer.Context, script_args: list[str] | None) -> list[str]:
    """SCRIPT's arguments: a SCRIPT given on the command line does not take the
    job file's ``script_args``, which were written for the file's own script."""
    if _source(ctx, "script") != "DEFAULT_MAP" and _source(ctx, "script_args") == "DEFAULT_MAP":
        return []
    return list(script_args or [])


def _source(ctx: typer.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    return source.name if source else "DEFAULT"


def show_resolved_options(ctx: typer.Context, resolved: Mapping[str, Any]) -> None:
    """Print every run option's value and the source it came from, then stop."""
    table = Table(title="dtlaunch run: resolved options", title_justify="left")
    table.add_column("option")
    table.add_column("value", overflow="fold")
    table.add_column("from")
    for param in ctx.command.params:
        name = param.name
        if not name or name in FILE_ONLY_OPTIONS:
            continue
        source = _source(ctx, name)
        if name == "script_args" and source == "DEFAULT_MAP" and _source(ctx, "script") != source:
            source = "not used: SCRIPT was given on the command line"
        table.add_row(
            name.replace("_", "-"),
            escape(_shown(resolved.get(name))),
            _SOURCE_NAMES.get(source, source.lower()),
        )
    Console().print(table)


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value) or "-"
    return str(value)
