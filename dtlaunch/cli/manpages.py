"""Man pages generated from the ``dtlaunch`` command line itself.

``python -m dtlaunch.cli.manpages OUT_DIR`` writes ``dtlaunch.1`` and one page per
sub-command (``dtlaunch-run.1``, ``dtlaunch-wal-repair.1``, ...) from the typer
app, so that the pages cannot drift from ``--help``. The roff is written here
(a small subset of the man(7) macros) rather than by a dependency. The output
is deterministic: no date, the package version in the ``.TH`` line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import typer.main

from dtlaunch.version import __version__

__all__ = ["ManPage", "generate", "main", "roff_escape", "write_pages"]

MANUAL = "dtlaunch manual"
HAND_WRITTEN_SEE_ALSO = ("dtlaunch-hostfile(5)",)
# Pages whose options take a hostfile also point at its format page.
_HOSTFILE_OPTION = "--hosts"
ENV_CONVENTION = (
    "Options of the sub-commands may also come from environment variables named "
    "DTLAUNCH_<OPTION> (for example DTLAUNCH_WORKERS=8); each command's page lists the ones "
    "it reads. A command-line option wins over its variable."
)
_TYPE_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "bool": ""}


@dataclass(frozen=True, slots=True, kw_only=True)
class ManPage:
    filename: str  # e.g. "dtlaunch-run.1"
    text: str


def roff_escape(text: str) -> str:
    """Text safe on a roff text line: backslashes and hyphens escaped, and a
    leading ``.`` or ``'`` (a request to roff) neutralised with ``\\&``."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def _quoted(text: str) -> str:
    """A macro argument: escaped, in double quotes (a quote inside becomes ``\\(dq``)."""
    return '"' + roff_escape(text).replace('"', "\\(dq") + '"'


def _paragraphs(help_text: str | None) -> list[str]:
    """Help text as paragraphs of single-spaced words (click's ``\\b`` markers dropped)."""
    if not help_text:
        return []
    blocks = re.split(r"\n\s*\n", help_text.replace("\b", "").strip())
    return [" ".join(block.split()) for block in blocks if block.strip()]


def _text_lines(help_text: str | None) -> list[str]:
    """Paragraphs as roff: one escaped text line each, ``.PP`` between them."""
    out: list[str] = []
    for index, paragraph in enumerate(_paragraphs(help_text)):
        if index:
            out.append(".PP")
        out.append(roff_escape(paragraph))
    return out


def _metavar(param: Any, ctx: typer.Context) -> str:
    if getattr(param, "metavar", None):
        return str(param.metavar)
    if param.param_type_name == "argument":
        return str(param.name).upper()
    if getattr(param, "is_flag", False):
        return ""
    shown = param.display_type(ctx).strip("<>") if hasattr(param, "display_type") else "str"
    inner = re.fullmatch(r"list\[(\w+)\]", shown)
    name = (inner.group(1) if inner else shown).lower()
    return _TYPE_METAVARS.get(name, name.upper())


def _option_heading(param: Any, ctx: typer.Context) -> str:
    """``\\fB\\-H\\fR, \\fB\\-\\-hosts\\fR \\fITEXT\\fR`` for a .TP heading line."""
    names = sorted(param.opts, key=lambda o: (o.startswith("--"), o))
    names += list(param.secondary_opts)
    heading = ", ".join(f"\\fB{roff_escape(name)}\\fR" for name in names)
    metavar = _metavar(param, ctx)
    return heading + (f" \\fI{roff_escape(metavar)}\\fR" if metavar else "")


def _option_notes(param: Any) -> list[str]:
    notes: list[str] = []
    if param.multiple:
        notes.append("May be given more than once.")
    if param.required:
        notes.append("Required.")
    default = param.default
    shows_default = not (getattr(param, "is_flag", False) and default in (False, None))
    if default is not None and shows_default and param.name != "help":
        value = default if not isinstance(default, bool) else str(default).lower()
        notes.append(f"Default: {value}.")
    return notes


def _env_names(param: Any) -> list[str]:
    envvar = param.envvar
    if not envvar:
        return []
    return [envvar] if isinstance(envvar, str) else list(envvar)


def _env_note(param: Any) -> str:
    """`` Environment: \\fB\\%DTLAUNCH_X\\fR.`` (``\\%``: never hyphenate a name)."""
    names = [f"\\fB\\%{roff_escape(n)}\\fR" for n in _env_names(param)]
    return " Environment: " + ", ".join(names) + "." if names else ""


def _synopsis(path: list[str], command: Any, ctx: typer.Context) -> list[str]:
    words = ["[OPTIONS]"] if any(p.param_type_name != "argument" for p in command.params) else []
    for param in command.params:
        if param.param_type_name != "argument":
            continue
        word = _metavar(param, ctx)
        word = word if param.required else f"[{word}]"
        words.append(word + ("..." if param.nargs != 1 else ""))
    if _subcommands(command):
        words.append("COMMAND [ARGS]...")
    return [f".B {' '.join(roff_escape(p) for p in path)}", roff_escape(" ".join(words))]


def _page_name(path: list[str]) -> str:
    return "-".join(path)


def _subcommands(command: Any) -> list[tuple[str, Any]]:
    commands: dict[str, Any] = getattr(command, "commands", {}) or {}
    return [(name, sub) for name, sub in sorted(commands.items()) if not sub.hidden]


def _first_sentence(help_text: str | None) -> str:
    paragraphs = _paragraphs(help_text)
    if not paragraphs:
        return ""
    sentence = paragraphs[0]
    return sentence[:-1] if sentence.endswith(".") else sentence


def _render(path: list[str], command: Any, ctx: typer.Context, see_also: list[str]) -> str:
    name = _page_name(path)
    lines = [
        '.\\" Generated by "python -m dtlaunch.cli.manpages" from dtlaunch.cli; do not edit.',
        f'.TH {_quoted(name.upper())} 1 "" {_quoted("dtlaunch " + __version__)} {_quoted(MANUAL)}',
        ".SH NAME",
        f"{roff_escape(name)} \\- {roff_escape(_first_sentence(command.help))}",
        ".SH SYNOPSIS",
        *_synopsis(path, command, ctx),
        ".SH DESCRIPTION",
        *(_text_lines(command.help) or [roff_escape(name)]),
    ]
    subs = _subcommands(command)
    if subs:
        lines.append(".SH COMMANDS")
        for sub_name, sub in subs:
            page = _page_name([*path, sub_name])
            lines += [".TP", f"\\fB{roff_escape(sub_name)}\\fR"]
            lines.append(roff_escape(_first_sentence(sub.help)) + ".")
            lines.append(f"See \\fB{roff_escape(page)}\\fR(1).")
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name != "argument"]
    if arguments:
        lines.append(".SH ARGUMENTS")
        for param in arguments:
            lines += [".TP", f"\\fI{roff_escape(_metavar(param, ctx))}\\fR"]
            lines += _text_lines(param.help) or [roff_escape(str(param.name))]
    if options:
        lines.append(".SH OPTIONS")
        for param in options:
            lines += [".TP", _option_heading(param, ctx)]
            body = " ".join([*_paragraphs(param.help), *_option_notes(param)])
            lines.append(roff_escape(body) + _env_note(param))
    with_env = [p for p in options if _env_names(p)]
    if len(path) == 1:
        lines += [".SH ENVIRONMENT", roff_escape(ENV_CONVENTION)]
    elif with_env:
        lines.append(".SH ENVIRONMENT")
        for param in with_env:
            for env_name in _env_names(param):
                lines += [".TP", f"\\fB{roff_escape(env_name)}\\fR"]
                option = max(param.opts, key=len)
                lines.append(f"Sets \\fB{roff_escape(option)}\\fR.")
    lines.append(".SH SEE ALSO")
    lines.append(",\n".join(_see_also_ref(ref) for ref in see_also))
    return "\n".join(lines) + "\n"


def _see_also_ref(ref: str) -> str:
    page, section = ref.rstrip(")").split("(")
    return f".BR {roff_escape(page)} ({section})"


def _uses_hostfile(command: Any) -> bool:
    return any(_HOSTFILE_OPTION in getattr(p, "opts", ()) for p in command.params)


def generate(app: typer.Typer, *, prog: str = "dtlaunch") -> list[ManPage]:
    """Every page of ``app``: the program itself, then each (nested) sub-command."""
    root = typer.main.get_command(app)
    found: list[tuple[list[str], Any, typer.Context]] = []

    def walk(path: list[str], command: Any, parent: typer.Context | None) -> None:
        ctx = typer.Context(command, info_name=path[-1], parent=parent)
        found.append((path, command, ctx))
        for sub_name, sub in _subcommands(command):
            walk([*path, sub_name], sub, ctx)

    walk([prog], root, None)
    names = [_page_name(path) for path, _, _ in found]
    pages = []
    for path, command, ctx in found:
        name = _page_name(path)
        if len(path) == 1:
            refs = [f"{n}(1)" for n in names[1:]]
            refs += HAND_WRITTEN_SEE_ALSO
        else:
            refs = [f"{_page_name(path[:-1])}(1)"]
            refs += [f"{n}(1)" for n in names if n.startswith(name + "-")]
            if _uses_hostfile(command):
                refs += HAND_WRITTEN_SEE_ALSO
        pages.append(ManPage(filename=f"{name}.1", text=_render(path, command, ctx, refs)))
    return pages


def write_pages(out_dir: Path, app: typer.Typer) -> list[Path]:
    """Write the pages of ``app`` into ``out_dir`` (created if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for page in generate(app):
        path = out_dir / page.filename
        path.write_text(page.text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m dtlaunch.cli.manpages OUT_DIR   (e.g. man)", file=sys.stderr)
        return 2
    from dtlaunch.cli import app

    for path in write_pages(Path(args[0]), app):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
