"""The root-cause table printed when a job fails, and the end-of-job line."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from dtlaunch.supervisor.jobstate.failures import signal_name


def _exit_text(failure: dict[str, Any]) -> str:
    if failure.get("signal"):
        return signal_name(int(failure["signal"]))
    if failure.get("exit_code") is not None:
        return f"exit {failure['exit_code']}"
    return str(failure.get("reason", "?"))


def failures_table(summary: dict[str, Any]) -> Table:
    """One row per failure. A failed job marks its root cause (the first failure);
    a job that succeeded lists the failures it recovered from."""
    failed = summary["status"] != "succeeded"
    count = len(summary["failures"])
    title = (
        f"dtlaunch: job {summary['run_id']} {summary['status']}; root cause first"
        if failed
        else f"dtlaunch: job {summary['run_id']} recovered from {count} failure(s)"
    )
    table = Table(title=title, expand=False)
    for column in ("", "host", "process", "exit", "time", "retry", "error"):
        table.add_column(column, overflow="fold")
    for failure in summary["failures"]:
        lines = failure.get("traceback") or [failure.get("error", "")]
        rank = failure["rank"]
        process = failure["role"] + (str(rank) if rank >= 0 else "")
        table.add_row(
            "root cause" if failed and failure.get("root_cause") else "",
            failure["host"],
            process,
            _exit_text(failure),
            f"{failure['at_s']:.1f}s",
            "yes" if failure.get("retryable") else "no",
            Text("\n".join(lines[-4:])),
        )
    return table


def outcome_line(summary: dict[str, Any], run_dir: str) -> str:
    restarts = len(summary["restarts"])
    return (
        f"dtlaunch: job {summary['run_id']} {summary['status']} in {summary['jct_s']:.1f}s "
        f"({summary['workers']} workers, {restarts} restarts). "
        f"Run dir: {run_dir}  Summary: {run_dir}/summary.json"
    )
