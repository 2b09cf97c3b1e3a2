"""What the parts of ``JobState`` share: its fields, and (for the type checker
only) the core methods the parts call. ``JobState`` (jobstate.py) combines the
parts: agents (jobstate_agents.py), KILL_RESTART and hand-overs
(jobstate_replace.py), and where processes listen (jobstate_endpoints.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dtlaunch.supervisor.jobstate.failures import ExitVerdict
from dtlaunch.supervisor.jobstate.nodes import (
    AgentSlot,
    Command,
    EmitEvent,
    FailureRecord,
    Phase,
    ProcSlot,
    RestartRecord,
    SendToAgent,
    Timing,
)
from dtlaunch.wire.messages import Kill

__all__ = ["JobStateBase"]


class JobStateBase:
    """Fields of the node table (set by ``JobState.__init__``)."""

    timing: Timing
    max_restarts: int
    restart_scope: str
    builtin_ps: bool
    procs: dict[str, ProcSlot]
    agents: dict[str, AgentSlot]
    spare_hosts: list[str]
    retiring: dict[str, tuple[str, int]]
    ps_port_index: dict[tuple[str, int], int]
    handed_over: set[str]
    phase: Phase
    status: str
    stop_reason: str
    stop_deadline: float
    failures: list[FailureRecord]
    restarts: list[RestartRecord]
    started_at: float
    _master_addr_of: Callable[[str, str], str]

    if TYPE_CHECKING:  # defined by JobState; declared here so the parts type-check

        def _gone(self, slot: ProcSlot) -> list[Command]: ...

        def _on_failure(
            self,
            slot: ProcSlot,
            verdict: ExitVerdict,
            exit_code: int | None,
            signal: int | None,
            stderr_tail: list[str],
            now: float,
            *,
            dead_host: str = "",
        ) -> list[Command]: ...

        def _restart(self, slot: ProcSlot, reason: str, now: float) -> EmitEvent: ...

        def _kill_message(self, slot: ProcSlot) -> Kill: ...

        def _reconcile(self, now: float) -> list[Command]: ...

        def _add_failure(
            self,
            role: str,
            rank: int,
            host: str,
            attempt: int,
            verdict: ExitVerdict,
            exit_code: int | None,
            signal: int | None,
            stderr_tail: list[str],
            now: float,
        ) -> None: ...

        def _fail_job(self, reason: str, now: float) -> list[Command]: ...

        def _shutdown_message(self, host: str) -> SendToAgent: ...

        def _maybe_finish(self, now: float) -> list[Command]: ...

        def _finish(self) -> list[Command]: ...

        def _proc_event(self, kind: str, slot: ProcSlot, **data: Any) -> EmitEvent: ...
