"""State and resource use of a child's whole process tree, via psutil."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

_STOPPED = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeSample:
    state: str  # one of messages.PROC_STATES
    rss_bytes: int
    cpu_percent: float


def state_of(status: str) -> str:
    """Map a psutil status to a ProcReport state."""
    if status in _STOPPED:
        return "stopped"
    if status == psutil.STATUS_ZOMBIE:
        return "zombie"
    return "running"


class TreeSampler:
    """Samples one process and its descendants.

    psutil's ``cpu_percent`` measures since the previous call on the same
    ``Process`` object, so the objects are kept between samples (keyed by pid and
    create time, so a reused pid starts afresh).
    """

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._known: dict[tuple[int, float], psutil.Process] = {}

    def sample(self) -> TreeSample:
        try:
            leader = self._cached(psutil.Process(self._pid))
            state = state_of(leader.status())
            tree = [leader, *leader.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return TreeSample(state="zombie", rss_bytes=0, cpu_percent=0.0)
        rss = 0
        cpu = 0.0
        alive: dict[tuple[int, float], psutil.Process] = {}
        for proc in tree:
            try:
                proc = self._cached(proc)
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(interval=None)
                alive[(proc.pid, proc.create_time())] = proc
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self._known = alive
        return TreeSample(state=state, rss_bytes=rss, cpu_percent=round(cpu, 1))

    def _cached(self, proc: psutil.Process) -> psutil.Process:
        return self._known.get((proc.pid, proc.create_time()), proc)
