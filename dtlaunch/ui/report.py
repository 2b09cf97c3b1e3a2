"""The root-cause table printed when a job fails, and the end-of-job line."""

from __future__ import annotations

from typing import Any

from dtlaunch.supervisor.jobstate.failures import signal_name
from dtlaunch.ui.fit import FitTable


def _exit_text(failure: dict[str, Any]) -> str:
    if failure.get("signal"):
        return signal_name(int(failure["signal"]))
    if failure.get("exit_code") is not None:
        return f"exit {failure['exit_code']}"
    return str(failure.get("reason", "?"))


def _error_text(failure: dict[str, Any]) -> str:
    """The exception line first, then where it was raised (the innermost frame)."""
    error = str(failure.get("error") or failure.get("reason") or "")
    frames = [ln.strip() for ln in failure.get("traceback") or [] if ln.strip().startswith("File ")]
    return error + (f"\n{frames[-1]}" if frames else "")


def _folded(failures: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int, float]]:
    """Consecutive failures of one process with the same error, as one row:
    (the first of them, how many, the time of the last)."""
    rows: list[tuple[dict[str, Any], int, float]] = []
    for failure in failures:
        key = (failure["role"], failure["rank"], failure["host"], failure.get("error"))
        if rows:
            first, count, _ = rows[-1]
            if (first["role"], first["rank"], first["host"], first.get("error")) == key:
                rows[-1] = (first, count + 1, failure["at_s"])
                continue
        rows.append((failure, 1, failure["at_s"]))
    return rows


def failures_table(summary: dict[str, Any]) -> FitTable:
    """One row per failure, identical ones of a process folded (``x3``). A failed
    job marks its root cause (the first failure); a job that succeeded lists the
    failures it recovered from. In a narrow terminal each failure is an entry
    with its error below it (see :class:`FitTable`)."""
    failed = summary["status"] != "succeeded"
    count = len(summary["failures"])
    title = (
        f"dtlaunch: job {summary['run_id']} {summary['status']}; root cause first"
        if failed
        else f"dtlaunch: job {summary['run_id']} recovered from {count} failure(s)"
    )
    table = FitTable(
        title=title, columns=("", "host", "process", "exit", "time", "retry"), long_header="error"
    )
    for failure, count, last_at in _folded(summary["failures"]):
        rank = failure["rank"]
        process = failure["role"] + (str(rank) if rank >= 0 else "")
        when = f"{failure['at_s']:.1f}s" + (f"-{last_at:.1f}s" if count > 1 else "")
        table.add_row(
            "root cause" if failed and failure.get("root_cause") else "",
            failure["host"],
            process + (f" x{count}" if count > 1 else ""),
            _exit_text(failure),
            when,
            "yes" if failure.get("retryable") else "no",
            long=_error_text(failure),
        )
    return table


def outcome_line(summary: dict[str, Any], run_dir: str) -> str:
    restarts = len(summary["restarts"])
    return (
        f"dtlaunch: job {summary['run_id']} {summary['status']} in {summary['jct_s']:.1f}s "
        f"({summary['workers']} workers, {restarts} restarts). "
        f"Run dir: {run_dir}  Summary: {run_dir}/summary.json"
    )
