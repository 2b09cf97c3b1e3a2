"""The root-cause table (issue 12, defect 8): the exception line first, where it
was raised next, no caret lines, identical failures of a process folded."""

from __future__ import annotations

from rich.console import Console

from dtlaunch.ui.report import failures_table

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 12, in <module>',
    '    token = os.environ["API_TOKEN"]',
    "            ~~~~~~~~~~^^^^^^^^^^^^^",
    "KeyError: 'API_TOKEN'",
]


def failure(at_s: float, **kw):
    base = {
        "role": "worker",
        "rank": 1,
        "host": "h1",
        "exit_code": 1,
        "signal": None,
        "error": "KeyError: 'API_TOKEN'",
        "reason": "KeyError",
        "retryable": True,
        "attempt": 0,
        "at_s": at_s,
        "traceback": TRACEBACK,
        "root_cause": False,
    }
    return base | kw


def render(summary) -> str:
    console = Console(width=100, record=True)
    console.print(failures_table(summary))
    return console.export_text()


def test_the_error_column_shows_the_exception_line_and_folds_identical_rows():
    summary = {
        "run_id": "r",
        "status": "failed",
        "failures": [failure(1.0, root_cause=True), failure(2.5), failure(4.0)],
    }
    text = render(summary)
    assert "KeyError: 'API_TOKEN'" in text
    assert "line 12" in text and "^^^" not in text and "~~~" not in text
    assert "worker1 x3" in text and "1.0s-4.0s" in text
    assert text.count("KeyError: 'API_TOKEN'") == 1


def test_different_errors_stay_apart():
    summary = {
        "run_id": "r",
        "status": "succeeded",
        "failures": [failure(1.0), failure(2.0, error="ValueError: bad", reason="ValueError")],
    }
    text = render(summary)
    assert "x2" not in text and "ValueError: bad" in text


def test_at_80_columns_each_failure_is_an_entry_with_its_error_at_full_width():
    long_error = (
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/data/train/shards/part-00017-of-00128.tfrecord.gz'"
    )
    summary = {
        "run_id": "r",
        "status": "failed",
        "failures": [failure(1.0, root_cause=True, error=long_error), failure(2.0)],
    }
    console = Console(width=80, record=True)
    console.print(failures_table(summary))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert all(len(line) <= 80 for line in lines), lines
    assert "┃" not in "".join(lines)  # not a table squeezed to 80 columns
    assert lines[1] == "root cause: host h1, process worker1, exit 1, time 1.0s, retry yes"
    assert lines[2].startswith("  FileNotFoundError: [Errno 2] No such file or directory:")
    assert lines[4] == '  File "/job/train.py", line 12, in <module>'
    assert lines[5] == "host h1, process worker1, exit 1, time 2.0s, retry yes"  # no marker
    assert lines[6] == "  KeyError: 'API_TOKEN'"
    wide = Console(width=200, record=True)
    wide.print(failures_table(summary))
    text = wide.export_text()  # export_text clears the record
    assert "┃" in text and long_error in text
