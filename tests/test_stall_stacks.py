"""The stall diagnosis's stacks: py-spy on real processes (running, SIGSTOPped,
gone), and the supervisor's bounded wait for its agents' answers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dtlaunch.agent import stacks as agent_stacks
from dtlaunch.supervisor.control.stacks import StackRequests, innermost_frames
from dtlaunch.wire.messages import DumpStacks, Stacks

# "ready" comes from inside the frame: printed before the call, a SIGSTOP right
# after it could catch the process between the print and the call (seen once
# under load: the innermost frame was <module>).
HANGS = """
import time
def blocked_in_a_named_frame():
    print("ready", flush=True)
    while True:
        time.sleep(1)
blocked_in_a_named_frame()
"""


@pytest.fixture
def hung_process():
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGS], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()


@pytest.mark.skipif(agent_stacks.find_py_spy() is None, reason="py-spy is a dev dependency")
@pytest.mark.parametrize("stopped", [False, True], ids=["running", "sigstopped"])
def test_py_spy_shows_where_a_process_is_stuck_even_when_stopped(hung_process, stopped):
    if stopped:
        os.kill(hung_process.pid, signal.SIGSTOP)
    started = time.monotonic()
    text = asyncio.run(agent_stacks.dump_stacks(hung_process.pid))
    assert time.monotonic() - started < 5
    assert innermost_frames(text)[0].startswith("blocked_in_a_named_frame (<string>:"), text
    if stopped:
        os.kill(hung_process.pid, signal.SIGCONT)


def test_without_py_spy_the_answer_says_what_to_install(monkeypatch, hung_process):
    monkeypatch.setattr(agent_stacks, "find_py_spy", lambda: None)
    text = asyncio.run(agent_stacks.dump_stacks(hung_process.pid))
    assert text.startswith("no stacks: py-spy is not installed")
    assert "dtlaunch[diag]" in text
    assert innermost_frames(text) == [text]


@pytest.mark.skipif(agent_stacks.find_py_spy() is None, reason="py-spy is a dev dependency")
def test_a_process_that_is_gone_gets_a_reason_not_an_error():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    text = asyncio.run(agent_stacks.dump_stacks(gone.pid))
    assert text.startswith(f"no stacks: py-spy failed for pid {gone.pid}")


def test_a_hung_py_spy_is_stopped_at_the_bound(monkeypatch, tmp_path):
    """A tool that never answers is killed with its process group, and said so."""
    pids = tmp_path / "pids"
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setattr(agent_stacks, "find_py_spy", lambda: str(fake))
    started = time.monotonic()
    text = asyncio.run(agent_stacks.dump_stacks(os.getpid(), timeout_s=0.5))
    assert time.monotonic() - started < 3
    assert text == "no stacks: py-spy did not answer within 0.5 s"
    # Nothing left behind: the tool and its child are dead (a zombie waits for init).
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"pid {pid} of the hung py-spy still runs")


def test_the_supervisor_waits_a_bounded_time_and_names_the_silent_host():
    async def scenario():
        sent: list[tuple[str, DumpStacks]] = []
        requests: StackRequests

        async def send(host, msg):
            sent.append((host, msg))
            if host == "a":  # answers, plus a forged answer from b for a's request
                requests.answer("b", Stacks(request_id=msg.request_id, stacks={"w-0": "forged"}))
                text = "Thread 7 (idle)\n    f (x.py:1)\n    g (x.py:2)\n"
                answer = Stacks(request_id=msg.request_id, stacks={"w-0": text, "w-9": "x"})
                asyncio.get_running_loop().call_soon(requests.answer, "a", answer)

        requests = StackRequests(send)
        started = time.monotonic()
        stacks = await requests.collect({"a": ["w-0"], "b": ["w-1"]}, timeout_s=0.3)
        took = time.monotonic() - started
        return sent, stacks, took, requests

    sent, stacks, took, requests = asyncio.run(scenario())
    assert sorted(host for host, _ in sent) == ["a", "b"]
    assert 0.25 < took < 2
    assert set(stacks) == {"w-0", "w-1"}  # only what was asked
    assert innermost_frames(stacks["w-0"]) == ["f (x.py:1)", "g (x.py:2)"]
    assert stacks["w-1"] == "no stacks: the agent on b did not answer within 0.3 s"
    assert requests._waiting == {}  # nothing kept for late answers


def test_innermost_frames_of_a_dump():
    dump = (
        "Process 1: python train.py\nPython v3.11.7\n\n"
        'Thread 1 (idle): "MainThread"\n    wait (threading.py:320)\n'
        "    barrier (train.py:40)\n    main (train.py:80)\n    <module> (train.py:99)\n"
        'Thread 2 (idle): "other"\n    run (x.py:1)\n'
    )
    assert innermost_frames(dump) == [
        "wait (threading.py:320)",
        "barrier (train.py:40)",
        "main (train.py:80)",
    ]
    assert innermost_frames(dump, 1) == ["wait (threading.py:320)"]
