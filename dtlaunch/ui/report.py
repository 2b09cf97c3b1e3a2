"""The root-cause table printed when a job fails, and the end-of-job line."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from dtlaunch.supervisor.failures import signal_name


def _exit_text(failure: dict[str, Any]) -> str:
    if failure.get("signal"):
        return signal_name(int(failure["signal"]))
    if failure.get("exit_code") is not None:
        return f"exit {failure['exit_code']}"
    return str(failure.get("reason", "?"))


def failures_table(summary: dict[str, Any]) -> Table:
    """One row per failure, the first (root cause) marked; newest traceback lines last."""
    table = Table(title=f"dtlaunch: job {summary['run_id']} {summary['status']}", expand=False)
    for column in ("", "host", "role", "rank", "exit", "time", "retryable", "error"):
        table.add_column(column, overflow="fold")
    for failure in summary["failures"]:
        lines = failure.get("traceback") or [failure.get("error", "")]
        error = Text("\n".join(lines[-4:]))
        table.add_row(
            "root cause" if failure.get("root_cause") else "",
            failure["host"],
            failure["role"],
            str(failure["rank"]),
            _exit_text(failure),
            f"{failure['at_s']:.1f}s",
            "yes" if failure.get("retryable") else "no",
            error,
        )
    return table


def outcome_line(summary: dict[str, Any], run_dir: str) -> str:
    restarts = len(summary["restarts"])
    return (
        f"dtlaunch: job {summary['run_id']} {summary['status']} in {summary['jct_s']:.1f}s "
        f"({summary['workers']} workers, {restarts} restarts). "
        f"Run dir: {run_dir}  Summary: {run_dir}/summary.json"
    )
