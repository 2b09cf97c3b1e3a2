"""``python -m dtlaunch.agent`` as a real subprocess against a real CURVE Router."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import zmq.asyncio

import dtlaunch
from dtlaunch.agent.agent import FREE_PORTS
from dtlaunch.agent.oom import find_oom_counter_file
from dtlaunch.wire.codec import to_dict
from dtlaunch.wire.keys import create_run_keys, load_peer_keys
from dtlaunch.wire.messages import (
    Ack,
    AgentBootstrap,
    AgentHeartbeat,
    Bye,
    Exited,
    Hello,
    Kill,
    Output,
    Ping,
    Rehello,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    Welcome,
)
from dtlaunch.wire.sockets import Router
from tests.test_agent_procs import alive, wait_dead

pytestmark = pytest.mark.integration

PY = sys.executable
SLEEPER = "import time; print('up', flush=True); time.sleep(60)"
TIMING = dict(heartbeat_interval=0.2, dead_after=3, orphan_timeout=10.0, kill_grace=1.0)


class Harness:
    """A Router playing supervisor, plus the agents it started."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.keys = create_run_keys(tmp_path / "run-keys")
        self.state_dir = tmp_path / "state"
        self.agents: list[subprocess.Popen] = []
        self.seen: list = []
        self.ctx = self.router = None

    async def start_router(self, port=0):
        self.ctx = zmq.asyncio.Context()
        self.router = Router(self.ctx, self.keys, bind=f"tcp://127.0.0.1:{port}")
        await self.router.start()

    def stop_router(self):
        self.router.close()
        self.ctx.term()
        self.router = self.ctx = None

    async def __aenter__(self):
        await self.start_router()
        return self

    async def __aexit__(self, *exc):
        for agent in self.agents:
            if agent.poll() is None:
                agent.terminate()  # graceful: the agent stops its children
                try:
                    agent.wait(5)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
        if self.router is not None:
            self.stop_router()

    def boot(self, **over) -> AgentBootstrap:
        peer = self.keys.peer()
        fields = dict(
            run_id="run-1",
            host="hostA",
            endpoint=self.router.endpoint,
            server_public=peer.server_public.decode(),
            client_public=peer.client.public.decode(),
            client_secret=peer.client.secret.decode(),
            state_dir=str(self.state_dir),
            **TIMING,
        )
        fields.update(over)
        return AgentBootstrap(**fields)

    def start_agent(self, boot=None, line=None, stderr_gone=False) -> subprocess.Popen:
        if line is None:
            line = json.dumps(to_dict(boot or self.boot())) + "\n"
        # stderr_gone: like an SSH channel that closed, writes to stderr fail with EPIPE.
        log = subprocess.PIPE if stderr_gone else open(self.tmp / "agent.stderr", "ab")  # noqa: SIM115
        argv = [PY, "-m", "dtlaunch.agent"]
        agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
        (agent.stderr if stderr_gone else log).close()
        self.agents.append(agent)
        agent.stdin.write(line.encode())
        agent.stdin.close()  # the agent must not need stdin after the bootstrap
        return agent

    async def expect(self, cls, timeout=5.0, where=lambda m: True):
        """Receive until a ``cls`` message matching ``where``; return (peer, msg)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no {cls.__name__} within {timeout}s; seen {self.seen}")
            try:
                peer, msg = await asyncio.wait_for(self.router.recv(), remaining)
            except TimeoutError:
                continue
            self.seen.append(msg)
            if isinstance(msg, cls) and where(msg):
                return peer, msg

    def outputs(self, proc_id, stream="stdout"):
        return b"".join(
            m.data
            for m in self.seen
            if isinstance(m, Output) and m.proc_id == proc_id and m.stream == stream
        )


def spawn_msg(code, proc_id="worker-0", attempt=0, env=None, cwd="/", argv=None):
    role, rank = proc_id.split("-")
    argv = argv or [PY, "-c", textwrap.dedent(code)]
    env = env or {}
    return Spawn(
        proc_id=proc_id,
        role=role,
        rank=int(rank),
        attempt=attempt,
        argv=argv,
        env=env,
        cwd=str(cwd),
    )


EXIT_FIELDS = ("exit_code", "signal", "requested", "oom_killed")
REPORT_FIELDS = ("proc_id", "pid", "attempt", "state")


def fields(msg, *names):
    return tuple(getattr(msg, name) for name in names)


def test_hello_spawn_output_exited(tmp_path):
    async def main():
        async with Harness(tmp_path) as h:
            agent = h.start_agent()
            peer, hello = await h.expect(Hello)
            assert peer == b"agent:hostA"
            expected = ("agent", "run-1", "hostA", agent.pid, dtlaunch.__version__)
            assert fields(hello, "role", "run_id", "host", "pid", "version") == expected
            assert (hello.procs, hello.host_addr) == ([], "127.0.0.1")
            assert len(set(hello.free_ports)) == FREE_PORTS and all(p > 0 for p in hello.free_ports)
            await h.router.send(peer, Welcome(run_id="run-1", heartbeat_interval=0.2))
            code = """
                import os, sys
                from pathlib import Path
                from dtlaunch.wire.keys import load_peer_keys
                keys = load_peer_keys(Path(os.environ["DTLAUNCH_KEYS"]))
                print("keys", keys.client.public.decode(), os.environ["EXTRA"])
                print("boom", file=sys.stderr)
                sys.exit(3)
            """
            await h.router.send(peer, spawn_msg(code, env={"EXTRA": "e1"}, cwd=tmp_path))
            _, spawned = await h.expect(Spawned)
            _, exited = await h.expect(Exited)
            assert (spawned.proc_id, spawned.attempt) == ("worker-0", 0)
            assert exited.pid == spawned.pid
            assert fields(exited, *EXIT_FIELDS) == (3, None, False, False)
            assert exited.stderr_tail == ["boom"]
            public = h.keys.client.public.decode()
            assert h.outputs("worker-0") == f"keys {public} e1\n".encode()
            # Output and Spawned came before Exited.
            kinds = [type(m) for m in h.seen if not isinstance(m, AgentHeartbeat)]
            assert kinds.index(Spawned) < kinds.index(Output) < kinds.index(Exited)
            # Secrets: in a 0600 file, never in argv or environment.
            secret = h.keys.client.secret.decode()
            proc = psutil.Process(agent.pid)
            assert secret not in " ".join(proc.cmdline())
            assert all(secret not in v for v in proc.environ().values())
            assert load_peer_keys(h.state_dir / "keys") == h.keys.peer()
            assert (h.state_dir / "agent.log").read_text().count("exited: code 3") == 1

    asyncio.run(main())


def test_heartbeats_report_procs_and_kill(tmp_path):
    async def main():
        async with Harness(tmp_path) as h:
            h.start_agent()
            peer, _ = await h.expect(Hello)
            await h.router.send(peer, spawn_msg(SLEEPER, attempt=2))
            _, spawned = await h.expect(Spawned)

            def has(state):
                want = ("worker-0", spawned.pid, 2, state)
                return lambda m: want in [fields(p, *REPORT_FIELDS) for p in m.procs]

            _, hb = await h.expect(AgentHeartbeat, where=has("running"))
            assert hb.procs[0].rss_bytes > 0
            assert fields(hb.procs[0], "role", "rank") == ("worker", 0)
            os.kill(spawned.pid, signal.SIGSTOP)
            await h.expect(AgentHeartbeat, where=has("stopped"))
            os.kill(spawned.pid, signal.SIGCONT)
            await h.expect(AgentHeartbeat, where=has("running"))
            # A second Spawn of a running proc_id is refused.
            await h.router.send(peer, spawn_msg(SLEEPER, attempt=3))
            _, failed = await h.expect(SpawnFailed)
            assert "already running" in failed.error
            # A Kill for another attempt is ignored.
            await h.router.send(peer, Kill(proc_id="worker-0", attempt=1, grace_s=0.1))
            await asyncio.sleep(0.5)
            assert alive(spawned.pid)
            await h.router.send(peer, Kill(proc_id="worker-0", attempt=2, grace_s=2.0))
            _, exited = await h.expect(Exited)
            assert fields(exited, *EXIT_FIELDS) == (None, signal.SIGTERM, True, False)
            await h.expect(AgentHeartbeat, where=lambda m: m.procs == [])

    asyncio.run(main())


def test_spawn_failures_unexpected_messages_and_signals(tmp_path):
    async def main():
        async with Harness(tmp_path) as h:
            agent = h.start_agent()
            peer, _ = await h.expect(Hello)
            await h.router.send(peer, spawn_msg("pass", cwd=tmp_path / "missing"))
            _, failed = await h.expect(SpawnFailed)
            assert "hostA" in failed.error and "does not exist" in failed.error
            bad = spawn_msg("", proc_id="worker-1", argv=["dtl-no-such-exe"])
            await h.router.send(peer, bad)
            _, failed = await h.expect(SpawnFailed)
            assert "'dtl-no-such-exe' not found" in failed.error
            # Messages an agent does not expect are ignored; it stays up.
            await h.router.send(peer, Ack(ok=True))
            await h.router.send(peer, Hello(role="agent", run_id="x", host="y", pid=1, version="0"))
            seq = (await h.expect(AgentHeartbeat))[1].seq
            await h.expect(AgentHeartbeat, where=lambda m: m.seq > seq + 1)
            # Rehello brings a fresh Hello.
            await h.router.send(peer, Rehello())
            await h.expect(Hello)
            # SIGHUP (the SSH channel going away) does not stop the agent ...
            await h.router.send(peer, spawn_msg(SLEEPER))
            await h.expect(Output)
            agent.send_signal(signal.SIGHUP)
            await asyncio.sleep(0.3)
            assert agent.poll() is None
            # ... SIGTERM is a Shutdown.
            agent.terminate()
            _, exited = await h.expect(Exited)
            assert fields(exited, *EXIT_FIELDS) == (None, signal.SIGTERM, True, False)
            assert (await h.expect(Bye))[1].reason == "SIGTERM"
            assert await asyncio.to_thread(agent.wait, 5) == 0

    asyncio.run(main())


def test_shutdown_stops_everything_then_bye(tmp_path):
    async def main():
        async with Harness(tmp_path) as h:
            agent = h.start_agent()
            peer, _ = await h.expect(Hello)
            # worker-0 ignores SIGTERM: Shutdown's grace runs out and SIGKILL follows.
            stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEPER
            await h.router.send(peer, spawn_msg(stubborn, proc_id="worker-0"))
            await h.router.send(peer, spawn_msg(SLEEPER, proc_id="server-0"))
            # Both are up (their outputs may arrive in either order).
            await h.expect(Output, where=lambda m: h.outputs("worker-0") and h.outputs("server-0"))
            pids = [m.pid for m in h.seen if isinstance(m, Spawned)]
            await h.router.send(peer, Shutdown(grace_s=0.5, reason="job done"))
            _, bye = await h.expect(Bye)
            assert bye.reason == "shutdown: job done"
            exits = {m.proc_id: m for m in h.seen if isinstance(m, Exited)}
            assert exits["worker-0"].signal == signal.SIGKILL
            assert exits["server-0"].signal == signal.SIGTERM
            assert all(e.requested for e in exits.values())
            assert await asyncio.to_thread(agent.wait, 5) == 0
            for pid in pids:
                wait_dead(pid)
            assert json.loads((h.state_dir / "procs.json").read_text()) == {"procs": []}

    asyncio.run(main())


def test_orphan_timeout_stops_children_and_exits(tmp_path):
    async def main():
        async with Harness(tmp_path) as h:
            agent = h.start_agent(h.boot(orphan_timeout=1.5))
            peer, _ = await h.expect(Hello)
            await h.router.send(peer, spawn_msg(SLEEPER))
            _, spawned = await h.expect(Spawned)
            # Pings keep it alive well past the orphan timeout ...
            for seq in range(12):
                await h.router.send(peer, Ping(seq=seq))
                await asyncio.sleep(0.2)
            assert agent.poll() is None
            assert not any(isinstance(m, Bye) for m in h.seen)
            # ... silence does not.
            started = time.monotonic()
            _, exited = await h.expect(Exited, timeout=6)
            assert exited.requested
            _, bye = await h.expect(Bye)
            assert bye.reason == "orphan timeout"
            assert await asyncio.to_thread(agent.wait, 5) == 0
            assert 1.3 < time.monotonic() - started < 5
            wait_dead(spawned.pid)

    asyncio.run(main())


def test_reconnect_after_router_restart_says_hello_again(tmp_path):
    async def main():
        async with Harness(tmp_path) as h:
            h.start_agent()
            peer, _ = await h.expect(Hello)
            await h.router.send(peer, spawn_msg(SLEEPER))
            _, spawned = await h.expect(Spawned)
            port = h.router.port
            h.stop_router()
            await asyncio.sleep(1.0)  # > heartbeat_interval * dead_after: supervisor lost
            await h.start_router(port)
            h.seen.clear()
            peer, _ = await h.expect(AgentHeartbeat)  # the agent reconnected by itself
            await h.router.send(peer, Ping(seq=1))
            _, hello = await h.expect(Hello)
            procs = [fields(p, *REPORT_FIELDS) for p in hello.procs]
            assert procs == [("worker-0", spawned.pid, 0, "running")]

    asyncio.run(main())


def test_output_dropped_while_supervisor_gone_and_stderr_closed(tmp_path):
    stop = tmp_path / "stop"
    chatty = f"""
        import os, time
        i = 0
        while not os.path.exists({str(stop)!r}):
            print("line", i, flush=True)
            i += 1
            time.sleep(0.001)
        time.sleep(60)
    """

    async def main():
        async with Harness(tmp_path) as h:
            agent = h.start_agent(stderr_gone=True)
            peer, _ = await h.expect(Hello)
            await h.router.send(peer, spawn_msg(chatty))
            await h.expect(Output)
            port = h.router.port
            h.stop_router()
            log_file = h.state_dir / "agent.log"
            deadline = time.monotonic() + 20
            while "dropping child output" not in log_file.read_text():
                assert time.monotonic() < deadline, "output never dropped"
                await asyncio.sleep(0.1)
            stop.touch()
            assert agent.poll() is None
            await h.start_router(port)
            peer, _ = await h.expect(AgentHeartbeat, timeout=10)
            await h.router.send(peer, Shutdown(grace_s=1.0))
            await h.expect(Bye, timeout=10)
            assert await asyncio.to_thread(agent.wait, 10) == 0
            assert re.search(r"dropped \d+ output chunks", log_file.read_text())

    asyncio.run(main())


def test_sigkilled_agent_children_die_and_successor_cleans_up(tmp_path):
    code = """
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(g.pid, flush=True)
        time.sleep(60)
    """

    async def main():
        async with Harness(tmp_path) as h:
            first = h.start_agent()
            peer, _ = await h.expect(Hello)
            await h.router.send(peer, spawn_msg(code))
            _, spawned = await h.expect(Spawned)
            _, out = await h.expect(Output)
            grandchild = int(out.data)
            try:
                first.kill()
                await asyncio.to_thread(first.wait)
                wait_dead(spawned.pid)  # PR_SET_PDEATHSIG took the group leader
                assert alive(grandchild)  # its child lives on, until the next agent
                h.start_agent()
                _, hello = await h.expect(Hello)
                assert hello.procs == []
                wait_dead(grandchild)
            finally:
                if alive(grandchild):
                    os.kill(grandchild, signal.SIGKILL)

    asyncio.run(main())


BAD_LINES = [
    ("", "empty or closed"),
    ("{not json\n", "not JSON"),
    ('{"run_id": "r"}\n', "endpoint"),
]


@pytest.mark.parametrize(("line", "problem"), BAD_LINES)
def test_bad_bootstrap_exits_2(tmp_path, line, problem):
    agent = subprocess.run(
        [PY, "-m", "dtlaunch.agent"], input=line.encode(), capture_output=True, timeout=30
    )
    assert agent.returncode == 2
    err = agent.stderr.decode()
    assert "invalid bootstrap on stdin" in err and problem in err


def test_bad_keys_exit_2(tmp_path):
    async def main():
        async with Harness(tmp_path) as h:
            agent = h.start_agent(h.boot(client_secret="x" * 40))
            assert await asyncio.to_thread(agent.wait, 20) == 2
            err = (tmp_path / "agent.stderr").read_text()
            assert "CURVE" in err and h.keys.client.secret.decode() not in err

    asyncio.run(main())


@pytest.fixture
def memory_cgroup():
    """A cgroup v1 memory group limited to 300 MiB (agents moved into it stay there)."""
    counter = find_oom_counter_file()
    if counter is None or counter.name != "memory.oom_control":
        pytest.skip("needs the cgroup v1 memory controller")
    group = counter.parent / f"dtlaunch-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup: {exc}")
    for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
        if (group / name).exists():
            (group / name).write_text(str(300 * 2**20))
    yield group
    deadline = time.monotonic() + 10
    while group.exists():  # removable once its last process is gone
        try:
            group.rmdir()
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_oom_killed_child_is_reported(tmp_path, memory_cgroup):
    hog = """
        print("up", flush=True)
        chunks = [bytearray(50 * 2**20) for _ in range(100)]  # zero-filled: really touched
        print("survived", flush=True)
    """

    async def main():
        async with Harness(tmp_path) as h:
            agent = h.start_agent()
            (memory_cgroup / "cgroup.procs").write_text(str(agent.pid))  # children inherit it
            peer, _ = await h.expect(Hello)
            await h.router.send(peer, spawn_msg(SLEEPER, proc_id="worker-1"))
            _, sleeper = await h.expect(Spawned)
            await h.router.send(peer, spawn_msg(hog))
            _, exited = await h.expect(Exited, timeout=20, where=lambda m: m.proc_id == "worker-0")
            assert b"survived" not in h.outputs("worker-0")
            assert fields(exited, *EXIT_FIELDS) == (None, signal.SIGKILL, False, True)
            # A later SIGKILL that is not an OOM kill is not reported as one.
            os.kill(sleeper.pid, signal.SIGKILL)
            _, other = await h.expect(Exited, where=lambda m: m.proc_id == "worker-1")
            assert fields(other, *EXIT_FIELDS) == (None, signal.SIGKILL, False, False)
            await h.router.send(peer, Shutdown(grace_s=1.0))
            assert await asyncio.to_thread(agent.wait, 10) == 0

    asyncio.run(main())
