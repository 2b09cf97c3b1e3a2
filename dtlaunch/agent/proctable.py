"""The agent's on-disk table of its children, and cleanup of a dead agent's leftovers.

Every child the agent starts is written to ``<state_dir>/procs.json`` (atomically)
with its pid, process group, psutil create time and a per-spawn token that it also
carries in its environment. When an agent is SIGKILLed, PR_SET_PDEATHSIG takes each
group leader, but grandchildren live on in the old process groups. A new agent for
the same state_dir reads the table first and kills what is provably still ours:

* the leader, when its pid is alive with the recorded create time
  (then the whole group goes with ``killpg``);
* a leaderless group's members: same process group, created no earlier than the
  leader, and carrying the spawn token in their environment. A pid cannot become a
  new group's id while the old group has members, and the token rules out a group
  that formed under a reused pid after the old one emptied.

Nothing is ever found or killed by name.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

TOKEN_ENV = "DTLAUNCH_SPAWN_TOKEN"
# psutil derives create_time from clock ticks (1/100 s); the same process always
# yields the same value, a different process at the same pid almost never does.
CREATE_TIME_TOLERANCE_S = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRecord:
    proc_id: str
    attempt: int
    pid: int
    pgid: int
    create_time: float
    token: str


def write_table(path: Path, records: list[ChildRecord]) -> None:
    """Replace ``path`` atomically (write, fsync, rename) with ``records``."""
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps({"procs": [asdict(r) for r in records]}, indent=1)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_table(path: Path) -> list[ChildRecord]:
    """Read the table; a missing file is empty, a damaged one is logged and empty."""
    try:
        raw = json.loads(path.read_text())
        return [
            ChildRecord(
                proc_id=str(item["proc_id"]),
                attempt=int(item["attempt"]),
                pid=int(item["pid"]),
                pgid=int(item["pgid"]),
                create_time=float(item["create_time"]),
                token=str(item["token"]),
            )
            for item in raw["procs"]
        ]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable process table %s: %s", path, exc)
        return []


def _same_process(proc: psutil.Process, create_time: float) -> bool:
    try:
        return abs(proc.create_time() - create_time) <= CREATE_TIME_TOLERANCE_S
    except psutil.Error:
        return False


def _carries_token(proc: psutil.Process, token: str) -> bool:
    try:
        return proc.environ().get(TOKEN_ENV) == token
    except psutil.Error:
        return False


def _kill_group(rec: ChildRecord) -> list[int]:
    """Kill what is left of one recorded process group; return the pids signalled."""
    try:
        leader = psutil.Process(rec.pid)
    except psutil.NoSuchProcess:
        leader = None
    if leader is not None and _same_process(leader, rec.create_time):
        try:
            os.killpg(rec.pgid, signal.SIGKILL)
        except ProcessLookupError:
            return []
        return [rec.pid]
    killed: list[int] = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or os.getpgid(proc.pid) != rec.pgid:
                continue
            if proc.create_time() + CREATE_TIME_TOLERANCE_S < rec.create_time:
                continue
        except (OSError, psutil.Error):
            continue
        if not _carries_token(proc, rec.token):
            log.warning(
                "pid %d is in old process group %d but lacks its spawn token; not touched",
                proc.pid,
                rec.pgid,
            )
            continue
        try:
            os.kill(proc.pid, signal.SIGKILL)
            killed.append(proc.pid)
        except ProcessLookupError:
            continue
    return killed


def kill_stale_groups(path: Path) -> list[int]:
    """Kill leftovers of the children recorded in ``path``, then empty the table.

    Returns the pids that were sent SIGKILL (leaders stand for their whole group).
    """
    killed: list[int] = []
    for rec in read_table(path):
        pids = _kill_group(rec)
        if pids:
            log.warning(
                "killed leftovers of %s attempt %d from a previous agent (group %d, pids %s)",
                rec.proc_id,
                rec.attempt,
                rec.pgid,
                pids,
            )
        killed += pids
    if path.exists():
        write_table(path, [])
    return killed


def claim_agent_pid(path: Path) -> int | None:
    """Record this agent as the owner of its state dir; SIGKILL a live predecessor.

    A predecessor still running (the supervisor that started it died before it
    could record it, and a resumed supervisor started a new one) would otherwise
    reconnect under the same identity. It is identified by pid and start time,
    never by name. Returns the pid killed, if any.
    """
    killed: int | None = None
    try:
        old = json.loads(path.read_text())
        proc = psutil.Process(int(old["pid"]))
        if proc.pid != os.getpid() and _same_process(proc, float(old["create_time"])):
            proc.kill()
            proc.wait(timeout=5)
            killed = proc.pid
            log.warning("killed the previous agent of this state dir (pid %d)", killed)
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError, psutil.Error) as err:
        log.debug("no live predecessor agent (%s)", err)
    me = psutil.Process()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"pid": me.pid, "create_time": me.create_time()}))
    os.replace(tmp, path)
    return killed
