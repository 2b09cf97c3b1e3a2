"""The line an agent's launch failure quotes from its log: the exception a
person looks for, not whatever was written after it."""

from __future__ import annotations

from pathlib import Path

from dtlaunch.supervisor.agents import _last_line


def test_the_exception_line_is_quoted_even_when_lines_follow_it(tmp_path: Path) -> None:
    log = tmp_path / "agent-h.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "<string>", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'dtlaunch.agent'\n"
        "\n"
        "sh: line 1: warning: the session ended\n"
    )
    assert _last_line(log) == "ModuleNotFoundError: No module named 'dtlaunch.agent'"


def test_without_a_traceback_the_last_line_is_quoted_and_cut(tmp_path: Path) -> None:
    log = tmp_path / "agent-h.log"
    log.write_text("starting\n" + "x" * 1000 + "\n\n")
    last = _last_line(log)
    assert len(last) == 300 and last.endswith("...") and last.startswith("xxx")
    assert _last_line(tmp_path / "missing.log") == ""
    (tmp_path / "empty.log").write_text("\n\n")
    assert _last_line(tmp_path / "empty.log") == ""
