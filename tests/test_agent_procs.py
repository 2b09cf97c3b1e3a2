"""ProcessGroupRunner and friends against real child processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from dtlaunch.agent.oom import OomWatcher, find_oom_counter_file, read_oom_kill_count
from dtlaunch.agent.output import CHUNK_BYTES, LineTail, split_chunk
from dtlaunch.agent.procs import ProcessGroupRunner, SpawnSpec
from dtlaunch.agent.proctable import ChildRecord, kill_stale_groups, read_table, write_table
from dtlaunch.errors import LaunchError

PY = sys.executable


class Recorder:
    def __init__(self):
        self.outputs: list[tuple[str, str, bytes]] = []
        self.exits = {}
        self.started_ids = []

    async def started(self, child):
        self.started_ids.append(child.proc_id)

    async def output(self, child, stream, data):
        self.outputs.append((child.proc_id, stream, data))

    async def exited(self, child, info):
        self.exits[child.proc_id] = info

    def text(self, proc_id, stream):
        return b"".join(d for p, s, d in self.outputs if p == proc_id and s == stream)


def spec(code, proc_id="worker-0", attempt=0, cwd="/", env=None):
    return SpawnSpec(
        proc_id=proc_id,
        role=proc_id.split("-")[0],
        rank=int(proc_id.split("-")[1]),
        attempt=attempt,
        argv=[PY, "-c", textwrap.dedent(code)],
        env=env or {},
        cwd=str(cwd),
    )


async def until(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_dead(pid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.02)


def runner(tmp_path, rec, **kw):
    return ProcessGroupRunner(table_path=tmp_path / "procs.json", sink=rec, **kw)


def test_output_exit_code_env_and_stderr_tail(tmp_path):
    rec = Recorder()

    async def main():
        async with runner(tmp_path, rec, extra_env={"DTLAUNCH_KEYS": "/k"}) as r:
            child = r.spawn(
                spec(
                    """
                    import os, sys, signal
                    print("hello", os.environ["MYVAR"], os.environ["DTLAUNCH_KEYS"])
                    print("sighup", signal.getsignal(signal.SIGHUP) == signal.SIG_DFL)
                    print("pgid", os.getpgid(0) == os.getpid())
                    for i in range(60):
                        print("err", i, file=sys.stderr)
                    sys.exit(3)
                    """,
                    env={"MYVAR": "x1"},
                    cwd=tmp_path,
                )
            )
            table = read_table(tmp_path / "procs.json")
            assert [(t.proc_id, t.pid) for t in table] == [("worker-0", child.pid)]
            assert table[0].create_time == psutil.Process(child.pid).create_time()
            await asyncio.wait_for(child.done.wait(), 10)
            assert r.children() == []

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        asyncio.run(main())
    finally:
        signal.signal(signal.SIGHUP, old)
    info = rec.exits["worker-0"]
    assert (info.exit_code, info.signal, info.requested, info.oom_killed) == (3, None, False, False)
    out = rec.text("worker-0", "stdout").decode()
    assert "hello x1 /k" in out
    assert "sighup True" in out
    assert "pgid True" in out
    assert info.stderr_tail == [f"err {i}" for i in range(20, 60)]
    assert rec.started_ids == ["worker-0"]
    assert read_table(tmp_path / "procs.json") == []


def test_killed_by_signal_reports_signal(tmp_path):
    rec = Recorder()

    async def main():
        async with runner(tmp_path, rec) as r:
            child = r.spawn(spec("import time; print('up', flush=True); time.sleep(60)"))
            await until(lambda: rec.text("worker-0", "stdout") == b"up\n")
            os.kill(child.pid, signal.SIGKILL)
            await asyncio.wait_for(child.done.wait(), 5)

    asyncio.run(main())
    info = rec.exits["worker-0"]
    assert (info.exit_code, info.signal, info.requested) == (None, signal.SIGKILL, False)


def test_kill_takes_whole_group_and_escalates(tmp_path):
    rec = Recorder()
    pidfile = tmp_path / "grandchild.pid"

    async def main():
        async with runner(tmp_path, rec) as r:
            child = r.spawn(
                spec(
                    f"""
                    import signal, subprocess, sys, time
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                    open({str(pidfile)!r}, "w").write(str(g.pid))
                    print("ready", flush=True)
                    time.sleep(60)
                    """
                )
            )
            await until(lambda: b"ready" in rec.text("worker-0", "stdout"))
            assert not r.kill("worker-0", attempt=1, grace_s=0.2)  # wrong attempt: ignored
            await asyncio.sleep(0.2)
            assert alive(child.pid)
            assert r.kill("worker-0", attempt=0, grace_s=0.3)
            await asyncio.wait_for(child.done.wait(), 5)

    asyncio.run(main())
    info = rec.exits["worker-0"]
    # SIGTERM was ignored by the leader, so it took the SIGKILL after the grace.
    assert (info.signal, info.requested, info.oom_killed) == (signal.SIGKILL, True, False)
    wait_dead(int(pidfile.read_text()))


def test_grandchildren_die_when_leader_exits(tmp_path):
    rec = Recorder()
    pidfile = tmp_path / "grandchild.pid"

    async def main():
        async with runner(tmp_path, rec) as r:
            child = r.spawn(
                spec(
                    f"""
                    import subprocess, sys
                    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                    open({str(pidfile)!r}, "w").write(str(g.pid))
                    """
                )
            )
            await asyncio.wait_for(child.done.wait(), 10)

    asyncio.run(main())
    assert rec.exits["worker-0"].exit_code == 0
    wait_dead(int(pidfile.read_text()))


def test_sigstopped_child_is_reported_stopped_and_sigterm_stops_it(tmp_path):
    rec = Recorder()

    async def main():
        async with runner(tmp_path, rec) as r:
            child = r.spawn(
                spec(
                    """
                    import subprocess, sys, time
                    g = subprocess.Popen([sys.executable, "-c", "x = bytearray(30_000_000); "
                                          "import time; time.sleep(60)"])
                    print("ready", flush=True)
                    time.sleep(60)
                    """
                )
            )
            await until(lambda: b"ready" in rec.text("worker-0", "stdout"))
            await asyncio.sleep(0.5)
            report = r.reports()[0]
            assert (report.proc_id, report.role, report.rank, report.pid) == (
                "worker-0",
                "worker",
                0,
                child.pid,
            )
            assert report.state == "running"
            assert report.rss_bytes > 30_000_000  # grandchild's memory is counted
            os.kill(child.pid, signal.SIGSTOP)
            await until(lambda: r.reports()[0].state == "stopped")
            # SIGTERM to a stopped process stays pending, so the grace runs out -> SIGKILL.
            await r.stop(child, grace_s=0.3)

    asyncio.run(main())
    assert rec.exits["worker-0"].signal == signal.SIGKILL


def test_spawn_failures_are_clear(tmp_path):
    rec = Recorder()

    async def main():
        async with runner(tmp_path, rec) as r:
            with pytest.raises(LaunchError, match=r"working directory .* does not exist"):
                r.spawn(spec("pass", cwd=tmp_path / "nope"))
            bad = SpawnSpec(
                proc_id="worker-1",
                role="worker",
                rank=1,
                attempt=0,
                argv=["no-such-program-dtl"],
                env={},
                cwd="/",
            )
            with pytest.raises(LaunchError, match="'no-such-program-dtl' not found on PATH"):
                r.spawn(bad)
            with pytest.raises(LaunchError, match="not found on this host"):
                r.spawn(
                    SpawnSpec(
                        proc_id="worker-1",
                        role="worker",
                        rank=1,
                        attempt=0,
                        argv=["/no/such/python"],
                        env={},
                        cwd="/",
                    )
                )
            child = r.spawn(spec("import time; time.sleep(60)"))
            with pytest.raises(LaunchError, match="already running"):
                r.spawn(spec("pass", attempt=1))
            await r.stop(child, grace_s=2)
        # Leaving the runner with nothing running is fine; a failed spawn leaves no record.
        assert r.children() == []

    asyncio.run(main())
    assert rec.exits["worker-0"].signal == signal.SIGTERM
    assert rec.exits["worker-0"].requested


def test_leaving_runner_stops_children(tmp_path):
    rec = Recorder()

    async def main():
        async with runner(tmp_path, rec, shutdown_grace_s=1.0) as r:
            a = r.spawn(spec("import time; time.sleep(60)", proc_id="worker-0"))
            b = r.spawn(spec("import time; time.sleep(60)", proc_id="server-0"))
        return a.pid, b.pid

    pids = asyncio.run(main())
    assert set(rec.exits) == {"worker-0", "server-0"}
    assert all(i.requested and i.signal == signal.SIGTERM for i in rec.exits.values())
    for pid in pids:
        wait_dead(pid)


def test_output_chunks_and_partial_line_flush(tmp_path):
    rec = Recorder()

    async def main():
        async with runner(tmp_path, rec) as r:
            child = r.spawn(
                spec(
                    """
                    import sys, time
                    sys.stdout.write("x" * 100000 + "\\n" + "line\\n" * 10000)
                    sys.stdout.flush()
                    sys.stderr.write("prompt> ")
                    sys.stderr.flush()
                    time.sleep(60)
                    """
                )
            )
            # The partial line goes out while the child still runs.
            await until(lambda: rec.text("worker-0", "stderr") == b"prompt> ", timeout=3)
            await r.stop(child, grace_s=2)

    asyncio.run(main())
    chunks = [d for p, s, d in rec.outputs if s == "stdout"]
    assert b"".join(chunks) == b"x" * 100000 + b"\n" + b"line\n" * 10000
    assert all(len(c) <= CHUNK_BYTES for c in chunks)
    assert all(c.endswith(b"\n") for c in chunks if not c.startswith(b"x"))
    assert rec.exits["worker-0"].stderr_tail == ["prompt> "]


def test_split_chunk_and_line_tail():
    buf = bytearray(b"a\nbc")
    assert split_chunk(buf, final=False) == b"a\n"
    assert split_chunk(buf, final=False) is None
    assert split_chunk(buf, final=True) == b"bc"
    buf = bytearray(b"y" * (CHUNK_BYTES + 5))
    assert split_chunk(buf, final=False) == b"y" * CHUNK_BYTES
    tail = LineTail(max_lines=2)
    tail.feed(b"one\ntw")
    tail.feed(b"o\r\nthree\nfo")
    assert tail.lines() == ["three", "fo"]
    tail.feed(b"\n" + b"z" * 5000 + b"\n")
    assert tail.lines() == ["fo", "z" * 2000]


def test_oom_counter_parsing(tmp_path):
    (tmp_path / "proc").write_text("4:memory:/grp\n0::/v2grp\n")
    (tmp_path / "memory" / "grp").mkdir(parents=True)
    oc = tmp_path / "memory" / "grp" / "memory.oom_control"
    oc.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert find_oom_counter_file(tmp_path / "proc", tmp_path) == oc
    (tmp_path / "v2grp").mkdir()
    ev = tmp_path / "v2grp" / "memory.events"
    ev.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert find_oom_counter_file(tmp_path / "proc", tmp_path) == ev
    assert read_oom_kill_count(ev) == 1
    watcher = OomWatcher(ev)
    assert not watcher.claim_oom_kill()
    ev.write_text("oom_kill 3\n")
    assert watcher.claim_oom_kill()
    assert watcher.claim_oom_kill()
    assert not watcher.claim_oom_kill()
    assert not OomWatcher(None).claim_oom_kill()


# --------------------------------------------------- pdeathsig and stale cleanup

HOST_SCRIPT = """
import asyncio, sys
from pathlib import Path
from dtlaunch.agent.procs import ProcessGroupRunner, SpawnSpec

class Sink:
    async def started(self, child): pass
    async def output(self, child, stream, data): pass
    async def exited(self, child, info): pass

async def main():
    async with ProcessGroupRunner(table_path=Path(sys.argv[1]), sink=Sink()) as r:
        r.spawn(SpawnSpec(proc_id="worker-0", role="worker", rank=0, attempt=0,
                          argv=[sys.executable, "-c", sys.argv[2]], env={}, cwd="/"))
        await asyncio.sleep(60)

asyncio.run(main())
"""

GROUP_SCRIPT = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(g.pid, flush=True)
time.sleep(60)
"""


def start_host(tmp_path):
    """A process running a ProcessGroupRunner whose child has a grandchild."""
    table = tmp_path / "procs.json"
    host = subprocess.Popen([PY, "-c", HOST_SCRIPT, str(table), GROUP_SCRIPT])
    try:
        deadline = time.monotonic() + 10
        while not read_table(table):
            assert host.poll() is None, "host died"
            assert time.monotonic() < deadline, "host did not spawn its child"
            time.sleep(0.02)
        rec = read_table(table)[0]
        grandchild = None
        while grandchild is None:
            assert time.monotonic() < deadline, "no grandchild"
            kids = psutil.Process(rec.pid).children()
            grandchild = kids[0].pid if kids else None
            time.sleep(0.02)
    except BaseException:
        host.terminate()
        host.wait()
        raise
    return host, table, rec, grandchild


def test_pdeathsig_and_stale_cleanup_after_sigkill(tmp_path):
    host, table, rec, grandchild = start_host(tmp_path)
    try:
        host.kill()
        host.wait()
        wait_dead(rec.pid)  # the leader went with PR_SET_PDEATHSIG
        assert alive(grandchild)  # ... but its child lives on in the old group
        assert os.getpgid(grandchild) == rec.pgid
        # Either the (zombie, not yet reaped) leader stands for its group, or the
        # leaderless group's member is killed on its own.
        assert kill_stale_groups(table) in ([rec.pid], [grandchild])
        wait_dead(grandchild)
        assert read_table(table) == []
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_stale_cleanup_never_touches_a_different_process(tmp_path):
    table = tmp_path / "procs.json"
    # A live group leader whose create_time does not match the record: a reused pid.
    other = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    # A live group member that does not carry the recorded spawn token.
    member = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        ct = psutil.Process(other.pid).create_time()
        write_table(
            table,
            [
                ChildRecord(
                    proc_id="worker-0",
                    attempt=0,
                    pid=other.pid,
                    pgid=other.pid,
                    create_time=ct - 5.0,
                    token="t0",
                ),
                # leader pid that is gone, group id = member's group
                ChildRecord(
                    proc_id="worker-1",
                    attempt=0,
                    pid=2**22 + 7,
                    pgid=member.pid,
                    create_time=ct - 5.0,
                    token="t1",
                ),
            ],
        )
        assert kill_stale_groups(table) == []
        time.sleep(0.2)
        assert other.poll() is None and member.poll() is None
        assert json.loads(table.read_text()) == {"procs": []}
    finally:
        for p in (other, member):
            p.kill()
            p.wait()
