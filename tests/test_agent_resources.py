"""The agent's process-tree sampling: ``ChildrenFiles`` finds a tree's members
from the kernel's children lists, ``ParentTable`` (where there are none) from one
``/proc`` listing, reading only the new pids' parents; both agree with psutil's
own walk on real process trees."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from dtlaunch.agent import resources
from dtlaunch.agent.resources import (
    FULL_REREAD_S,
    ChildrenFiles,
    ParentTable,
    TreeSampler,
    tree_finder,
)

# A leader whose child starts a grandchild; every process sleeps until killed.
TREE = """\
import subprocess, sys, time
if len(sys.argv) < 2:
    subprocess.Popen([sys.executable, __file__, "child"])
elif sys.argv[1] == "child":
    subprocess.Popen([sys.executable, __file__, "grandchild"])
time.sleep(120)
"""


def start_tree(tmp_path) -> subprocess.Popen[bytes]:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    return subprocess.Popen([sys.executable, str(script)], start_new_session=True)


def wait_for_descendants(leader: psutil.Process, count: int) -> list[int]:
    deadline = time.monotonic() + 30
    while len(found := leader.children(recursive=True)) < count:
        assert time.monotonic() < deadline, f"the tree never had {count} descendants"
        time.sleep(0.05)
    return sorted(p.pid for p in found)


def wait_until(done, what: str) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, f"waited 30 s for {what}"
        time.sleep(0.01)


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, 9)
    proc.wait(timeout=30)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("finder", [ChildrenFiles, ParentTable])
def test_descendants_match_psutil_on_a_real_tree(tmp_path, finder):
    proc = start_tree(tmp_path)
    try:
        expected = wait_for_descendants(psutil.Process(proc.pid), 2)
        table = finder()
        assert table.usable
        table.refresh()
        assert sorted(table.descendants(proc.pid)) == expected
        # Parents come before their children.
        found = table.descendants(proc.pid)
        child = psutil.Process(proc.pid).children()[0].pid
        assert found.index(child) < found.index(next(p for p in found if p != child))
        assert table.descendants(expected[-1] + 10_000_000) == []
    finally:
        stop(proc)


def test_a_refresh_reads_only_the_new_pids(tmp_path, monkeypatch):
    clock = FakeClock()
    table = ParentTable(clock=clock)
    reads: list[int] = []
    real = resources._read_ppid
    monkeypatch.setattr(resources, "_read_ppid", lambda pid: reads.append(pid) or real(pid))
    table.refresh()
    assert len(reads) > 1  # the first listing reads every pid
    reads.clear()
    clock.now += 1
    proc = start_tree(tmp_path)
    try:
        expected = wait_for_descendants(psutil.Process(proc.pid), 2)
        table.refresh()
        # The tree's three processes are new; a busy machine may have started a few
        # others meanwhile, but nothing seen before is read again.
        assert {proc.pid, *expected} <= set(reads)
        before = set(psutil.pids()) - {proc.pid, *expected}
        assert len(set(reads) & before) <= 5, "pids seen before were read again"
        assert sorted(table.descendants(proc.pid)) == expected
        # After FULL_REREAD_S every pid is read again (a reused pid gets its new parent).
        reads.clear()
        clock.now += FULL_REREAD_S
        table.refresh()
        assert len(reads) >= len(before)
    finally:
        stop(proc)
    # Gone pids are forgotten at the next listing.
    clock.now += 1
    table.refresh()
    assert table.descendants(proc.pid) == []


def test_a_command_name_with_spaces_and_parentheses(tmp_path):
    """``/proc/PID/stat`` quotes the name in parentheses that it does not escape."""
    odd = tmp_path / "a) b (c"
    os.symlink(shutil.which("sleep") or "/bin/sleep", odd)
    leader = subprocess.Popen(["/bin/sh", "-c", f"'{odd}' 120 & wait"], start_new_session=True)
    try:
        expected = wait_for_descendants(psutil.Process(leader.pid), 1)
        # Forked, the child is "sh" until it has exec'd the oddly named program.
        child = psutil.Process(expected[0])
        wait_until(lambda: child.name().startswith("a) b (c"), "the child to exec")
        table = ParentTable()
        table.refresh()
        assert sorted(table.descendants(leader.pid)) == expected
    finally:
        stop(leader)


@pytest.mark.parametrize("shared", [True, False], ids=["parent-table", "psutil-walk"])
def test_the_sampler_counts_the_whole_tree_either_way(tmp_path, shared):
    proc = start_tree(tmp_path)
    try:
        leader = psutil.Process(proc.pid)
        wait_for_descendants(leader, 2)
        tree = [leader, *leader.children(recursive=True)]
        # Every process has started and sleeps: their memory no longer moves.
        wait_until(lambda: all(p.status() == "sleeping" for p in tree), "the tree to sleep")
        table = ParentTable() if shared else None
        if table is not None:
            table.refresh()
        sample = TreeSampler(proc.pid, table).sample()
        each = [p.memory_info().rss for p in tree]
        assert sample.state == "running"
        # The child and the grandchild are counted, each once.
        assert abs(sample.rss_bytes - sum(each)) < 0.1 * sum(each), (sample, each)
    finally:
        stop(proc)


def test_the_agent_reads_the_kernels_children_lists_where_it_has_them(tmp_path, monkeypatch):
    # This machine's kernel lists children (CONFIG_PROC_CHILDREN): the agent's
    # heartbeat must not list /proc, whose size grows with everything on the host.
    assert os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    assert isinstance(tree_finder(), ChildrenFiles)
    proc = start_tree(tmp_path)
    try:
        expected = wait_for_descendants(psutil.Process(proc.pid), 2)
        listed: list[str] = []
        real_listdir = os.listdir

        def counting_listdir(path):
            listed.append(str(path))
            return real_listdir(path)

        finder = ChildrenFiles()
        monkeypatch.setattr(os, "listdir", counting_listdir)
        found = finder.descendants(proc.pid)
        monkeypatch.undo()
        assert sorted(found) == expected
        assert "/proc" not in listed and len(listed) == 3  # one task folder a member
    finally:
        stop(proc)
    assert ChildrenFiles().descendants(proc.pid) == []  # gone: nothing, no error
