"""The agent's main loop: talk to the supervisor, run what it says, report back.

``run_agent`` first kills leftovers of a previous agent for the same state_dir
(see ``proctable``), stores the run's peer keys for its children, connects a
DEALER to the supervisor and then runs three things at once: the receive loop
(Spawn / Kill / Shutdown / Rehello / DumpStacks), the heartbeat loop (AgentHeartbeat every
interval, supervisor-lost and orphan detection) and the process runner (which
reports Spawned / Output / Exited through this module's sink).

The agent outlives its supervisor on purpose: when the supervisor is silent it
keeps its children running and reconnects; only after ``orphan_timeout`` of
silence does it stop them and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import zmq.asyncio

from dtlaunch.agent.limits import LimitEnforcer, Limits
from dtlaunch.agent.oom import OomWatcher
from dtlaunch.agent.procs import ChildProcess, ExitInfo, ProcessGroupRunner, SpawnSpec
from dtlaunch.agent.proctable import claim_agent_pid, kill_stale_groups
from dtlaunch.agent.stacks import dump_stacks
from dtlaunch.errors import LaunchError, WireError
from dtlaunch.version import __version__
from dtlaunch.wire.keys import KeyPair, PeerKeys, write_peer_keys
from dtlaunch.wire.messages import (
    AgentBootstrap,
    AgentHeartbeat,
    Bye,
    DumpStacks,
    Exited,
    Hello,
    Kill,
    Message,
    Output,
    Ping,
    Rehello,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    Stacks,
    Welcome,
)
from dtlaunch.wire.sockets import Dealer

log = logging.getLogger(__name__)

FREE_PORTS = 32  # jobstate: MASTER_PORT_SLOTS (2) + LISTENERS_PER_HOST_MAX (30)
KEYS_ENV = "DTLAUNCH_KEYS"
TABLE_FILE = "procs.json"
KEYS_DIR = "keys"


def peer_keys_of(boot: AgentBootstrap) -> PeerKeys:
    """The bootstrap's keys as a PeerKeys (raises KeyFileError when malformed)."""
    return PeerKeys(
        server_public=boot.server_public.encode("ascii", "replace"),
        client=KeyPair(
            public=boot.client_public.encode("ascii", "replace"),
            secret=boot.client_secret.encode("ascii", "replace"),
        ),
    )


def find_free_ports(count: int = FREE_PORTS) -> list[int]:
    """Ports that were free on all interfaces a moment ago (held together, so distinct)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("0.0.0.0", 0))
        return [s.getsockname()[1] for s in socks]
    except OSError as exc:
        log.warning("cannot probe free ports: %s", exc)
        return []
    finally:
        for sock in socks:
            sock.close()


def route_address(endpoint: str) -> str:
    """This host's address on the route to the supervisor, or "" when unknown.

    Connecting a UDP socket sends nothing; it only asks the kernel which local
    address it would use, which is one the supervisor's network can reach.
    """
    try:
        parts = urlsplit(endpoint)
        if parts.hostname is None or parts.port is None:
            return ""
        family = socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((parts.hostname, parts.port))
            return str(sock.getsockname()[0])
    except (OSError, ValueError) as exc:
        log.info("cannot tell this host's address towards %s: %s", endpoint, exc)
        return ""


class Agent:
    """One agent's state; ``run`` returns the process exit code."""

    def __init__(self, boot: AgentBootstrap, dealer: Dealer, keys_dir: Path) -> None:
        self._boot = boot
        self._dealer = dealer
        self._keys_dir = keys_dir
        self._host_addr = route_address(boot.endpoint)
        self._limits = LimitEnforcer.detect(
            prefer="" if boot.limits_via == "auto" else boot.limits_via
        )
        self._runner: ProcessGroupRunner | None = None
        self._loop = asyncio.get_running_loop()
        self._last_rx = self._loop.time()
        self._supervisor_lost = False
        self._stop_requested = asyncio.Event()
        self._stop_reason = ""
        self._stop_grace = boot.kill_grace
        self._dropped_output = 0
        self._queue_full = False
        self._dumps: set[asyncio.Task[None]] = set()  # py-spy runs, off the receive loop

    # ------------------------------------------------------------------ lifecycle

    def request_stop(self, reason: str, grace_s: float) -> None:
        """Stop every child (SIGTERM, SIGKILL after ``grace_s``), say Bye, exit."""
        if self._stop_requested.is_set():
            log.info("already stopping (%s); ignoring %s", self._stop_reason, reason)
            return
        log.info("stopping: %s (grace %.1fs)", reason, grace_s)
        self._stop_reason = reason
        self._stop_grace = grace_s
        self._stop_requested.set()

    async def run(self) -> int:
        support = self._limits.support
        log.info(
            "limits: memory via %s, cpu via %s (%s)", support.memory, support.cpu, support.detail
        )
        swept = self._limits.sweep_stale()
        if swept:
            log.info("removed %d empty cgroups left by an earlier agent", swept)
        runner = ProcessGroupRunner(
            table_path=Path(self._boot.state_dir) / TABLE_FILE,
            sink=self,
            extra_env={KEYS_ENV: str(self._keys_dir)},
            oom=OomWatcher.for_this_process(),
            limits=self._limits,
            shutdown_grace_s=self._boot.kill_grace,
        )
        async with runner:
            self._runner = runner
            await self._send_hello()
            async with asyncio.TaskGroup() as tg:
                receiver = tg.create_task(self._receive_loop())
                beater = tg.create_task(self._heartbeat_loop())
                await self._stop_requested.wait()
                await runner.stop_all(self._stop_grace)
                await self._send(Bye(reason=self._stop_reason))
                receiver.cancel()
                beater.cancel()
                for dump in list(self._dumps):  # each stops its py-spy when cancelled
                    dump.cancel()
                await asyncio.gather(*self._dumps, return_exceptions=True)
        if self._dropped_output:
            log.warning(
                "dropped %d output chunks while the supervisor was unreachable",
                self._dropped_output,
            )
        log.info("agent exits: %s", self._stop_reason)
        return 0

    # ------------------------------------------------------------------ sending

    async def _send(self, msg: Message) -> bool:
        try:
            ok = await self._dealer.send(msg)
        except WireError as exc:  # a bug on our side; never worth dying for
            log.error("cannot send %s: %s", msg.TYPE, exc)
            return False
        if ok:
            self._queue_full = False
        elif not self._queue_full:
            # Once per outage: heartbeats would repeat it every interval.
            self._queue_full = True
            log.warning(
                "supervisor unreachable and send queue full: %s and later messages "
                "are dropped until it drains",
                msg.TYPE,
            )
        if not ok and isinstance(msg, Exited):
            log.warning(
                "exit of %s attempt %d not delivered; the next Hello will no longer list it",
                msg.proc_id,
                msg.attempt,
            )
        return ok

    async def _send_hello(self) -> None:
        runner = self._runner
        assert runner is not None
        await self._send(
            Hello(
                role="agent",
                run_id=self._boot.run_id,
                host=self._boot.host,
                pid=os.getpid(),
                version=__version__,
                procs=runner.reports(),
                free_ports=find_free_ports(),
                host_addr=self._host_addr,
                memory_bytes=psutil.virtual_memory().total,
                limits=f"memory {self._limits.support.memory}, cpu {self._limits.support.cpu}",
            )
        )

    # ------------------------------------------------------------------ ProcSink

    async def started(self, child: ChildProcess) -> None:
        await self._send(Spawned(proc_id=child.proc_id, attempt=child.attempt, pid=child.pid))

    async def output(self, child: ChildProcess, stream: str, data: bytes) -> None:
        msg = Output(proc_id=child.proc_id, attempt=child.attempt, stream=stream, data=data)
        if not await self._send(msg):
            if self._dropped_output == 0:
                log.warning(
                    "dropping child output while the supervisor is unreachable "
                    "(counted; logged once)"
                )
            self._dropped_output += 1

    async def exited(self, child: ChildProcess, info: ExitInfo) -> None:
        await self._send(
            Exited(
                proc_id=info.proc_id,
                attempt=info.attempt,
                pid=info.pid,
                exit_code=info.exit_code,
                signal=info.signal,
                runtime_s=info.runtime_s,
                stderr_tail=info.stderr_tail,
                oom_killed=info.oom_killed,
                requested=info.requested,
            )
        )

    # ------------------------------------------------------------------ loops

    async def _heartbeat_loop(self) -> None:
        boot = self._boot
        lost_after = boot.heartbeat_interval * boot.dead_after
        seq = 0
        while True:
            await asyncio.sleep(boot.heartbeat_interval)
            silent = self._loop.time() - self._last_rx
            if silent > boot.orphan_timeout and not self._stop_requested.is_set():
                log.error(
                    "no word from the supervisor for %.1fs (orphan timeout %.1fs)",
                    silent,
                    boot.orphan_timeout,
                )
                self.request_stop("orphan timeout", boot.kill_grace)
            elif silent > lost_after and not self._supervisor_lost:
                self._supervisor_lost = True
                log.warning(
                    "supervisor silent for %.1fs; children keep running, will stop "
                    "them after %.1fs of silence",
                    silent,
                    boot.orphan_timeout,
                )
            assert self._runner is not None
            seq += 1
            try:
                procs = self._runner.reports()
            except Exception:  # psutil surprises must not stop the heartbeat
                log.exception("cannot sample children; heartbeat without procs")
                procs = []
            await self._send(AgentHeartbeat(seq=seq, procs=procs))

    async def _receive_loop(self) -> None:
        while True:
            msg = await self._dealer.recv(timeout=None)
            if msg is None:
                continue
            self._last_rx = self._loop.time()
            if self._supervisor_lost:
                self._supervisor_lost = False
                log.info("supervisor is back; saying hello again")
                if not isinstance(msg, Rehello):
                    await self._send_hello()
            try:
                await self._handle(msg)
            except Exception:  # a bad message must never take the agent down
                log.exception("error handling %s; ignored", msg.TYPE)

    async def _handle(self, msg: Message) -> None:
        runner = self._runner
        assert runner is not None
        if isinstance(msg, Ping):
            return
        if isinstance(msg, Rehello):
            await self._send_hello()
        elif isinstance(msg, Spawn):
            await self._spawn(runner, msg)
        elif isinstance(msg, Kill):
            runner.kill(msg.proc_id, msg.attempt, msg.grace_s)
        elif isinstance(msg, Shutdown):
            reason = f"shutdown: {msg.reason}" if msg.reason else "shutdown"
            self.request_stop(reason, msg.grace_s)
        elif isinstance(msg, DumpStacks):
            task = asyncio.create_task(self._dump_stacks(runner, msg), name="dump-stacks")
            self._dumps.add(task)
            task.add_done_callback(self._dumps.discard)
        elif isinstance(msg, Welcome):
            log.info("welcomed by the supervisor of run %s", msg.run_id)
        else:
            log.warning("ignoring unexpected %s message from the supervisor", msg.TYPE)

    async def _dump_stacks(self, runner: ProcessGroupRunner, msg: DumpStacks) -> None:
        async def one(proc_id: str) -> str:
            child = runner.get(proc_id)
            if child is None:
                return f"no stacks: {proc_id} is not running on {self._boot.host}"
            return await dump_stacks(child.pid)

        try:
            texts = await asyncio.gather(*(one(p) for p in msg.proc_ids))
        except Exception as exc:  # e.g. cannot start py-spy: say so rather than stay silent
            log.exception("dumping stacks failed")
            texts = [f"no stacks: {type(exc).__name__}: {exc}"] * len(msg.proc_ids)
        stacks = dict(zip(msg.proc_ids, texts, strict=True))
        await self._send(Stacks(request_id=msg.request_id, stacks=stacks))

    async def _spawn(self, runner: ProcessGroupRunner, msg: Spawn) -> None:
        if self._stop_requested.is_set():
            error = f"agent on {self._boot.host} is shutting down ({self._stop_reason})"
            await self._send(SpawnFailed(proc_id=msg.proc_id, attempt=msg.attempt, error=error))
            return
        spec = SpawnSpec(
            proc_id=msg.proc_id,
            role=msg.role,
            rank=msg.rank,
            attempt=msg.attempt,
            argv=list(msg.argv),
            env=dict(msg.env),
            cwd=msg.cwd,
            limits=Limits(memory_bytes=msg.memory_limit, cpus=msg.cpu_limit),
        )
        try:
            runner.spawn(spec)  # Spawned is sent by started(), before any Output
        except LaunchError as exc:
            log.warning("cannot spawn %s attempt %d: %s", msg.proc_id, msg.attempt, exc)
            await self._send(
                SpawnFailed(
                    proc_id=msg.proc_id, attempt=msg.attempt, error=f"{self._boot.host}: {exc}"
                )
            )


AGENT_PID_FILE = "agent.pid.json"


def prepare_state_dir(boot: AgentBootstrap) -> Path:
    """Clean up after a killed predecessor, store the peer keys; return the keys dir."""
    state_dir = Path(boot.state_dir)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Before anything else: a previous agent for this state_dir may still live (its
    # children then die by their parent-death signal) or have been SIGKILLed.
    claim_agent_pid(state_dir / AGENT_PID_FILE)
    kill_stale_groups(state_dir / TABLE_FILE)
    keys_dir = state_dir / KEYS_DIR
    write_peer_keys(keys_dir, peer_keys_of(boot))
    return keys_dir


async def run_agent(boot: AgentBootstrap, *, handle_signals: bool = True) -> int:
    """Run an agent until Shutdown, orphan timeout or SIGTERM/SIGINT; return its exit code.

    Raises:
        KeyFileError: the bootstrap's keys are malformed or cannot be stored.
        ConfigError: the supervisor endpoint is malformed.
    """
    keys_dir = prepare_state_dir(boot)
    ctx = zmq.asyncio.Context()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    try:
        dealer = Dealer(ctx, boot.endpoint, peer_keys_of(boot), b"agent:" + boot.host.encode())
        try:
            agent = Agent(boot, dealer, keys_dir)
            for signum in signals:
                name = signal.Signals(signum).name
                loop.add_signal_handler(signum, agent.request_stop, name, boot.kill_grace)
            log.info(
                "agent for run %s on %s (pid %d) connecting to %s",
                boot.run_id,
                boot.host,
                os.getpid(),
                boot.endpoint,
            )
            return await agent.run()
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
            dealer.close()
    finally:
        with contextlib.suppress(zmq.ZMQError):
            ctx.term()
