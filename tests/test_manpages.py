"""The man pages: generated ones match the command line, and every page renders cleanly."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from dtlaunch import __version__
from dtlaunch.cli import app
from dtlaunch.cli.manpages import generate, roff_escape, write_pages
from dtlaunch.errors import HostfileError
from dtlaunch.hostfile import parse_hostfile, parse_inline

REPO = Path(__file__).resolve().parent.parent
MAN = REPO / "man"
REGENERATE = "run `python -m dtlaunch.cli.manpages man` and commit the pages"
PAGES = sorted(MAN.glob("*.[1-9]"))


def test_committed_pages_match_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dtlaunch.cli.manpages", str(tmp_path)],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    fresh = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in MAN.glob("*.1")}
    missing = sorted(set(fresh) - set(committed))
    stale = sorted(set(committed) - set(fresh))
    assert not missing, f"man/ lacks {missing}; {REGENERATE}"
    assert not stale, f"man/ has pages of no command {stale}; delete them and {REGENERATE}"
    changed = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not changed, f"man/{changed} differ from the command line; {REGENERATE}"


def test_pages_cover_every_command_and_option() -> None:
    pages = {page.filename: page.text for page in generate(app)}
    expected = {"dtlaunch.1", "dtlaunch-run.1", "dtlaunch-check.1", "dtlaunch-stop.1",
                "dtlaunch-replay.1", "dtlaunch-logs.1", "dtlaunch-wal.1",
                "dtlaunch-wal-repair.1"}  # fmt: skip
    assert expected <= set(pages)

    def walk(path: list[str], command) -> None:
        text = pages[f"{'-'.join(path)}.1"]
        for param in command.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("-"):
                    assert f"\\fB{roff_escape(opt)}\\fR" in text, (path, opt)
            if param.envvar:
                assert f"\\fB\\%{param.envvar}\\fR" in text, (path, param.envvar)
        for name, sub in getattr(command, "commands", {}).items():
            assert f"\\fB{name}\\fR" in text
            walk([*path, name], sub)

    walk(["dtlaunch"], typer.main.get_command(app))
    run_page = pages["dtlaunch-run.1"]
    assert "Default: 3." in run_page  # --max-restarts
    assert ".BR dtlaunch\\-hostfile (5)" in run_page
    assert '.TH "DTLAUNCH\\-RUN" 1 "" "dtlaunch ' + __version__ + '"' in run_page
    assert "[OPTIONS] [SCRIPT] [SCRIPT_ARGS]..." in run_page
    assert "[OPTIONS] RUN_DIR" in pages["dtlaunch-replay.1"]
    assert "[OPTIONS] RUN_DIR [ROLE] [RANK]" in pages["dtlaunch-logs.1"]


def test_output_is_deterministic(tmp_path: Path) -> None:
    write_pages(tmp_path / "a", app)
    write_pages(tmp_path / "b", app)
    for page in (tmp_path / "a").iterdir():
        assert page.read_bytes() == (tmp_path / "b" / page.name).read_bytes()


def test_roff_escape_neutralises_requests_and_escapes() -> None:
    assert roff_escape(".TH evil") == "\\&.TH evil"
    assert roff_escape("'br") == "\\&'br"
    assert roff_escape("a\\b -x") == "a\\eb \\-x"
    assert roff_escape("x .y") == "x .y"  # only a leading dot is a request


def test_module_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dtlaunch.cli.manpages"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "usage: python -m dtlaunch.cli.manpages OUT_DIR" in result.stderr


def _hostfile_page() -> str:
    return (MAN / "dtlaunch-hostfile.5").read_text()


def _nf_blocks(section: str) -> list[str]:
    """The .nf ... .fi blocks of one .SH section, with roff escapes undone."""
    text = _hostfile_page().split(f".SH {section}\n", 1)[1].split("\n.SH ", 1)[0]
    blocks = re.findall(r"\.nf\n(.*?)\n\.fi", text, flags=re.S)
    return [b.replace("\\-", "-").replace("\\(aq", "'").replace("\\fI", "").replace("\\fR", "")
            for b in blocks]  # fmt: skip


def test_hostfile_page_examples_are_what_the_parser_accepts_and_says() -> None:
    assert f'"dtlaunch {__version__}"' in _hostfile_page().splitlines()[1]
    (example,) = _nf_blocks("EXAMPLES")
    hosts = parse_hostfile(example, "example")
    assert [h.label for h in hosts] == ["node1", "node2:2222", "node3", "node4", "[fd00::7]:2222"]
    assert hosts[1].user == "deploy" and hosts[1].servers == 1
    assert hosts[2].spare and hosts[3].device_class == "v100" and hosts[3].gpus == 2
    assert hosts[3].max_batch == 96
    (inline,) = _nf_blocks("INLINE FORM")
    assert [h.slots for h in parse_inline(inline.split()[3])] == [4, 2, 8]
    # The ERRORS section quotes real messages of the parser (long ones shortened).
    bad = "node1 slot=4\nnode1\nnode2\nnode3\nfd00::1\n"
    with pytest.raises(HostfileError) as caught:
        parse_hostfile(bad, "hosts.txt")
    real = str(caught.value)
    for line in _nf_blocks("ERRORS")[1].splitlines():
        assert line.removesuffix(" (...)") in real, line


def _render_problems(page: Path) -> str:
    """Warnings of every renderer present; '' when the page is clean."""
    problems = []
    env = dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="80", LC_ALL="C.UTF-8")
    if shutil.which("man"):
        result = subprocess.run(
            ["man", "--warnings", "-E", "UTF-8", "-l", str(page)],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        problems.append(result.stderr.strip())
        assert result.returncode == 0, result.stderr
        assert "NAME" in result.stdout and "SEE ALSO" in result.stdout
    if shutil.which("groff"):
        result = subprocess.run(
            ["groff", "-man", "-ww", "-z", str(page)], capture_output=True, text=True, check=False
        )
        problems.append(result.stderr.strip())
    if shutil.which("mandoc"):
        result = subprocess.run(
            ["mandoc", "-Tlint", "-Wwarning", str(page)], capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        problems.append(result.stdout.strip() + result.stderr.strip())
    return "\n".join(p for p in problems if p)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_renders_without_warnings(page: Path) -> None:
    if not (shutil.which("man") or shutil.which("groff") or shutil.which("mandoc")):
        pytest.skip("no man, groff or mandoc installed to render the pages with")
    assert _render_problems(page) == ""
