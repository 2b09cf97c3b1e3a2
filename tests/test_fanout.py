"""SSH fan-out (issue 18): at most --ssh-concurrency hosts in progress at once, a
host's budget counted from its turn, and the check table of many hosts.

The bound is read on the remote side: ``--python`` is a wrapper that appends, on
the "host" (a loopback address of a real sshd; SSH_CONNECTION names it), when a
probe starts and ends, then runs the real interpreter. Every host shares this
machine's file system, so the log gathers every host's record.
"""

from __future__ import annotations

import asyncio
import io
import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

import dtlaunch
from dtlaunch.config import check_concurrency
from dtlaunch.errors import ConfigError
from dtlaunch.fanout import FanOut, fan_out
from dtlaunch.hostfile import HostSpec
from dtlaunch.preflight import CHECKS, OK, SKIPPED, HostCheck, check_hosts, render_checks
from tests.jobs import REPO, events, run, summary
from tests.sshd import SshdServer, running_sshd

pytestmark = pytest.mark.integration

# The test sshd's ssh_config covers 127.0.0.*; other tests' sshds use 127.0.0.1-3.
ADDRESSES = tuple(f"127.0.0.{i}" for i in range(41, 49))

WRAPPER = """\
#!/bin/sh
# What runs on a "host", and when: kind (probe, agent, worker), host, start/end.
host=$(echo "$SSH_CONNECTION" | cut -d' ' -f3)
case "$1" in
  -c) kind=probe ;;
  -m) kind=agent ;;
  *) kind=worker ;;
esac
echo "$(date +%s.%N) start $kind $host" >> {log}
if [ "$kind" != probe ]; then exec {python} "$@"; fi
sleep {sleep}
{python} "$@"
status=$?
echo "$(date +%s.%N) end $kind $host" >> {log}
exit $status
"""


@pytest.fixture(scope="module")
def hosts8() -> Iterator[SshdServer]:
    """One real sshd on eight loopback addresses."""
    with running_sshd(addresses=ADDRESSES) as server:
        yield server


def wrapper(tmp_path: Path, *, sleep: float) -> tuple[Path, Path]:
    """(the --python wrapper, the log it appends to)."""
    log = tmp_path / "remote.log"
    script = tmp_path / "python.sh"
    script.write_text(WRAPPER.format(log=log, python=sys.executable, sleep=sleep))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def records(log: Path) -> list[tuple[float, str, str, str]]:
    """(time, start|end, kind, host) lines of the remote log, in time order."""
    out = []
    for line in log.read_text().splitlines():
        when, edge, kind, host = line.split()
        out.append((float(when), edge, kind, host))
    return sorted(out)


def most_at_once(intervals: dict[str, tuple[float, float]]) -> int:
    """The largest number of [start, end) intervals that overlap at one instant."""
    edges = sorted(
        [(start, 1) for start, _ in intervals.values()]
        + [(end, -1) for _, end in intervals.values()]
    )
    level = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        level += step
        peak = max(peak, level)
    return peak


def probe_intervals(log: Path) -> dict[str, tuple[float, float]]:
    starts: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    for when, edge, kind, host in records(log):
        if kind != "probe":
            continue
        if edge == "start":
            starts[host] = when
        else:
            spans[host] = (starts[host], when)
    return spans


def check(
    server: SshdServer,
    python: Path,
    workdir: Path,
    addresses: tuple[str, ...] = ADDRESSES,
    **kwargs: object,
) -> list[HostCheck]:
    hosts = [HostSpec(label=a, hostname=a) for a in addresses]
    return asyncio.run(
        check_hosts(
            hosts,
            server.options(),
            python=str(python),
            workdir=str(workdir),
            expected_version=dtlaunch.__version__,
            **kwargs,  # type: ignore[arg-type]
        )
    )


def test_check_has_at_most_the_concurrency_of_hosts_in_progress(hosts8, tmp_path):
    python, log = wrapper(tmp_path, sleep=0.4)
    results = check(hosts8, python, tmp_path, concurrency=2)
    assert [r.ok for r in results] == [True] * 8, [r.fix for r in results if not r.ok]
    spans = probe_intervals(log)
    assert sorted(spans) == sorted(ADDRESSES)  # one probe run per host
    # Two at a time on the hosts, never three; and two did run side by side.
    assert most_at_once(spans) == 2, spans


def test_a_host_waiting_for_its_turn_is_not_timed_out_by_the_wait(hosts8, tmp_path):
    """Five hosts one at a time, each 1.5 s of probe plus SSH and Python start:
    the last one starts at least 6 s in, beyond the 5 s budget, which counts
    from each host's own turn. (A host's own turn must fit the budget with room:
    under make test's load its SSH and Python start alone took over 1.5 s, so a
    0.6 s probe under a 2.5 s budget failed once.)"""
    python, log = wrapper(tmp_path, sleep=1.5)
    results = check(hosts8, python, tmp_path, ADDRESSES[:5], concurrency=1, timeout=5.0)
    assert [r.ok for r in results] == [True] * 5, [r.items for r in results if not r.ok]
    spans = probe_intervals(log)
    assert most_at_once(spans) == 1
    first = min(start for start, _ in spans.values())
    last_end = max(end for _, end in spans.values())
    assert last_end - first > 2.5  # the whole check outlasted one host's budget


def test_fan_out_bound_and_order_without_ssh():
    async def main() -> tuple[list[int], int]:
        gate_peak = 0
        active = 0

        async def work(item: int) -> int:
            nonlocal active, gate_peak
            active += 1
            gate_peak = max(gate_peak, active)
            await asyncio.sleep(0.01 * (item % 3))
            active -= 1
            return item * item

        return await fan_out(list(range(20)), work, limit=3), gate_peak

    squares, peak = asyncio.run(main())
    assert squares == [i * i for i in range(20)]
    assert peak == 3
    with pytest.raises(ConfigError, match=r"--ssh-concurrency is 0; expected .* at least 1"):
        FanOut(0)
    with pytest.raises(ConfigError, match="MaxStartups"):
        check_concurrency(-3)


def test_bad_concurrency_is_refused_by_check_and_run_naming_the_fix(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for argv in (
        ["check", "-H", "127.0.0.41", "--ssh-concurrency", "0"],
        ["run", "-H", "127.0.0.41", "--ssh-concurrency", "0", "--run-dir", str(tmp_path / "r"),
         "x.py"],
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "dtlaunch", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "--ssh-concurrency is 0; expected a whole number of hosts" in done.stderr
    assert not (tmp_path / "r").exists()  # refused before anything was created


def test_launch_holds_a_turn_from_the_probe_until_the_agent_says_hello(hosts8, tmp_path):
    """Four single-slot hosts, --ssh-concurrency 2: a host's probe (remote record)
    does not start before an earlier host's agent said Hello (agent_up), so no
    more than two launches are ever in progress."""
    python, log = wrapper(tmp_path, sleep=0.5)
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{a} slots=1\n" for a in ADDRESSES[:4]))
    run_dir = tmp_path / "run"
    result = run(
        [
            "run", "-H", str(hosts), "--nproc-per-node", "1", "--ssh-concurrency", "2",
            "--python", str(python), "--workdir", str(tmp_path), "--run-dir", str(run_dir),
            "--output", "none", "-m", "json.tool", "--help",
        ],
        env=hosts8.env(),
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary(run_dir)["status"] == "succeeded"
    up = {e["host"]: e["wall"] for e in events(run_dir) if e["kind"] == "agent_up"}
    starts = {h: t for t, edge, kind, h in records(log) if kind == "probe" and edge == "start"}
    assert sorted(up) == sorted(starts) == sorted(ADDRESSES[:4])
    turns = {h: (starts[h], up[h]) for h in up}
    assert most_at_once(turns) == 2, turns


def test_the_check_table_of_many_hosts_lists_the_failed_and_sums_up_the_rest(hosts8, tmp_path):
    """18 hosts, 2 of them refusing (a closed port): the failed ones get a row
    each, the 16 that passed one row."""
    good = [HostSpec(label=f"{a}-{n}", hostname=a) for n in (1, 2) for a in ADDRESSES]
    bad = [HostSpec(label=f"bad{n}", hostname=ADDRESSES[n], port=1) for n in (0, 1)]
    results = asyncio.run(
        check_hosts(
            [*good[:9], bad[0], *good[9:], bad[1]],
            hosts8.options(),
            python=sys.executable,
            workdir=str(tmp_path),
            expected_version=dtlaunch.__version__,
            concurrency=6,
        )
    )
    assert [r.host for r in results if not r.ok] == ["bad0", "bad1"]
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(render_checks(results))
    text = out.getvalue()
    assert "16 of 18 hosts OK; the 2 that failed first" in text
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert len(rows) == 3, text
    assert "bad0" in rows[0] and "refused (port 1)" in rows[0] and "FAIL" in rows[0]
    assert "bad1" in rows[1] and "FAIL" in rows[1]
    # Every check but "capacity" and "limits", which say what (2 cpu, cgroup-v1), not "ok".
    assert "16 other hosts" in rows[2] and rows[2].count(" ok ") == len(CHECKS) - 2
    assert not any(f"{a}-1 " in text for a in ADDRESSES)  # no row of a good host


def test_the_check_table_keeps_a_row_per_host_up_to_16_and_sums_all_good_ones():
    def result(name: str, ok: bool) -> HostCheck:
        items = dict.fromkeys(CHECKS, OK) if ok else dict.fromkeys(CHECKS, SKIPPED)
        if not ok:
            items["ssh"] = "refused (port 1)"
        return HostCheck(host=name, ok=ok, items=items, fix="" if ok else "start sshd")

    def shown(results: list[HostCheck]) -> str:
        out = io.StringIO()
        Console(file=out, width=200, color_system=None).print(render_checks(results))
        return out.getvalue()

    few = shown([result(f"h{i}", i != 3) for i in range(16)])
    assert all(f" h{i} " in few for i in range(16))
    many = shown([result(f"h{i}", True) for i in range(40)])
    assert "40 of 40 hosts OK" in many and "40 hosts" in many and " h7 " not in many


@pytest.mark.slow
def test_the_fanout_benchmark_quick_mode(tmp_path):
    """benchmarks/fanout.py --quick: 16 hosts on one sshd, every column measured."""
    out = tmp_path / "fanout.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fanout.py"), "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    results = json.loads(out.read_text())
    row = results["sizes"]["16"]
    assert row["check"]["ok"] and row["sequential"]["ok"] and row["launch"]["ok"], done.stdout
    assert row["launch"]["status"] == "stopped"
    assert (tmp_path / "fanout.md").read_text().startswith("# SSH fan-out")
