"""``python -m build``'s wheel: what ``pip install`` of it gives a user.

The `wheel_venv` fixture (tests/wheel_venv.py) builds the sdist and, from it, the wheel,
and installs the wheel into a fresh venv; tests/test_no_torch.py runs jobs with it.
Here: the entry point and its version, and the man pages under ``<venv>/share/man``,
found and shown by ``man`` as a user would call it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import typer.main

from tests.jobs import REPO
from tests.wheel_venv import WheelVenv, clean_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # the first builds the venv

MAN_PAGES = sorted((REPO / "man").glob("*.[1-9]"))  # as committed


def _version_py() -> str:
    """The version as dtlaunch/version.py states it (read, not imported)."""
    text = (REPO / "dtlaunch" / "version.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"$', text, flags=re.M)
    return version


def _commands() -> dict[str, Any]:
    """The app's commands, by name, as click sees them."""
    from dtlaunch.cli import app

    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _long_options(command: Any) -> list[str]:
    """The long options a command's man page documents (hidden ones have no entry)."""
    return [
        opt
        for param in command.params
        if param.param_type_name == "option" and not getattr(param, "hidden", False)
        for opt in [*param.opts, *param.secondary_opts]
        if opt.startswith("--")
    ]


def test_build_makes_the_wheel_and_sdist_of_this_version(wheel_venv: WheelVenv) -> None:
    version = _version_py()
    assert wheel_venv.wheel.name == f"dtlaunch-{version}-py3-none-any.whl"
    assert wheel_venv.sdist.name == f"dtlaunch-{version}.tar.gz"
    committed = {p.name for p in MAN_PAGES}
    with tarfile.open(wheel_venv.sdist) as sdist:
        in_sdist = {Path(n).name for n in sdist.getnames() if Path(n).parent.name == "man"}
    assert in_sdist == committed  # a wheel built from the sdist gets its man pages too
    with zipfile.ZipFile(wheel_venv.wheel) as wheel:
        data = f"dtlaunch-{version}.data/data/share/man/"
        in_wheel = {Path(n).name for n in wheel.namelist() if n.startswith(data)}
    assert in_wheel == committed


def test_the_installed_dtlaunch_prints_the_version(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(wheel_venv.dtlaunch), "--version"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"dtlaunch {_version_py()}"
    where = subprocess.run(
        [str(wheel_venv.python), "-c", "import dtlaunch; print(dtlaunch.__file__)"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(wheel_venv.site_packages))


def test_the_wheel_installs_a_man_page_per_command(wheel_venv: WheelVenv) -> None:
    from dtlaunch.cli import app
    from dtlaunch.cli.manpages import generate

    man1 = wheel_venv.man / "man1"
    assert (man1 / "dtlaunch.1").is_file()
    assert {p.name for p in man1.iterdir()} == {page.filename for page in generate(app)}
    assert [p.name for p in (wheel_venv.man / "man5").iterdir()] == ["dtlaunch-hostfile.5"]
    for page in MAN_PAGES:  # tests/test_manpages.py holds them to the app
        installed = wheel_venv.man / f"man{page.suffix[1:]}" / page.name
        assert installed.read_bytes() == page.read_bytes(), page.name


# ------------------------------------------------------------------ the pages, shown


def _plain(text: str) -> str:
    """Rendered man output as plain ASCII: no overstrikes, no typographic hyphens."""
    text = re.sub(".\b", "", text)
    return text.replace("\u2010", "-").replace("\u2212", "-")


def _roff_text(roff: str) -> str:
    """A minimal man(7) renderer for the requests and escapes dtlaunch's pages use: section
    headings flush left, everything else indented, as ``man`` lays a page out."""
    lines = []
    for line in roff.splitlines():
        if line.startswith(".SH "):
            lines.append(line[4:].strip('"'))
        elif line.startswith(".BR "):
            lines.append("       " + line[4:].replace(" ", ""))
        elif not line.startswith("."):
            lines.append("       " + line)
    text = "\n".join(lines)
    for escape, plain in (("\\fB", ""), ("\\fI", ""), ("\\fR", ""), ("\\fP", ""),
                          ("\\-", "-"), ("\\%", ""), ("\\&", ""), ("\\(aq", "'"),
                          ("\\e", "\\")):  # fmt: skip
        text = text.replace(escape, plain)
    return text


def _section(text: str, heading: str) -> str:
    """One section of a rendered page, its lines joined with single spaces."""
    lines = text.splitlines()
    assert heading in lines, text
    body = []
    for line in lines[lines.index(heading) + 1 :]:
        if line and not line[0].isspace():
            break
        body.append(line)
    return " ".join(" ".join(body).split())


def _man_env(**extra: str) -> dict[str, str]:
    """For ``man``: no pager, wide lines, ASCII, and no MANPATH unless ``extra`` sets one."""
    env = clean_env(MANPAGER="cat", PAGER="cat", MANWIDTH="200", LC_ALL="C")
    env.pop("MANPATH", None)
    env.update(extra)
    return env


def _man(args: list[str], env: dict[str, str]) -> str:
    result = subprocess.run(
        ["man", "-P", "cat", *args], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return _plain(result.stdout)


def _renderings(page: Path) -> dict[str, str]:
    """The page as text: always by the minimal renderer, and by ``man`` and ``groff``
    where they are installed."""
    shown = {"roff": _roff_text(page.read_text())}
    if shutil.which("man"):
        shown["man"] = _man(["-l", str(page)], _man_env())
    if shutil.which("groff"):
        result = subprocess.run(
            ["groff", "-man", "-Tascii", "-rLL=200n", "-P-c", str(page)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        shown["groff"] = _plain(result.stdout)
    return shown


def test_the_run_page_shows_every_run_option(wheel_venv: WheelVenv) -> None:
    page = wheel_venv.man / "man1" / "dtlaunch-run.1"
    th = next(line for line in page.read_text().splitlines() if line.startswith(".TH "))
    assert th.startswith('.TH "DTLAUNCH\\-RUN" 1 '), th
    assert f'"dtlaunch {_version_py()}"' in th, th
    run = _commands()["run"]
    options = _long_options(run)
    assert "--workers" in options and "--hosts" in options
    help_text = " ".join(run.help.split())
    for renderer, text in _renderings(page).items():
        name = _section(text, "NAME")
        assert name.startswith("dtlaunch-run - "), (renderer, name)
        assert help_text.startswith(name.removeprefix("dtlaunch-run - ").rstrip(".")), renderer
        shown = _section(text, "OPTIONS")
        missing = [o for o in options if not re.search(rf"(?<![\w-]){o}(?![\w-])", shown)]
        assert not missing, (renderer, missing)


def test_man_finds_the_pages_as_installed(wheel_venv: WheelVenv) -> None:
    if not shutil.which("man"):
        pytest.skip("man is not installed: the pages are checked by groff or as roff only")
    manpath = str(wheel_venv.man)
    # With the venv's share/man on MANPATH.
    text = _man(["dtlaunch-run"], _man_env(MANPATH=manpath))
    assert _section(text, "NAME").startswith("dtlaunch-run - ")
    assert "--workers" in _section(text, "OPTIONS")
    # Named with -M; the program's page lists every command.
    text = _man(["-M", manpath, "dtlaunch"], _man_env())
    commands = _section(text, "COMMANDS")
    for command in _commands():
        assert f"dtlaunch-{command}(1)" in commands, command
    # In an activated venv: man-db looks in share/man beside each bin/ on PATH.
    bin_first = f"{wheel_venv.root / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    text = _man(["5", "dtlaunch-hostfile"], _man_env(PATH=bin_first))
    assert _section(text, "NAME").startswith("dtlaunch-hostfile - ")
