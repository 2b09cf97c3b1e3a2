"""Exit classification (AntDT §V-D): retryable vs unretryable, pure function."""

from __future__ import annotations

import signal

import pytest

from dtlaunch.supervisor.jobstate.failures import EARLY_EXIT_S, classify_exit, last_exception_line

TRACE = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>']


@pytest.mark.parametrize(
    ("kwargs", "retryable", "reason"),
    [
        ({"exit_code": None, "signal": signal.SIGKILL}, True, "killed by SIGKILL"),
        ({"exit_code": None, "signal": signal.SIGSEGV}, True, "killed by SIGSEGV"),
        ({"exit_code": 137, "signal": None}, True, "killed by SIGKILL"),
        ({"exit_code": None, "signal": signal.SIGKILL, "oom_killed": True}, True, "oom-kill"),
        (
            {"exit_code": 1, "stderr_tail": [*TRACE, "RuntimeError: NCCL timeout"]},
            True,
            "RuntimeError",
        ),
        (
            {"exit_code": 1, "stderr_tail": [*TRACE, "SyntaxError: invalid syntax"]},
            False,
            "SyntaxError",
        ),
        (
            {"exit_code": 1, "stderr_tail": [*TRACE, "ImportError: cannot import name 'x'"]},
            False,
            "ImportError",
        ),
        (
            {"exit_code": 1, "stderr_tail": [*TRACE, "ModuleNotFoundError: No module named 'y'"]},
            False,
            "ModuleNotFoundError",
        ),
        (
            {
                "exit_code": 2,
                "stderr_tail": ["usage: t.py [-h]", "t.py: error: unrecognized arguments: --x"],
            },
            False,
            "bad arguments",
        ),
        (
            {
                "exit_code": 2,
                "stderr_tail": ["python: can't open file '/x.py': [Errno 2] No such file"],
            },
            False,
            "script not found",
        ),
        ({"exit_code": 3, "stderr_tail": ["some log line"]}, True, "exit code 3"),
    ],
)
def test_classification(kwargs, retryable, reason):
    kwargs = {"exit_code": None, "signal": None, "runtime_s": 1.0, "stderr_tail": [], **kwargs}
    verdict = classify_exit(**kwargs)
    assert not verdict.succeeded
    assert verdict.retryable is retryable
    assert verdict.reason == reason


def test_success():
    verdict = classify_exit(exit_code=0, signal=None, runtime_s=5.0, stderr_tail=["warning"])
    assert verdict.succeeded


def test_an_import_error_late_in_training_is_retryable():
    tail = [*TRACE, "ImportError: lazily imported plugin vanished"]
    verdict = classify_exit(exit_code=1, signal=None, runtime_s=EARLY_EXIT_S + 1, stderr_tail=tail)
    assert verdict.retryable


def test_last_exception_line_finds_chained_and_qualified_names():
    tail = [*TRACE, "torch.distributed.DistBackendError: boom", "", "  during handling"]
    assert last_exception_line(tail) == "torch.distributed.DistBackendError: boom"


def test_python_m_of_a_missing_module_is_unretryable():
    """``python -m no_such_module`` prints one line, no traceback (defect 8)."""
    verdict = classify_exit(
        exit_code=1,
        signal=None,
        runtime_s=0.2,
        stderr_tail=["/usr/bin/python3: No module named no_such_module"],
    )
    assert (verdict.retryable, verdict.reason) == (False, "module not found")
    assert verdict.error.endswith("No module named no_such_module")


def test_failure_signature_is_the_exception_and_the_innermost_frame():
    from dtlaunch.supervisor.jobstate.failures import failure_signature, traceback_tail

    tail = [
        "Traceback (most recent call last):",
        '  File "/job/train.py", line 30, in <module>',
        "    main()",
        '  File "/job/train.py", line 12, in main',
        '    token = os.environ["API_TOKEN"]',
        "            ~~~~~~~~~~^^^^^^^^^^^^^",
        "KeyError: 'API_TOKEN'",
    ]
    assert failure_signature(tail) == "KeyError at /job/train.py:12"
    assert failure_signature(["killed"]) == ""
    # The innermost frame of the user's code, not of the library it called.
    in_os = [*tail[:5], '  File "<frozen os>", line 679, in __getitem__', tail[-1]]
    assert failure_signature(in_os) == "KeyError at /job/train.py:12"
    assert not any(set(ln.strip()) <= set("^~") for ln in traceback_tail(tail))
