"""Where this host lets the agent put per-child limits: the read-only half of
``LimitEnforcer.detect``.

It imports nothing but ``os`` on purpose: ``dtlaunch check`` runs it in a fresh
interpreter on every host, and on a 256-host check the imports of the whole
limits module (logging, dataclasses, pathlib, re) were a third of each host's
CPU. ``limits.LimitEnforcer.detect`` builds on it, so the check and the agent
cannot disagree.
"""

from __future__ import annotations

import os

AGENT_LEAF_PREFIX = "dtlaunch-agent-"
PERM_FIX = "run the agent as root or delegate a cgroup to its user"

# What a v1 hierarchy must hold to be usable for each resource.
_V1_PROBES = (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us"))


def own_cgroups(proc_cgroup: str) -> tuple[str | None, list[tuple[str, str]], str]:
    """This process's cgroups from ``/proc/self/cgroup``: the v2 path relative to
    the tree (None without one), the v1 ``(controllers as mounted, path)`` pairs,
    and why the file could not be read ("" when it could)."""
    try:
        with open(proc_cgroup, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        return None, [], f"cannot read {proc_cgroup}: {exc}"
    fields = [f for f in (line.split(":", 2) for line in lines) if len(f) == 3]
    v2_rel = next((f[2].lstrip("/") for f in fields if not f[1]), None)  # "0::/PATH"
    v1 = [(f[1], f[2].lstrip("/")) for f in fields if f[1]]
    return v2_rel, v1, ""


def look_at_v2(root: str, rel: str) -> tuple[str, str, list[str], bool, str]:
    """The agent's v2 cgroup D, read only: ``(tree, D, controllers wanted,
    already enabled for D's children, note)``. Wanted is empty, and the note says
    why, when D offers neither memory nor cpu or is not writable."""
    unified = os.path.exists(os.path.join(root, "cgroup.controllers"))
    tree = root if unified else os.path.join(root, "unified")
    d = os.path.join(tree, rel) if rel else tree
    if os.path.basename(d) == f"{AGENT_LEAF_PREFIX}{os.getpid()}":
        d = os.path.dirname(d)  # an earlier detect() moved the agent into its leaf already
    try:
        offered = set(_read(os.path.join(d, "cgroup.controllers")).split())
    except OSError:
        return tree, d, [], False, f"no cgroup v2 at {d}"
    wanted: list[str] = [c for c in ("memory", "cpu") if c in offered]
    if not wanted:
        return tree, d, [], False, f"cgroup v2 at {d} offers neither memory nor cpu"
    if not os.access(d, os.W_OK):
        return tree, d, [], False, f"cgroup v2 at {d} is not writable by uid {os.getuid()}"
    try:
        enabled = set(_read(os.path.join(d, "cgroup.subtree_control")).split())
    except OSError:
        enabled = set()
    return tree, d, wanted, all(c in enabled for c in wanted), ""


def find_v1(root: str, v1: list[tuple[str, str]], ctrl: str, probe: str) -> tuple[str | None, str]:
    """The agent's writable v1 cgroup of ``ctrl`` (holding ``probe``), or None and why not."""
    why = f"no cgroup v1 {ctrl} hierarchy"
    for mounted, rel in v1:
        if ctrl not in mounted.split(","):
            continue
        # "cpu,cpuacct" as mounted, or a link named "cpu" to it.
        for mount in dict.fromkeys((os.path.join(root, mounted), os.path.join(root, ctrl))):
            d = os.path.join(mount, rel) if rel else mount
            if not os.path.isdir(d):
                why = f"cgroup v1 {ctrl}: no {d}"
            elif not os.path.exists(os.path.join(d, probe)):
                why = f"cgroup v1 {ctrl} at {d} has no {probe}"
            elif not os.access(d, os.W_OK):
                why = f"cgroup v1 {ctrl} at {d} is not writable by uid {os.getuid()}"
            else:
                return d, ""
    return None, why


def combine(
    v2_ready: dict[str, str], v2_note: str, v1: list[tuple[str, str]], root: str
) -> tuple[dict[str, tuple[str, str]], str]:
    """Per resource the best backend, ``{"memory"|"cpu": (backend, parent dir)}``
    (a resource missing falls back to rlimit / affinity), and the one-line detail
    ``dtlaunch check`` shows: where the cgroups are, or why not and the fix."""
    parents = {c: ("cgroup-v2", d) for c, d in v2_ready.items()}
    why = [v2_note] if v2_note else []
    for ctrl, probe in _V1_PROBES:
        if ctrl not in parents:
            found, note = find_v1(root, v1, ctrl, probe)
            if found is not None:
                parents[ctrl] = ("cgroup-v1", found)
            else:
                why.append(note)
    parts = [f"{c} {kind} at {p}" for c, (kind, p) in parents.items()]
    fallbacks = (("memory", "rlimit"), ("cpu", "affinity"))
    fallen = [f"{c} by {k}" for c, k in fallbacks if c not in parents]
    if fallen:
        parts.append(f"{', '.join(fallen)} ({'; '.join(why)}): {PERM_FIX} for cgroup limits")
    return parents, "; ".join(parts)


def support_without_changes(
    root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> tuple[str, str, str]:
    """``(memory backend, cpu backend, detail)`` the agent would use here, found
    without changing anything: a v2 cgroup that offers the controllers and is
    writable counts as usable (the agent enables them for its children)."""
    v2_rel, v1, unreadable = own_cgroups(proc_cgroup)
    ready: dict[str, str] = {}
    note = unreadable
    if v2_rel is not None:
        _tree, d, wanted, _enabled, note = look_at_v2(root, v2_rel)
        ready = dict.fromkeys(wanted, d)
    parents, detail = combine(ready, note, v1, root)
    memory = parents.get("memory", ("rlimit", ""))[0]
    cpu = parents.get("cpu", ("affinity", ""))[0]
    return memory, cpu, detail


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()
