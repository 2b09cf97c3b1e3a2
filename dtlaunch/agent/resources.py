"""State and resource use of a child's whole process tree, via psutil.

Finding a tree's members is the costly part: psutil's ``children(recursive=True)``
reads the ``stat`` file of every process on the machine, each time, for each
child. On a host with many processes, or on one machine carrying hundreds of
agents (a loopback scale test), every heartbeat of every agent then reads them
all. ``tree_finder`` picks the cheapest way the kernel offers:

* ``ChildrenFiles`` reads the kernel's own lists of each thread's children
  (``/proc/PID/task/TID/children``, CONFIG_PROC_CHILDREN, in every mainstream
  distribution's kernel): a heartbeat costs a few reads per member of the tree,
  whatever else runs on the machine (0.02 ms for a one-process tree, against
  0.8 ms for a listing of 1,100 pids).
* Without them, ``ParentTable`` keeps the parent of every pid it has seen and
  reads the ``stat`` of new pids only: a heartbeat costs one listing of
  ``/proc``, shared by all of an agent's children. A parent does not change
  while both live (Linux reparents only orphans, whose parents are read again
  when their parent is gone); a pid that is reused between two listings is
  caught by re-reading everything every ``FULL_REREAD_S``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psutil

# How often ParentTable re-reads every pid's parent (a pid reused between two
# listings would otherwise keep its old parent); listings in between read new pids.
FULL_REREAD_S = 30.0
_PROC = "/proc"

_STOPPED = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})


class TreeFinder(Protocol):
    """Finds the members of a process tree: ``refresh`` once per round of
    samples, then ``descendants`` of each tree's leader. ``usable`` is False
    where ``/proc`` cannot be read (then callers ask psutil)."""

    usable: bool

    def refresh(self) -> None: ...

    def descendants(self, pid: int) -> list[int]: ...


def tree_finder() -> TreeFinder:
    """``ChildrenFiles`` where the kernel lists children, else ``ParentTable``."""
    finder = ChildrenFiles()
    return finder if finder.usable else ParentTable()


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

    def __init__(self, pid: int, parents: TreeFinder | None = None) -> None:
        self._pid = pid
        self._parents = parents
        self._known: dict[tuple[int, float], psutil.Process] = {}

    def sample(self) -> TreeSample:
        try:
            leader = self._cached(psutil.Process(self._pid))
            state = state_of(leader.status())
            if self._parents is not None and self._parents.usable:
                descendants = [psutil.Process(pid) for pid in self._parents.descendants(self._pid)]
            else:
                descendants = leader.children(recursive=True)
            tree = [leader, *descendants]
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


class ChildrenFiles:
    """The members of a tree from the kernel's children list of each thread.

    The kernel documents the lists as possibly missing a child that is being
    reparented at that moment; such a child is found at the next sample (its
    resource use is a sample, not a ledger)."""

    def __init__(self) -> None:
        me = os.getpid()
        self.usable = os.path.exists(f"{_PROC}/{me}/task/{me}/children")

    def refresh(self) -> None:
        """Nothing to do: every sample reads the lists afresh."""

    def descendants(self, pid: int) -> list[int]:
        """The pids below ``pid`` now, parents first ([] when ``pid`` is gone)."""
        out: list[int] = []
        todo = [pid]
        while todo:
            parent = todo.pop()
            try:
                threads = os.listdir(f"{_PROC}/{parent}/task")
            except OSError:  # gone meanwhile
                continue
            for tid in threads:
                try:
                    with open(f"{_PROC}/{parent}/task/{tid}/children", "rb") as handle:
                        children = [int(field) for field in handle.read().split()]
                except OSError:  # the thread ended meanwhile
                    continue
                out.extend(children)
                todo.extend(children)
        return out


class ParentTable:
    """pid -> parent pid of every process, kept up to date incrementally (see the
    module docstring); ``refresh`` once per round of samples, then ``descendants``.

    ``usable`` is False where ``/proc`` cannot be read (then callers ask psutil).
    ``clock`` is injectable for tests.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._parent: dict[int, int] = {}
        self._children: dict[int, list[int]] | None = None
        self._full_at = -float("inf")
        self.usable = os.path.isdir(_PROC)

    def refresh(self) -> None:
        """List ``/proc``: forget the pids that are gone, read the new ones' parents."""
        try:
            listed = {int(name) for name in os.listdir(_PROC) if name.isdigit()}
        except OSError:
            self.usable = False
            return
        now = self._clock()
        if now - self._full_at >= FULL_REREAD_S:
            self._parent.clear()
            self._full_at = now
        parent = self._parent
        gone = {p for p in parent if p not in listed}
        for pid in gone:
            del parent[pid]
        if gone:  # their children were reparented (to init or a subreaper): read again
            for pid in [p for p, pp in parent.items() if pp in gone]:
                del parent[pid]
        for pid in listed:
            if pid not in parent:
                ppid = _read_ppid(pid)
                if ppid is not None:
                    parent[pid] = ppid
        self._children = None

    def descendants(self, pid: int) -> list[int]:
        """The pids below ``pid`` as of the last ``refresh``, parents first."""
        children = self._children
        if children is None:
            children = self._children = {}
            for child, ppid in self._parent.items():
                children.setdefault(ppid, []).append(child)
        out: list[int] = []
        todo = list(children.get(pid, ()))
        while todo:
            child = todo.pop()
            out.append(child)
            todo.extend(children.get(child, ()))
        return out


def _read_ppid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc/PID/stat``; None if it is gone already.

    The command name in field 2 may hold spaces and parentheses: the fields after
    the last ')' are fixed (state, then ppid)."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split(b" ", 2)
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None
