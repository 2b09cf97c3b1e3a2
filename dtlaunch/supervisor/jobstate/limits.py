"""Each process's memory and CPU limits, and what an out-of-memory death does to them.

DLRover relaunches a pod that was OOM-killed with more memory instead of failing
the job; so does this, for processes on hosts. The first limit of a process is
``--memory-limit`` (else its host's ``mem=`` over its slots; else none), and
``--cpu-limit`` (else the host's ``cpus=`` over its slots; else none). A process
killed at its limit (the kernel's OOM killer in its cgroup, or a ``MemoryError``
under RLIMIT_AS) is relaunched with twice the memory, bounded by its host (what
the hostfile declares, else what the agent measured) and ``--memory-max``, at
most ``--oom-relaunches`` times. A process that runs out at the bound fails the
job with the numbers: more attempts cannot help it. Without a limit an OOM kill
is the host running out, and it is an ordinary retryable failure.

A built-in parameter server that runs out follows DLRover's rule for servers
(§4.2: "if any PS fails with OOM, DLRover doubles the number of PS"): when the
servers use about as much memory as each other, the model needs more servers,
twice as many as far as free slots go, and the server restarts with its limit;
when this one uses clearly more (``memory_skewed``: its blocks are larger), it
needs more memory, as any process. More servers are tried once per server: one
that runs out again gets more memory.

Pure: the node table (``machine.py``) asks, and applies the answer.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dtlaunch.quantities import format_size

__all__ = ["MEMORY_SKEW", "LimitRules", "OomDecision", "memory_skewed"]


# A server that ran out uses clearly more memory than the others above this many
# times their median: its blocks are larger, more servers would not help it.
MEMORY_SKEW = 1.5


def memory_skewed(footprint: int, others: Sequence[int]) -> bool:
    """Whether a server that ran out at ``footprint`` bytes used clearly more than
    the other servers (their memory now); alone, it is not."""
    used = [b for b in others if b > 0]
    return bool(used) and footprint > MEMORY_SKEW * statistics.median(used)


@dataclass(frozen=True, slots=True, kw_only=True)
class OomDecision:
    """What an out-of-memory death of a limited process leads to."""

    new_limit: int = 0  # the relaunch's memory limit; 0: no relaunch
    error: str = ""  # why the job fails instead (when new_limit is 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitRules:
    memory_limit: int = 0  # --memory-limit, bytes per process; 0: from the host
    cpu_limit: float = 0.0  # --cpu-limit, CPUs per process; 0: from the host
    oom_relaunches: int = 3
    memory_max: int = 0  # --memory-max; 0: the host's memory
    # The hostfile's declarations, by host label (absent: not declared).
    host_memory: Mapping[str, int] = field(default_factory=dict)
    host_cpus: Mapping[str, float] = field(default_factory=dict)
    host_slots: Mapping[str, int] = field(default_factory=dict)

    def first_memory(self, host: str) -> int:
        """A new process's memory limit on ``host`` (0: none)."""
        if self.memory_limit:
            return self.memory_limit
        declared = self.host_memory.get(host, 0)
        return declared // max(1, self.host_slots.get(host, 1)) if declared else 0

    def first_cpus(self, host: str) -> float:
        """A new process's CPU limit on ``host`` (0: none)."""
        if self.cpu_limit:
            return self.cpu_limit
        declared = self.host_cpus.get(host, 0.0)
        return round(declared / max(1, self.host_slots.get(host, 1)), 3) if declared else 0.0

    def after_oom(
        self, *, proc_id: str, host: str, limit: int, relaunches: int, measured_host_memory: int
    ) -> OomDecision:
        """``proc_id`` ran out of memory at ``limit`` after ``relaunches`` OOM relaunches."""
        if relaunches >= self.oom_relaunches:
            return OomDecision(
                error=f"{proc_id} ran out of memory at its limit of {format_size(limit)} "
                f"after {relaunches} relaunches with more memory (--oom-relaunches "
                f"{self.oom_relaunches}); raise --oom-relaunches or --memory-limit"
            )
        host_memory = self.host_memory.get(host, 0) or measured_host_memory
        bounds = [b for b in (host_memory, self.memory_max) if b > 0]
        bound = min(bounds) if bounds else 0
        if bound and limit >= bound:
            which = "--memory-max" if bound == self.memory_max else f"the memory of {host}"
            return OomDecision(
                error=f"{proc_id} ran out of memory at {format_size(limit)}, already "
                f"{which} ({format_size(bound)}); give it a host with more memory "
                "(mem= in the hostfile), raise --memory-max, or make it use less"
            )
        grown = 2 * limit
        return OomDecision(new_limit=min(grown, bound) if bound else grown)
