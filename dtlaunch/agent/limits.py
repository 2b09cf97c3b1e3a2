"""Per-child memory and CPU limits, enforced by the kernel for each process the agent starts.

``LimitEnforcer.detect`` picks, per resource, the best backend this host lets the agent use:
memory by cgroup v2 (``memory.max``, ``memory.swap.max`` 0), cgroup v1
(``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes`` the same) or else ``rlimit``
(RLIMIT_AS in the child: Python raises MemoryError); CPU by cgroup v2 (``cpu.max``),
cgroup v1 (``cpu.cfs_quota_us`` per 100 ms period) or else ``affinity`` (ceil(cpus) of
the agent's CPUs, round-robin). ``prefer="rlimit"`` (``--limits-via rlimit``) skips cgroups.

``LimitEnforcer.cage`` makes one child's cgroups (``dtlaunch-<agentpid>-<name>``) and
returns a ``Cage``, whose ``enter`` runs as ``preexec_fn`` in the forked child and moves it
in before ``exec``: not one instruction of the worker runs unconfined. Under cgroup v2 an
agent whose own cgroup cannot hold both itself and children (the no-internal-processes
rule) first moves itself into a leaf ``dtlaunch-agent-<pid>``.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path

from dtlaunch.agent import cgroupfind
from dtlaunch.agent.oom import read_oom_kill_count
from dtlaunch.errors import ConfigError, LaunchError

__all__ = ["Cage", "LimitEnforcer", "LimitSupport", "Limits"]

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
_PREFIX = "dtlaunch-"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_PERM_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)
_PERM_FIX = cgroupfind.PERM_FIX


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    memory_bytes: int = 0  # 0: no memory limit
    cpus: float = 0.0  # 0: no CPU limit

    def __post_init__(self) -> None:
        if self.memory_bytes < 0 or not self.cpus >= 0:  # `not >=` also catches NaN
            raise ValueError(f"limits must be >= 0, got {self}")

    def __bool__(self) -> bool:
        return self.memory_bytes > 0 or self.cpus > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitSupport:
    memory: str  # "cgroup-v2" | "cgroup-v1" | "rlimit"
    cpu: str  # "cgroup-v2" | "cgroup-v1" | "affinity"
    detail: str  # one line: where the cgroups are, or why they are not used and the fix


class Cage:
    """One child's limits. Created in the parent before fork."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.backend = "none"
        # The rest is filled in by LimitEnforcer.cage.
        self._dirs: tuple[Path, ...] = ()
        self._fds: tuple[int, ...] = ()  # O_CLOEXEC: the worker does not inherit them
        self._rlimit_as = 0
        self._cpu_set = frozenset[int]()
        self._oom_file: Path | None = None
        self._cpu_stat: Path | None = None  # its CPU cgroup's cpu.stat
        self._periods_seen: tuple[int, int] | None = None  # (nr_periods, nr_throttled)
        self.left_behind: list[Path] = []  # cgroups remove() could not remove (yet)
        self.dirs: tuple[Path, ...] = ()  # every cgroup made for it, kept after remove()

    def enter(self) -> None:
        """In the forked child (preexec_fn): join the cgroups, set the rlimit and affinity.

        Only syscalls on what the parent prepared: after fork in a threaded process a
        lock another thread held (allocator, logging, import) is never released.
        """
        for fd in self._fds:
            os.write(fd, b"0")  # "0" is the writing process itself
        if self._rlimit_as:
            # Soft and hard alike, so the worker cannot raise it back.
            resource.setrlimit(resource.RLIMIT_AS, (self._rlimit_as, self._rlimit_as))
        if self._cpu_set:
            os.sched_setaffinity(0, self._cpu_set)

    def after_fork(self) -> None:
        """In the parent once Popen returned or raised: close the ``cgroup.procs`` fds."""
        fds, self._fds = self._fds, ()
        for fd in fds:
            os.close(fd)

    def oom_kills(self) -> int | None:
        """How often the OOM killer struck in this child's memory cgroup; None without one."""
        return None if self._oom_file is None else read_oom_kill_count(self._oom_file)

    def throttled_share(self) -> float:
        """Of the CFS periods in which this child ran since the last call, the
        share in which its CPU quota stopped it (0.0 without a CPU cgroup, at the
        first call, or when cpu.stat cannot be read)."""
        if self._cpu_stat is None:
            return 0.0
        counts = read_throttling(self._cpu_stat)
        if counts is None:
            return 0.0
        seen, self._periods_seen = self._periods_seen, counts
        if seen is None or counts[0] <= seen[0]:
            return 0.0
        return min(1.0, max(0, counts[1] - seen[1]) / (counts[0] - seen[0]))

    def remove(self) -> None:
        """Remove the cgroups once the child and its group are gone; never raises."""
        self.after_fork()
        dirs, self._dirs = self._dirs, ()
        for path in dirs:
            try:
                path.rmdir()
            except OSError as exc:
                # EBUSY: a grandchild left the process group and lives on in it (or,
                # a moment after a SIGKILL, is not reaped yet); the agent retries.
                log.info("cannot remove cgroup %s yet: %s", path, exc)
                self.left_behind.append(path)


class LimitEnforcer:
    """Makes ``Cage`` s with the backends ``detect`` found; one per agent."""

    def __init__(
        self,
        *,
        support: LimitSupport,
        memory_parent: Path | None = None,
        cpu_parent: Path | None = None,
        cpus: tuple[int, ...] = (),
    ) -> None:
        self.support = support
        self._memory_parent = memory_parent  # where children's cgroups go; None: fallback
        self._cpu_parent = cpu_parent
        self._cpus = cpus  # the agent's allowed CPUs, for the affinity fallback
        self._next_cpu = 0
        self._made: set[Path] = set()  # our own cgroups: never stale for sweep_stale
        self._left_behind: set[Path] = set()  # ours, busy when their child ended

    @classmethod
    def detect(
        cls,
        *,
        root: Path = Path("/sys/fs/cgroup"),
        proc_cgroup: Path = Path("/proc/self/cgroup"),
        prefer: str = "",
        dry_run: bool = False,
    ) -> LimitEnforcer:
        """Find the best usable backend per resource (may move the agent into a v2
        leaf; ``dry_run``: changes nothing, for ``dtlaunch check``, and reports v2
        as usable when it offers the controllers and is writable).

        Raises:
            ConfigError: ``prefer`` (--limits-via) is neither "" nor "rlimit".
        """
        cpus = tuple(sorted(os.sched_getaffinity(0)))
        if prefer not in ("", "rlimit"):
            raise ConfigError(f"--limits-via {prefer!r}: use 'rlimit' or 'auto'")
        if prefer == "rlimit":
            off = "--limits-via rlimit: no cgroups; memory by RLIMIT_AS, CPU by affinity"
            return cls(support=LimitSupport(memory="rlimit", cpu="affinity", detail=off), cpus=cpus)
        v2_rel, v1, unreadable = cgroupfind.own_cgroups(str(proc_cgroup))
        if unreadable:
            log.info("%s", unreadable)
        ready: dict[str, str] = {}
        note = unreadable
        if v2_rel is not None:
            ready, note = _prepare_v2(str(root), v2_rel, dry_run=dry_run)
        found, detail = cgroupfind.combine(ready, note, v1, str(root))
        parents = {c: (kind, Path(d)) for c, (kind, d) in found.items()}
        memory: tuple[str, Path | None] = parents.get("memory", ("rlimit", None))
        cpu: tuple[str, Path | None] = parents.get("cpu", ("affinity", None))
        return cls(
            support=LimitSupport(memory=memory[0], cpu=cpu[0], detail=detail),
            memory_parent=memory[1],
            cpu_parent=cpu[1],
            cpus=cpus,
        )

    def cage(self, name: str, limits: Limits) -> Cage:
        """Make the cgroups of one child and write its limits; Limits() makes a no-op Cage.

        Raises:
            LaunchError: a cgroup cannot be made or the kernel refuses a limit.
        """
        self.retry_left_behind()
        cage = Cage(limits)
        if not limits:
            return cage
        leaf = f"{_PREFIX}{os.getpid()}-{_UNSAFE.sub('_', name)[:200]}"
        sup = self.support
        backend: list[str] = []
        made: dict[Path, Path] = {}  # parent -> the child's cgroup in it (v2: one for both)
        fds: list[int] = []
        try:
            if limits.memory_bytes:
                backend.append(f"memory {sup.memory}")
                value = str(limits.memory_bytes)
                if self._memory_parent is None:
                    cage._rlimit_as = limits.memory_bytes
                else:
                    limit_file, swap_file, oom_name = _MEMORY_FILES[sup.memory]
                    d = _mkcg(self._memory_parent, leaf, made, fds)
                    _set(d / limit_file, value, _MEMORY_FIX)
                    # Else swap hides the limit. v1's memsw counts memory+swap, so it is the
                    # same value, written after, as the kernel keeps it >= limit_in_bytes.
                    if _has(d, swap_file):
                        swap = "0" if sup.memory == "cgroup-v2" else value
                        _set(d / swap_file, swap, _MEMORY_FIX)
                    cage._oom_file = d / oom_name
            if limits.cpus:
                backend.append(f"cpu {sup.cpu}")
                quota = str(int(limits.cpus * CFS_PERIOD_US))
                if self._cpu_parent is None:
                    cage._cpu_set = self._pick_cpus(math.ceil(limits.cpus))
                else:
                    d = _mkcg(self._cpu_parent, leaf, made, fds)
                    cage._cpu_stat = d / "cpu.stat"
                    if sup.cpu == "cgroup-v2":
                        _set(d / "cpu.max", f"{quota} {CFS_PERIOD_US}", _CPU_FIX)
                    else:
                        _set(d / "cpu.cfs_period_us", str(CFS_PERIOD_US), _CPU_FIX)
                        _set(d / "cpu.cfs_quota_us", quota, _CPU_FIX)
        except BaseException:
            cage._dirs, cage._fds = tuple(made.values()), tuple(fds)
            cage.remove()  # half made: take it back
            raise
        cage._dirs, cage._fds = tuple(made.values()), tuple(fds)
        cage.dirs = cage._dirs
        cage.backend = ", ".join(backend)
        self._made.update(cage._dirs)
        return cage

    def forget(self, cage: Cage) -> None:
        """``cage`` was removed: its cgroups are no longer kept from a sweep, and
        those it could not remove yet are retried before the next cage is made."""
        self._made.difference_update(cage.dirs)
        self._left_behind.update(cage.left_behind)
        cage.left_behind.clear()

    def retry_left_behind(self) -> int:
        """Remove the cgroups earlier cages left behind once they are empty; how many."""
        removed = 0
        for path in sorted(self._left_behind):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            self._left_behind.discard(path)
            removed += 1
        return removed

    def sweep_stale(self) -> int:
        """Remove the empty ``dtlaunch-*`` cgroups killed agents left; how many. Never raises."""
        removed = 0
        me = os.getpid()
        for parent in {p for p in (self._memory_parent, self._cpu_parent) if p is not None}:
            try:
                entries = sorted(p for p in parent.iterdir() if p.name.startswith(_PREFIX))
            except OSError as exc:
                log.warning("cannot list %s for stale cgroups: %s", parent, exc)
                continue
            for path in entries:
                owner = _owner_pid(path.name)
                # A live agent's cgroup may be made and still empty: its child not forked yet.
                # Our own pid can be a dead predecessor's too (containers reuse low pids).
                if owner is None or path in self._made:
                    continue
                if owner != me and _pid_exists(owner):
                    continue
                try:
                    if (path / "cgroup.procs").read_text().strip():
                        continue
                except OSError:
                    pass  # not a cgroup file to read: the kernel's rmdir still guards busy ones
                try:
                    path.rmdir()
                except OSError as exc:
                    log.debug("stale cgroup %s stays: %s", path, exc)
                    continue
                log.info("removed stale cgroup %s", path)
                removed += 1
        return removed

    def _pick_cpus(self, n: int) -> frozenset[int]:
        # Round-robin, so two workers of 1 CPU each do not share one CPU and leave one idle.
        if not self._cpus or n >= len(self._cpus):
            return frozenset(self._cpus)
        start, self._next_cpu = self._next_cpu, (self._next_cpu + n) % len(self._cpus)
        return frozenset(self._cpus[(start + i) % len(self._cpus)] for i in range(n))


# backend -> (limit file, swap file, file with the oom_kill count)
_MEMORY_FILES = {
    "cgroup-v2": ("memory.max", "memory.swap.max", "memory.events"),
    "cgroup-v1": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.oom_control"),
}
_MEMORY_FIX = "give a larger memory limit (the kernel refuses this one)"
_CPU_FIX = "give a larger CPU limit (the kernel's least quota is 0.01 CPUs, 1 ms per 100 ms)"


def _prepare_v2(root: str, rel: str, *, dry_run: bool) -> tuple[dict[str, str], str]:
    """Make the agent's v2 cgroup D able to hold children; {controller: D} and a note why not."""
    tree_s, d_s, wanted, enabled, note = cgroupfind.look_at_v2(root, rel)
    if not wanted:
        return {}, note
    if enabled or dry_run:
        return dict.fromkeys(wanted, d_s), ""
    tree, d = Path(tree_s), Path(d_s)
    # Only the real root (which has no cgroup.type) may hold processes and enable
    # controllers for children; elsewhere the agent must leave D for a leaf first.
    is_root = d == tree and not (d / "cgroup.type").exists()
    pid = str(os.getpid())
    leaf = d / f"{cgroupfind.AGENT_LEAF_PREFIX}{pid}"
    moved = False
    try:
        if not is_root:
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(pid)
            moved = True
        (d / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
    except OSError as exc:
        # EBUSY: other processes share D (or it has children without the controllers).
        if moved:
            try:
                (d / "cgroup.procs").write_text(pid)
            except OSError as back:
                log.warning("cannot move the agent back to %s: %s", d, back)
        if not is_root:
            try:
                leaf.rmdir()
            except OSError as gone:
                log.warning("cannot remove %s: %s", leaf, gone)
        what = "move the agent into a leaf and enable" if not is_root else "enable"
        return {}, f"cgroup v2 at {d}: cannot {what} {'+'.join(wanted)}: {exc.strerror or exc}"
    log.info("cgroup v2: %s enabled for children of %s (agent moved: %s)", wanted, d, moved)
    return dict.fromkeys(wanted, d_s), ""


def _mkcg(parent: Path, leaf: str, made: dict[Path, Path], fds: list[int]) -> Path:
    """Make (once) the child's cgroup under ``parent``; open its cgroup.procs for enter()."""
    if parent in made:
        return made[parent]
    d = parent / leaf
    try:
        if d.is_dir():  # a dead agent of the same pid left it; rmdir fails while it is busy
            d.rmdir()
        d.mkdir()
        made[parent] = d
        # O_CREAT only matters for plain-directory test trees: cgroupfs has the file.
        fds.append(os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError as exc:
        fix = _PERM_FIX if exc.errno in _PERM_ERRNOS else "kill the processes left in it"
        raise LaunchError(f"cannot create cgroup {d}: {exc.strerror or exc}; {fix}") from exc
    return d


def read_throttling(stat: Path) -> tuple[int, int] | None:
    """(nr_periods, nr_throttled) from a cgroup's ``cpu.stat`` (v1 and v2 name
    them alike); None when it cannot be read or lacks them."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    fields = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
    try:
        return int(fields["nr_periods"]), int(fields["nr_throttled"])
    except (KeyError, ValueError):
        return None


def _set(path: Path, value: str, fix: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        hint = _PERM_FIX if exc.errno in _PERM_ERRNOS else fix
        raise LaunchError(f"cannot write {value} to {path}: {exc.strerror or exc}; {hint}") from exc


def _has(d: Path, name: str) -> bool:
    # The parent answers for plain-directory test trees, whose new child dirs are empty.
    return (d / name).exists() or (d.parent / name).exists()


def _owner_pid(name: str) -> int | None:
    """The agent pid in ``dtlaunch-<pid>-<name>`` or ``dtlaunch-agent-<pid>``."""
    rest = name.removeprefix(_PREFIX).removeprefix("agent-")
    digits = rest.partition("-")[0]
    return int(digits) if digits.isdigit() else None


def _pid_exists(pid: int) -> bool:
    """Signal 0 asks whether ``pid`` exists (not psutil: this module is imported
    by ``dtlaunch check``'s probe on every host, where psutil would cost 20 ms)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True
