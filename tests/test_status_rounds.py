"""RNA's rounds in ``dtlaunch status``: rounds per second and each worker's share."""

from __future__ import annotations

from dtlaunch.events import Event
from dtlaunch.supervisor.status import StatusFold
from dtlaunch.ui.status_view import render_status


def rounds_event(at, rounds, contributions, members=(0, 1, 2)):
    return Event(
        kind="rna_rounds",
        mono=at,
        wall=at,
        data={"gen": 1, "members": list(members), "rounds": rounds,
              "contributions": list(contributions), "sampled": []},
    )  # fmt: skip


def test_status_shows_rounds_per_second_and_each_workers_share():
    fold = StatusFold(run_id="r", policy="rna", mode="allreduce")
    for rank in range(3):
        fold.node("worker", rank)
    fold.emit(rounds_event(10.0, 40, [40, 30, 8]))
    fold.emit(rounds_event(11.0, 60, [60, 50, 12]))
    snap = fold.snapshot(now=11.5, source="live", stragglers={})
    # 100 rounds over the two reports' second and the one before the first.
    assert snap.rna_rounds_per_s == 50.0
    shares = {n.rank: n.rna_share for n in snap.nodes}
    assert shares == {0: 1.0, 1: 0.8, 2: 0.2}
    from rich.console import Console

    console = Console(width=100, record=True)
    console.print(render_status(snap, width=100))
    text = console.export_text()
    assert "rna 50.0 rounds/s, contributed:  w0 100%  w1 80%  w2 20%" in text
    # Reports stop: no rounds run now.
    assert fold.snapshot(now=15.0, source="live", stragglers={}).rna_rounds_per_s == 0.0
    # A report older than the window no longer counts.
    fold.emit(rounds_event(30.0, 10, [10, 0, 0]))
    snap = fold.snapshot(now=30.0, source="live", stragglers={})
    assert snap.rna_rounds_per_s == 10.0
    assert {n.rank: n.rna_share for n in snap.nodes} == {0: 1.0, 1: 0.0, 2: 0.0}


def test_under_hierarchical_rna_a_workers_share_counts_its_own_groups_rounds():
    fold = StatusFold(run_id="r", policy="rna", mode="ps")
    for rank in range(4):
        fold.node("worker", rank)
    fold.emit(rounds_event(10.0, 40, [40, 20], members=(0, 1)))  # the fast group
    fold.emit(rounds_event(10.0, 10, [5, 10], members=(2, 3)))  # the slow one
    fold.emit(Event(kind="rna_partition", mono=9.0, wall=9.0, data={"groups": [[0, 1], [2, 3]]}))
    snap = fold.snapshot(now=10.5, source="live", stragglers={})
    assert snap.rna_rounds_per_s == 50.0  # both groups' rounds
    assert {n.rank: n.rna_share for n in snap.nodes} == {0: 1.0, 1: 0.5, 2: 0.5, 3: 1.0}
    assert snap.rna_groups == [[0, 1], [2, 3]]
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(render_status(snap, width=120))
    text = console.export_text()
    assert (
        "rna 50.0 rounds/s in 2 groups, contributed:  [w0 100%  w1 50%]  [w2 50%  w3 100%]" in text
    )
    # A refused partition changes nothing; one group again shows no brackets.
    refused = {"groups": [[0], [1, 2, 3]], "refused": "workers are finishing"}
    fold.emit(Event(kind="rna_partition", mono=11.0, wall=11.0, data=refused))
    assert fold.snapshot(now=11.0, source="live", stragglers={}).rna_groups == [[0, 1], [2, 3]]
    fold.emit(Event(kind="rna_partition", mono=12.0, wall=12.0, data={"groups": [[0, 1, 2, 3]]}))
    assert fold.snapshot(now=12.0, source="live", stragglers={}).rna_groups == []


def test_replay_plot_data_has_the_rounds_and_each_workers_share():
    from dtlaunch.ui.plots import plot_data

    events = [
        Event(kind="job_start", mono=0.0, wall=0.0, data={"workers": 3, "mode": "allreduce"}),
        rounds_event(10.0, 40, [40, 30, 8]),
        rounds_event(12.0, 60, [60, 30, 12]),
    ]
    data = plot_data(events)
    assert data.rounds is not None
    assert data.rounds.xs == [10.0, 12.0] and data.rounds.ys == [40.0, 30.0]
    assert data.contribution is not None
    assert data.contribution[1].ys == [0.75, 0.5] and data.contribution[2].ys == [0.2, 0.2]
    # A run without RNA keeps the batch-size panel.
    assert plot_data(events[:1]).rounds is None


def test_importing_dtlaunch_rna_loads_no_torch_until_the_trainer_is_used():
    import subprocess
    import sys

    code = (
        "import sys, dtlaunch.rna; assert 'torch' not in sys.modules; "
        "dtlaunch.rna.Trainer; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
