"""``summary.json`` of a finished job, built from the job's state."""

from __future__ import annotations

from typing import Any

from dtlaunch.config import JobSpec
from dtlaunch.supervisor.jobstate.machine import JobState


def build_summary(spec: JobSpec, state: JobState, *, jct_s: float, reason: str) -> dict[str, Any]:
    """The DESIGN.md summary fields; DDS counters stay 0 until a job uses the DDS."""
    first = state.first_failure()
    return {
        "run_id": spec.run_id,
        "status": state.status or "failed",
        "reason": reason,
        "jct_s": round(jct_s, 3),
        "policy": spec.policy,
        "mode": spec.mode,
        "workers": spec.workers,
        "servers": spec.servers,
        "hosts": [h.label for h in spec.hosts] or ["localhost"],
        "shards_total": 0,
        "shards_done": 0,
        "records_total": 0,
        "duplicate_records": 0,
        "restarts": [
            {"role": r.role, "rank": r.rank, "host": r.host, "reason": r.reason, "at_s": r.at_s}
            for r in state.restarts
        ],
        "actions": {},  # Controller actions by name; this job ran none
        "failures": [
            {
                "role": f.role,
                "rank": f.rank,
                "host": f.host,
                "exit_code": f.exit_code,
                "signal": f.signal,
                "error": f.error,
                "reason": f.reason,
                "retryable": f.retryable,
                "attempt": f.attempt,
                "at_s": f.at_s,
                "traceback": f.traceback,
                "root_cause": f is first,
            }
            for f in state.failures
        ],
    }
