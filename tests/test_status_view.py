"""The status screen: fits 80x24, grows with the terminal, marks stragglers in plain text."""

from __future__ import annotations

import re
from dataclasses import replace
from io import StringIO

import pytest
from rich.console import Console

from dtlaunch.ui.status_view import format_bpt, format_duration, render_status, sparkline
from dtlaunch.wire.messages import ActionStatus, NodeStatus, StatusSnapshot


def snapshot(workers=3, servers=1, actions=4, straggler=2, source="live"):
    nodes = [
        NodeStatus(
            role="worker",
            rank=r,
            host=f"node{r}.cluster.example.org",
            proc_state="running",
            batch_size=10,
            bpt_s=0.3 if r == straggler else 0.1,
            recent_bpt_s=[0.3 if r == straggler else 0.1] * 40,
            throughput=33.3 if r == straggler else 100.0,
            shards_done=r,
            straggler=(
                "transient straggler: 3.0x the mean BPT over the last 60 s (lambda 1.5)"
                if r == straggler
                else ""
            ),
        )
        for r in range(workers)
    ] + [
        NodeStatus(role="server", rank=r, host="ps0", proc_state="running") for r in range(servers)
    ]
    return StatusSnapshot(
        run_id="20260101-000000-0001",
        policy="nd:lambda=1.5,l_trans=60,l_per=300",
        mode="ps",
        phase="running",
        source=source,
        elapsed_s=125.0,
        shards_done=412,
        shards_total=1000,
        throughput=1234.5,
        eta_s=179.0,
        nodes=nodes,
        actions=[
            ActionStatus(
                at_s=10.0 * i,
                action="ADJUST_BS",
                target="w0=13 w1=13 w2=4",
                reason=f"decision {i}: transient straggler worker 2 (lambda 1.5); makespan "
                "0.3 s -> 0.13 s, and a long tail that does not fit an 80-column line",
            )
            for i in range(actions)
        ],
    )


def screen(snap, width, height, note=""):
    buffer = StringIO()
    console = Console(file=buffer, width=width, height=height, color_system=None)
    console.print(render_status(snap, note=note, width=width, height=height))
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("workers", [3, 12, 200])
def test_the_screen_fits_80_by_24(workers):
    lines = screen(snapshot(workers=workers), 80, 24, note="q quits")
    assert len(lines) <= 24
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert "412/1000 41%" in text and "ETA 2m59s" in text
    assert "*worker-2" in text  # the straggler is kept, whatever is folded away
    assert "transient straggler: 3.0x" in text
    assert "ADJUST_BS" in text
    if workers > 12:
        assert f"+{workers + 1 - 12}" in text  # the rest is folded into one row


def test_the_screen_grows_with_the_terminal():
    small = screen(snapshot(workers=30, actions=12), 80, 24)
    big = screen(snapshot(workers=30, actions=12), 160, 50)
    assert len(big) > len(small)
    assert len(big) <= 50
    assert sum("worker-" in line for line in big) > sum("worker-" in line for line in small)
    # Wider: a longer sparkline and whole reasons.
    assert max(line.count("█") for line in big) > max(line.count("█") for line in small)
    assert any("makespan 0.3 s -> 0.13 s" in line for line in big)
    assert not any("makespan 0.3 s -> 0.13 s" in line for line in small)


def test_a_printout_shows_every_node_and_wraps_reasons():
    buffer = StringIO()
    Console(file=buffer, width=80, color_system=None).print(
        render_status(snapshot(workers=40), width=80)
    )
    text = buffer.getvalue()
    assert all(f"worker-{r} " in text for r in range(40))
    assert "80-column line" in text  # wrapped, not cut
    assert "\x1b[" not in text  # no colour codes in plain text


def test_ended_job_shows_status_and_no_eta():
    snap = replace(snapshot(source="events"), status="succeeded", phase="done", eta_s=None)
    text = "\n".join(screen(snap, 80, 24, note="job ended (succeeded): shown from the event log"))
    assert "succeeded" in text
    assert "ETA" not in text
    assert "job ended (succeeded)" in text


def test_a_live_job_shows_its_policys_plan_under_the_header():
    plan = "auto: the servers use 0.11 of 0.25 cores: 2 -> 3 workers (idle PS)"
    live = replace(snapshot(), plan=plan)
    lines = screen(live, 100, 24)
    assert any(line.startswith(f"plan {plan}") for line in lines[:4]), lines[:4]
    assert len(lines) <= 24
    logged = replace(snapshot(source="events"), plan=plan)
    assert not any("plan auto" in line for line in screen(logged, 100, 24))


def test_no_data_sharding_and_no_reports_render_as_dashes():
    snap = StatusSnapshot(
        run_id="r",
        policy="none",
        mode="allreduce",
        phase="starting",
        source="live",
        nodes=[NodeStatus(role="worker", rank=0, host="", proc_state="pending")],
    )
    text = "\n".join(screen(snap, 80, 24))
    assert "no data sharding" in text
    assert " worker-0  -" in text


def test_formatting_helpers():
    assert format_duration(42) == "42s"
    assert format_duration(185) == "3m05s"
    assert format_duration(3720) == "1h02m"
    assert format_bpt(0.0) == "-"
    assert format_bpt(0.0042) == "4.2ms"
    assert format_bpt(0.25) == "250ms"
    assert format_bpt(2.5) == "2.50s"
    assert sparkline([0.0, 0.5, 1.0], 10, 1.0) == "▁▅█"
    assert sparkline([1.0] * 50, 8, 2.0) == "▅" * 8
    assert sparkline([1.0], 8, 0.0) == ""


def test_a_thousand_workers_fold_to_the_stragglers_and_the_slowest():
    """Issue 18: with 1,000 rows the screen shows the stragglers, then the slowest
    workers, then one "+N more" row; it stays one screen."""
    snap = snapshot(workers=1000, servers=0, actions=1, straggler=500)
    nodes = [
        replace(n, bpt_s=0.2, recent_bpt_s=[0.2] * 40) if n.rank in (7, 901) else n
        for n in snap.nodes
    ]
    nodes[42] = replace(nodes[42], proc_state="failed")
    lines = screen(replace(snap, nodes=nodes), 100, 30)
    assert len(lines) <= 30
    text = "\n".join(lines)
    ranks = re.findall(r"^[ *]worker-(\d+) ", text, flags=re.MULTILINE)
    assert ranks[:4] == ["42", "500", "7", "901"], ranks  # troubled by rank, then slowest
    assert "more" in text and "+9" in text  # the rest folded into one row


def test_limited_jobs_show_each_process_use_against_its_limits_in_a_wide_terminal():
    snap = snapshot(workers=3)
    limited = [
        replace(n, memory_bytes=(150 + 200 * n.rank) << 20, memory_limit=512 << 20,
                cpu_percent=95.0, cpu_limit=2.0)
        if n.role == "worker" else n
        for n in snap.nodes
    ]  # fmt: skip
    lines = screen(replace(snap, nodes=limited), 120, 30)
    assert all(len(line) <= 120 for line in lines)
    header = next(line for line in lines if "BPT" in line)
    assert "mem/limit" in header and "cpu/limit" in header
    text = "\n".join(lines)
    assert "150M/512M" in text and "550M/512M" in text  # rank 2 is past it
    assert "0.9/2" in text or "1.0/2" in text
    # Without limits, or in 80 columns, they stay away: the screen is as before.
    assert "mem/limit" not in "\n".join(screen(snap, 120, 30))
    narrow = screen(replace(snap, nodes=limited), 80, 24)
    assert all(len(line) <= 80 for line in narrow) and "mem/limit" not in "\n".join(narrow)
