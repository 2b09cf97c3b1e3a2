"""Per-child memory and CPU limits (dtlaunch.agent.limits).

Detection and the files written are tested on fake cgroup trees made of plain
directories; enforcement on this machine's real cgroups (skipped where the agent
cannot write one) and on the rlimit/affinity fallbacks, with real child processes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dtlaunch.agent import limits as limits_mod
from dtlaunch.agent.cgroupfind import support_without_changes
from dtlaunch.agent.limits import Cage, LimitEnforcer, Limits, read_throttling
from dtlaunch.errors import ConfigError, LaunchError

PY = sys.executable
PID = os.getpid()
MiB = 2**20
CGROUP_ROOT = Path("/sys/fs/cgroup")
FIX = "run the agent as root or delegate a cgroup"


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def detect(tmp_path: Path, *lines: str, prefer: str = "", dry_run: bool = False) -> LimitEnforcer:
    proc = write(tmp_path / "proc-self-cgroup", "".join(f"{line}\n" for line in lines))
    return LimitEnforcer.detect(
        root=tmp_path / "cg", proc_cgroup=proc, prefer=prefer, dry_run=dry_run
    )


def v1_tree(root: Path, memory: str = "memory", cpu: str = "cpu,cpuacct") -> tuple[Path, Path]:
    """A v1 memory hierarchy at root/<memory>/process_api/abc and cpu at root/<cpu>/."""
    mem = root / memory / "process_api" / "abc"
    for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "cgroup.procs"):
        write(mem / name, "9223372036854771712\n")
    for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cgroup.procs"):
        write(root / cpu / name, "-1\n")
    return mem, root / cpu


V1_LINES = ("4:memory:/process_api/abc", "2:cpu,cpuacct:/")


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- fake trees: cgroup v2


def test_v2_at_the_root_enables_controllers_and_puts_children_right_under_it(tmp_path):
    root = tmp_path / "cg"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root / "cgroup.subtree_control")
    enforcer = detect(tmp_path, "0::/")
    assert (enforcer.support.memory, enforcer.support.cpu) == ("cgroup-v2", "cgroup-v2")
    assert str(root) in enforcer.support.detail
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu"
    assert not list(root.glob("dtlaunch-agent-*"))  # the root may hold the agent and children

    cage = enforcer.cage("worker-0/a1 x", Limits(memory_bytes=64 * MiB, cpus=1.5))
    child = root / f"dtlaunch-{PID}-worker-0_a1_x"  # sanitized name
    assert cage.backend == "memory cgroup-v2, cpu cgroup-v2"
    assert (child / "memory.max").read_text() == str(64 * MiB)
    assert (child / "cpu.max").read_text() == "150000 100000"
    assert not (child / "memory.swap.max").exists()  # no swap accounting in this tree
    cage.enter()  # only writes to the pre-opened cgroup.procs here
    cage.after_fork()
    cage.after_fork()  # idempotent
    assert (child / "cgroup.procs").read_text() == "0"
    write(child / "memory.events", "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n")
    assert cage.oom_kills() == 2


def test_v2_hybrid_under_unified_with_controllers_already_on_uses_the_agents_cgroup(tmp_path):
    unified = tmp_path / "cg" / "unified"
    d = unified / "job.slice" / "agent.service"
    write(unified / "cgroup.controllers", "memory cpu\n")
    write(d / "cgroup.type", "domain\n")
    write(d / "cgroup.controllers", "memory cpu pids\n")
    write(d / "cgroup.subtree_control", "memory cpu\n")
    write(d / "memory.swap.max", "max\n")
    enforcer = detect(tmp_path, "0::/job.slice/agent.service")
    assert (enforcer.support.memory, enforcer.support.cpu) == ("cgroup-v2", "cgroup-v2")
    assert not list(d.glob("dtlaunch-agent-*"))
    assert (d / "cgroup.subtree_control").read_text() == "memory cpu\n"  # left alone

    cage = enforcer.cage("w", Limits(memory_bytes=100 * MiB))
    cage.after_fork()
    child = d / f"dtlaunch-{PID}-w"
    assert (child / "memory.max").read_text() == str(100 * MiB)
    assert (child / "memory.swap.max").read_text() == "0"  # swap cannot hide the limit
    assert not (child / "cpu.max").exists()
    assert cage.backend == "memory cgroup-v2"


def test_v2_agent_moves_into_a_leaf_so_its_cgroup_can_hold_children(tmp_path):
    root = tmp_path / "cg"
    d = root / "user.slice" / "agent.scope"
    write(root / "cgroup.controllers", "memory cpu io\n")
    write(d / "cgroup.type", "domain\n")  # not the real root: no-internal-processes applies
    write(d / "cgroup.controllers", "io memory\n")  # no cpu offered here
    write(d / "cgroup.subtree_control")
    write(d / "cgroup.procs", f"{PID}\n")
    write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "-1\n")  # cpu by v1 (hybrid)
    # `dtlaunch check` asks first: it reports v2 and changes nothing.
    dry = detect(tmp_path, "1:cpu:/", "0::/user.slice/agent.scope", dry_run=True)
    assert (dry.support.memory, dry.support.cpu) == ("cgroup-v2", "cgroup-v1")
    assert not (d / f"dtlaunch-agent-{PID}").exists()
    assert (d / "cgroup.subtree_control").read_text() == ""
    enforcer = detect(tmp_path, "1:cpu:/", "0::/user.slice/agent.scope")
    leaf = d / f"dtlaunch-agent-{PID}"
    assert (leaf / "cgroup.procs").read_text() == str(PID)
    assert (d / "cgroup.subtree_control").read_text() == "+memory"  # only what is offered
    assert (enforcer.support.memory, enforcer.support.cpu) == ("cgroup-v2", "cgroup-v1")

    cage = enforcer.cage("w", Limits(memory_bytes=64 * MiB, cpus=0.5))
    cage.after_fork()
    assert (d / f"dtlaunch-{PID}-w" / "memory.max").read_text() == str(64 * MiB)
    assert (root / "cpu" / f"dtlaunch-{PID}-w" / "cpu.cfs_quota_us").read_text() == "50000"
    assert cage.backend == "memory cgroup-v2, cpu cgroup-v1"

    # Detected again from inside the leaf, as the kernel shows it: no leaf in the leaf.
    (d / "cgroup.subtree_control").write_text("memory\n")
    again = detect(tmp_path, "1:cpu:/", f"0::/user.slice/agent.scope/{leaf.name}")
    assert again.support.memory == "cgroup-v2"
    assert not list(leaf.glob("dtlaunch-*"))


def test_v2_cgroup_namespace_root_is_no_real_root_so_the_agent_takes_a_leaf(tmp_path):
    root = tmp_path / "cg"  # a container's view: its own cgroup shown as "/"
    write(root / "cgroup.controllers", "memory cpu\n")
    write(root / "cgroup.type", "domain\n")  # the real root has no cgroup.type
    write(root / "cgroup.subtree_control")
    enforcer = detect(tmp_path, "0::/")
    assert (root / f"dtlaunch-agent-{PID}" / "cgroup.procs").read_text() == str(PID)
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu"
    assert (enforcer.support.memory, enforcer.support.cpu) == ("cgroup-v2", "cgroup-v2")


def test_v2_leaf_move_that_fails_moves_the_agent_back_and_falls_back(tmp_path, caplog):
    root = tmp_path / "cg"
    d = root / "agent.scope"
    write(root / "cgroup.controllers", "memory cpu\n")
    write(d / "cgroup.type", "domain\n")
    write(d / "cgroup.controllers", "memory cpu\n")
    write(d / "cgroup.procs")
    (d / "cgroup.subtree_control").mkdir()  # writing it fails, as EBUSY would
    with caplog.at_level(logging.WARNING, logger="dtlaunch.agent.limits"):
        enforcer = detect(tmp_path, "0::/agent.scope")
    assert (d / "cgroup.procs").read_text() == str(PID)  # moved back
    assert (enforcer.support.memory, enforcer.support.cpu) == ("rlimit", "affinity")
    detail = enforcer.support.detail
    assert "cannot move the agent into a leaf" in detail and FIX in detail
    assert "\n" not in detail


def test_v2_without_memory_and_cpu_falls_to_v1_like_this_hosts_hybrid(tmp_path):
    root = tmp_path / "cg"
    write(root / "unified" / "cgroup.controllers", "hugetlb\n")
    mem, cpu = v1_tree(root)
    enforcer = detect(tmp_path, *V1_LINES, "0::/")
    assert (enforcer.support.memory, enforcer.support.cpu) == ("cgroup-v1", "cgroup-v1")
    assert str(mem) in enforcer.support.detail and str(cpu) in enforcer.support.detail


# ---------------------------------------------------------------- fake trees: cgroup v1


def test_v1_memory_and_cpu_cpuacct_mounts_get_their_limits(tmp_path):
    mem, cpu = v1_tree(tmp_path / "cg")
    enforcer = detect(tmp_path, "9:name=systemd:/", *V1_LINES)
    assert (enforcer.support.memory, enforcer.support.cpu) == ("cgroup-v1", "cgroup-v1")
    cage = enforcer.cage("worker-1-a2", Limits(memory_bytes=64 * MiB, cpus=0.2))
    assert cage.backend == "memory cgroup-v1, cpu cgroup-v1"
    m, c = mem / f"dtlaunch-{PID}-worker-1-a2", cpu / f"dtlaunch-{PID}-worker-1-a2"
    assert (m / "memory.limit_in_bytes").read_text() == str(64 * MiB)
    assert (m / "memory.memsw.limit_in_bytes").read_text() == str(64 * MiB)
    assert (c / "cpu.cfs_period_us").read_text() == "100000"
    assert (c / "cpu.cfs_quota_us").read_text() == "20000"
    cage.enter()
    cage.after_fork()
    assert (m / "cgroup.procs").read_text() == "0"
    assert (c / "cgroup.procs").read_text() == "0"
    write(m / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert cage.oom_kills() == 1


def test_v1_cpu_hierarchy_mounted_under_its_plain_name_is_found(tmp_path):
    write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "-1\n")  # no "cpu,cpuacct" dir
    enforcer = detect(tmp_path, "3:cpu,cpuacct:/")
    assert enforcer.support.cpu == "cgroup-v1"
    assert str(tmp_path / "cg" / "cpu") in enforcer.support.detail


def test_a_stale_empty_cgroup_of_the_same_name_is_replaced(tmp_path):
    mem, _ = v1_tree(tmp_path / "cg")
    (mem / f"dtlaunch-{PID}-w").mkdir()  # a dead agent that had our pid left it
    cage = detect(tmp_path, *V1_LINES).cage("w", Limits(memory_bytes=MiB))
    cage.after_fork()
    assert (mem / f"dtlaunch-{PID}-w" / "memory.limit_in_bytes").read_text() == str(MiB)


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("unwritable", "is not writable by uid"),
        ("no-limit-file", "has no memory.limit_in_bytes"),
        ("no-hierarchy", "no cgroup v1 memory hierarchy"),
    ],
)
def test_v1_memory_unusable_falls_back_to_rlimit_and_says_why(
    tmp_path, monkeypatch, breakage, reason
):
    mem, _ = v1_tree(tmp_path / "cg")
    lines = V1_LINES
    if breakage == "unwritable":  # root may write anything; os.access is what detect asks
        real_access = os.access
        monkeypatch.setattr(
            limits_mod.os, "access", lambda p, mode: Path(p) != mem and real_access(p, mode)
        )
    elif breakage == "no-limit-file":
        (mem / "memory.limit_in_bytes").unlink()
    else:
        lines = V1_LINES[1:]
    enforcer = detect(tmp_path, *lines)
    assert (enforcer.support.memory, enforcer.support.cpu) == ("rlimit", "cgroup-v1")
    assert reason in enforcer.support.detail and FIX in enforcer.support.detail
    cage = enforcer.cage("w", Limits(memory_bytes=64 * MiB))
    assert cage.backend == "memory rlimit"
    assert not list(mem.glob("dtlaunch-*"))


# ---------------------------------------------------------------- fake trees: the rest


def test_prefer_rlimit_skips_usable_cgroups(tmp_path):
    mem, cpu = v1_tree(tmp_path / "cg")
    enforcer = detect(tmp_path, *V1_LINES, prefer="rlimit")
    assert (enforcer.support.memory, enforcer.support.cpu) == ("rlimit", "affinity")
    assert "--limits-via rlimit" in enforcer.support.detail
    cage = enforcer.cage("w", Limits(memory_bytes=64 * MiB, cpus=1))
    assert cage.backend == "memory rlimit, cpu affinity"
    assert cage.oom_kills() is None
    assert not list(mem.glob("dtlaunch-*")) and not list(cpu.glob("dtlaunch-*"))
    with pytest.raises(ConfigError, match="--limits-via 'cgroup'"):
        detect(tmp_path, *V1_LINES, prefer="cgroup")


def test_no_limits_make_a_cage_that_does_nothing(tmp_path):
    mem, _ = v1_tree(tmp_path / "cg")
    assert not Limits() and Limits(cpus=0.5) and Limits(memory_bytes=1)
    with pytest.raises(ValueError, match=">= 0"):
        Limits(cpus=-1)
    affinity = os.sched_getaffinity(0)
    cage = detect(tmp_path, *V1_LINES).cage("w", Limits())
    assert cage.backend == "none" and cage.oom_kills() is None
    cage.enter()  # in this very process: must change nothing
    cage.after_fork()
    cage.remove()
    assert not list(mem.glob("dtlaunch-*"))
    assert os.sched_getaffinity(0) == affinity


def test_a_cgroup_still_busy_at_remove_is_removed_before_the_next_cage(tmp_path, caplog):
    mem, _ = v1_tree(tmp_path / "cg")
    enforcer = detect(tmp_path, *V1_LINES)
    cage = enforcer.cage("w", Limits(memory_bytes=MiB))
    busy = mem / f"dtlaunch-{PID}-w"
    # A plain directory with files cannot be rmdir'ed, as a busy cgroup cannot.
    with caplog.at_level(logging.INFO, logger="dtlaunch.agent.limits"):
        cage.remove()
        cage.remove()  # idempotent: nothing left to try
    notes = [r for r in caplog.records if "cannot remove cgroup" in r.getMessage()]
    assert len(notes) == 1 and str(busy) in notes[0].getMessage()
    assert cage.left_behind == [busy]
    enforcer.forget(cage)
    for leftover in busy.iterdir():  # its last grandchild is gone: the cgroup empties
        leftover.unlink()
    enforcer.cage("w2", Limits())  # the next cage retries what was left behind
    assert not busy.exists()


def test_sweep_stale_removes_empty_cgroups_of_dead_agents_only(tmp_path):
    mem, _ = v1_tree(tmp_path / "cg")
    dead = dead_pid()
    gone = [mem / f"dtlaunch-{dead}-worker-0-a1", mem / f"dtlaunch-agent-{dead}"]
    gone.append(mem / f"dtlaunch-{PID}-w")  # a dead predecessor with our pid
    kept = [mem / "dtlaunch-1-worker-0-a1", mem / "other-empty", mem / "dtlaunch-x"]
    for d in gone + kept:
        d.mkdir()
    busy = write(mem / f"dtlaunch-{dead}-busy" / "cgroup.procs", "4242\n").parent
    enforcer = detect(tmp_path, *V1_LINES)
    assert enforcer.sweep_stale() == 3
    assert not any(d.exists() for d in gone)
    assert all(d.is_dir() for d in [*kept, busy])
    assert enforcer.sweep_stale() == 0


# ---------------------------------------------------------------- real processes


class Lab:
    """Cages and children of one test, all cleaned up in ``close`` even after a failure."""

    def __init__(self, enforcer: LimitEnforcer) -> None:
        self.enforcer = enforcer
        self.cages: list[Cage] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dirs: list[Path] = []  # cgroups made by hand, or expected gone

    def cage(self, name: str, limits: Limits) -> Cage:
        self.dirs += cage_dirs(self.enforcer, name).values()
        cage = self.enforcer.cage(name, limits)
        self.cages.append(cage)
        return cage

    def run(self, cage: Cage, code: str) -> tuple[int, str, str]:
        try:
            proc = subprocess.Popen(
                [PY, "-c", code],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=cage.enter,
            )
        finally:
            cage.after_fork()
        self.procs.append(proc)
        out, err = proc.communicate(timeout=60)
        return proc.returncode, out.decode(), err.decode()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        for cage in self.cages:
            cage.remove()
        for d in self.dirs:
            if d.is_dir():
                d.rmdir()


def cage_dirs(enforcer: LimitEnforcer, name: str) -> dict[str, Path]:
    """Where the cgroups of cage ``name`` must be, worked out from /proc/self/cgroup."""
    leaf = f"dtlaunch-{PID}-{name}"
    lines = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    dirs = {}
    for resource, kind in (("memory", enforcer.support.memory), ("cpu", enforcer.support.cpu)):
        if kind == "cgroup-v1":
            ctrls, rel = next((c, p) for _, c, p in lines if resource in c.split(","))
            mount = next(m for m in (CGROUP_ROOT / ctrls, CGROUP_ROOT / resource) if m.is_dir())
            dirs[resource] = mount / rel.lstrip("/") / leaf
        elif kind == "cgroup-v2":
            rel = next(p for _, c, p in lines if not c)
            unified = (CGROUP_ROOT / "cgroup.controllers").exists()
            d = (CGROUP_ROOT if unified else CGROUP_ROOT / "unified") / rel.lstrip("/")
            dirs[resource] = (d.parent if d.name == f"dtlaunch-agent-{PID}" else d) / leaf
    return dirs


@pytest.fixture(scope="module")
def real():
    enforcer = LimitEnforcer.detect()
    if not enforcer.support.memory.startswith("cgroup"):
        pytest.skip(f"no memory cgroup the agent can write here: {enforcer.support.detail}")
    return enforcer


@pytest.fixture
def lab(real):
    lab = Lab(real)
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def fallback_lab():
    lab = Lab(LimitEnforcer.detect(prefer="rlimit"))
    try:
        yield lab
    finally:
        lab.close()


def test_a_child_over_its_cgroup_memory_limit_is_oom_killed(lab):
    cage = lab.cage("hog", Limits(memory_bytes=64 * MiB))
    memory_dir = cage_dirs(lab.enforcer, "hog")["memory"]
    assert memory_dir.is_dir()
    rc, out, err = lab.run(cage, "b = b'x' * (200 * 2**20)\nprint('survived')")
    assert rc == -signal.SIGKILL, (rc, err)
    assert "survived" not in out
    assert cage.oom_kills() == 1
    cage.remove()
    assert not memory_dir.exists()


def test_a_child_within_its_cgroup_memory_limit_runs_inside_the_cage(lab):
    cage = lab.cage("small", Limits(memory_bytes=64 * MiB))
    code = "b = b'x' * 2**20\nprint(open('/proc/self/cgroup').read())"
    rc, out, err = lab.run(cage, code)
    assert rc == 0, err
    assert f"dtlaunch-{PID}-small" in out
    assert cage.oom_kills() == 0


def test_a_busy_child_gets_its_cgroup_cpu_share(lab):
    if not lab.enforcer.support.cpu.startswith("cgroup"):
        pytest.skip(f"no cpu cgroup the agent can write here: {lab.enforcer.support.detail}")
    cage = lab.cage("busy", Limits(cpus=0.2))
    code = (
        "import time\n"
        "w0, c0 = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - w0 < 1.5:\n"
        "    pass\n"
        "print(time.process_time() - c0, time.monotonic() - w0)"
    )
    rc, out, err = lab.run(cage, code)
    assert rc == 0, err
    cpu_s, wall_s = map(float, out.split())
    assert cpu_s / wall_s < 0.35, (cpu_s, wall_s)  # unconfined: ~1 (~0.5 on a loaded host)
    stat = (cage_dirs(lab.enforcer, "busy")["cpu"] / "cpu.stat").read_text().split()
    assert int(stat[stat.index("nr_throttled") + 1]) > 0


def test_the_share_of_throttled_periods_tells_a_child_held_by_its_quota(lab):
    """What the agent reports as ``cpu_throttled``: a busy child at 0.2 core is
    stopped by its quota in nearly every period it runs; one within its quota
    never is. (A whole core for that one: a single thread cannot use more than
    a period's worth in a period, while Python's start alone uses more than
    the 20 ms a period of 0.2 core allows.)"""
    if not lab.enforcer.support.cpu.startswith("cgroup"):
        pytest.skip(f"no cpu cgroup the agent can write here: {lab.enforcer.support.detail}")
    busy, idle = lab.cage("hot", Limits(cpus=0.2)), lab.cage("cool", Limits(cpus=1.0))
    assert busy.throttled_share() == idle.throttled_share() == 0.0  # the baseline
    spin = "import time\nw0 = time.monotonic()\nwhile time.monotonic() - w0 < 1.0:\n    pass\n"
    assert lab.run(busy, spin)[0] == 0
    assert lab.run(idle, "import time\ntime.sleep(0.5)\n")[0] == 0
    assert busy.throttled_share() > 0.5
    assert idle.throttled_share() == 0.0
    assert busy.throttled_share() == 0.0  # nothing ran since the last reading


def test_throttling_counts_are_read_from_v1_and_v2_cpu_stat(tmp_path):
    v2 = tmp_path / "v2.stat"
    v2.write_text("usage_usec 9\nnr_periods 40\nnr_throttled 10\nthrottled_usec 77\n")
    v1 = tmp_path / "v1.stat"
    v1.write_text("nr_periods 5\nnr_throttled 0\nthrottled_time 0\n")
    assert read_throttling(v2) == (40, 10) and read_throttling(v1) == (5, 0)
    (tmp_path / "bare.stat").write_text("usage_usec 9\n")  # no CPU limit ever set
    assert read_throttling(tmp_path / "bare.stat") is None
    assert read_throttling(tmp_path / "missing.stat") is None


def test_a_limit_the_kernel_refuses_names_the_file_and_leaves_no_cgroup(lab):
    if not lab.enforcer.support.cpu.startswith("cgroup"):
        pytest.skip(f"no cpu cgroup the agent can write here: {lab.enforcer.support.detail}")
    dirs = cage_dirs(lab.enforcer, "tiny")
    lab.dirs += dirs.values()
    with pytest.raises(LaunchError, match=r"cpu\.(cfs_quota_us|max)") as raised:
        lab.enforcer.cage("tiny", Limits(memory_bytes=64 * MiB, cpus=0.001))  # 100 µs < 1 ms
    assert "give a larger CPU limit" in str(raised.value)
    assert not any(d.exists() for d in dirs.values())  # the memory cgroup made first too


def test_sweep_stale_on_real_cgroups_leaves_a_busy_one(lab):
    parent = cage_dirs(lab.enforcer, "x")["memory"].parent
    dead = dead_pid()
    stale, busy = parent / f"dtlaunch-{dead}-stale", parent / f"dtlaunch-{dead}-busy"
    lab.dirs += [stale, busy]
    stale.mkdir()
    busy.mkdir()
    sleeper = subprocess.Popen([PY, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    lab.procs.append(sleeper)
    (busy / "cgroup.procs").write_text(str(sleeper.pid))
    lab.cage("mine", Limits(memory_bytes=64 * MiB))  # made, its child not started yet
    assert lab.enforcer.sweep_stale() >= 1
    assert not stale.exists()
    assert busy.is_dir()
    assert cage_dirs(lab.enforcer, "mine")["memory"].is_dir()


def test_rlimit_fallback_makes_a_big_allocation_raise_memory_error(fallback_lab):
    cage = fallback_lab.cage("as", Limits(memory_bytes=256 * MiB))
    assert cage.backend == "memory rlimit"
    rc, out, err = fallback_lab.run(cage, "b = b'x' * (512 * 2**20)\nprint('survived')")
    assert rc == 1, err
    assert "MemoryError" in err and "survived" not in out


def test_affinity_fallback_pins_ceil_cpus_round_robin(fallback_lab):
    allowed = os.sched_getaffinity(0)
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    sets = []
    for i, cpus in enumerate((0.5, 1.0, 1.5)):
        rc, out, err = fallback_lab.run(fallback_lab.cage(f"c{i}", Limits(cpus=cpus)), code)
        assert rc == 0, err
        sets.append(set(json.loads(out)))
    assert [len(s) for s in sets] == [min(math.ceil(c), len(allowed)) for c in (0.5, 1.0, 1.5)]
    assert all(s <= allowed for s in sets)
    if len(allowed) >= 2:
        assert sets[0] != sets[1]  # two 1-CPU children do not share a CPU
    assert os.sched_getaffinity(0) == allowed  # the agent itself is not pinned


# ------------------------------------- dtlaunch check's probe: the same answer, lightly


def _v2_root_tree(root: Path) -> tuple[str, ...]:
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root / "cgroup.subtree_control")
    return ("0::/",)


def _hybrid_tree(root: Path) -> tuple[str, ...]:
    d = root / "user.slice" / "agent.scope"
    write(root / "cgroup.controllers", "memory cpu io\n")
    write(d / "cgroup.type", "domain\n")
    write(d / "cgroup.controllers", "io memory\n")
    write(d / "cgroup.subtree_control")
    write(root / "cpu" / "cpu.cfs_quota_us", "-1\n")
    return ("1:cpu:/", "0::/user.slice/agent.scope")


def _v1_tree(root: Path) -> tuple[str, ...]:
    v1_tree(root)
    return V1_LINES


def _nothing(root: Path) -> tuple[str, ...]:
    root.mkdir(parents=True)
    return ("0::/elsewhere",)


@pytest.mark.parametrize("tree", [_v2_root_tree, _hybrid_tree, _v1_tree, _nothing])
def test_check_probe_finds_what_the_agent_would_use_without_changing_anything(tmp_path, tree):
    lines = tree(tmp_path / "cg")
    before = sorted((p, p.read_text() if p.is_file() else "") for p in tmp_path.rglob("*"))
    proc = write(tmp_path / "proc-self-cgroup", "".join(f"{line}\n" for line in lines))
    found = support_without_changes(str(tmp_path / "cg"), str(proc))
    after = sorted((p, p.read_text() if p.is_file() else "") for p in tmp_path.rglob("*"))
    assert before == [item for item in after if item[0] != proc]  # nothing made or written
    dry = detect(tmp_path, *lines, dry_run=True).support
    assert found == (dry.memory, dry.cpu, dry.detail)


def test_check_probe_imports_only_os():
    # Each host of a `dtlaunch check` pays the probe's imports: logging, typing,
    # pathlib, dataclasses and re were a third of a host's CPU on 256 loopback hosts.
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from dtlaunch.agent.cgroupfind import support_without_changes\n"
        "support_without_changes()\n"
        "heavy = {'logging', 'typing', 'pathlib', 'dataclasses', 're', 'json', 'asyncio'}\n"
        "print(sorted(heavy & (set(sys.modules) - before)))\n"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
