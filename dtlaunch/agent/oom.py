"""Tell whether the kernel's OOM killer took a child, from the agent's memory cgroup.

The kernel keeps a per-cgroup count of OOM kills: ``oom_kill`` in ``memory.events``
(cgroup v2) or in ``memory.oom_control`` (cgroup v1). Children run in the agent's
cgroup, so a child that died of SIGKILL while that count went up was, with high
likelihood, taken by the OOM killer. Where no counter is readable (no cgroup fs,
another OS) every answer is "not OOM".
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def find_oom_counter_file(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> Path | None:
    """Return the file holding this process's cgroup ``oom_kill`` count, or None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    v2: list[Path] = []
    v1: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":
            # cgroup v2: the unified tree, mounted at the root or at ./unified (hybrid).
            for base in (root, root / "unified"):
                v2 += [base / rel / "memory.events", base / "memory.events"]
        elif "memory" in controllers.split(","):
            base = root / "memory"
            v1 += [base / rel / "memory.oom_control", base / "memory.oom_control"]
    # v2 first: on hybrid hosts memory.events exists only where v2 owns memory.
    for candidate in v2 + v1:
        if read_oom_kill_count(candidate) is not None:
            return candidate
    return None


def read_oom_kill_count(path: Path) -> int | None:
    """Parse the ``oom_kill N`` line of a ``memory.events``/``memory.oom_control`` file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


class OomWatcher:
    """Attributes increases of the cgroup OOM-kill count to SIGKILLed children.

    Each increase is handed out once, so two children killed by signal after one
    OOM kill do not both count as OOM-killed.
    """

    def __init__(self, counter_file: Path | None) -> None:
        self._file = counter_file
        self._seen = self._read()
        if counter_file is None:
            log.info("no cgroup oom_kill counter found; OOM kills will not be detected")
        else:
            log.debug("watching OOM kills in %s (count now %s)", counter_file, self._seen)

    @classmethod
    def for_this_process(cls) -> OomWatcher:
        return cls(find_oom_counter_file())

    def _read(self) -> int:
        if self._file is None:
            return 0
        return read_oom_kill_count(self._file) or 0

    def claim_oom_kill(self) -> bool:
        """True when the OOM-kill count rose since the last claim; consumes one kill."""
        now = self._read()
        if now > self._seen:
            self._seen += 1
            return True
        # The count can drop when the cgroup was recreated; follow it down.
        self._seen = min(self._seen, now)
        return False
