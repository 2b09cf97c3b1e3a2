"""``dtlaunch replay --plot``: a real job with a slow host, drawn.

The shared real job (tests/elastic_run.py: two workers of a slow host balanced,
then moved onto the spare) records its step reports and finished shards as
events; the plot is checked as a decoded picture (size, real content) and as the
numbers drawn (one series per worker, action markers at the decisions' times,
the shards).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from dtlaunch.events import read_events
from dtlaunch.ui.plots import DPI, FIG_SIZE_IN, plot_data
from tests.elastic_run import DATASET, WORKERS, ElasticRun
from tests.jobs import REPO, events, job_env, run, summary

pytestmark = pytest.mark.integration

image = pytest.importorskip("matplotlib.image")

SLOW = {2, 3}  # the ranks that ran on the slow host


@pytest.fixture(scope="module")
def straggler_run(elastic_run: ElasticRun) -> Path:
    result = elastic_run.result
    assert result.returncode == 0, result.stdout + result.stderr
    return elastic_run.run_dir


def _replay(*args: str):
    return run(["replay", *args], env={}, timeout=60)


def test_plot_is_a_png_of_the_promised_size_with_real_content(
    straggler_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run.png"
    result = _replay(str(straggler_run), "--plot", str(out))
    assert result.returncode == 0, result.stderr
    assert f"plot written to {out}" in " ".join(result.stderr.split())
    assert result.stdout == ""  # --plot alone draws; it does not print the timeline
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(str(out))
    width, height = (round(v * DPI) for v in FIG_SIZE_IN)
    assert pixels.shape[:2] == (height, width)
    rgb = pixels[:, :, :3]
    inked = (rgb.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    assert 0.03 < inked < 0.6
    colours = {tuple(p) for p in (rgb[::7, ::7] * 255).astype(int).reshape(-1, 3).tolist()}
    assert len(colours) > 30  # lines of several colours, text, bars: not a blank canvas


def test_plot_data_has_a_series_per_worker_and_markers_at_the_decisions(
    straggler_run: Path,
) -> None:
    evs = list(read_events(straggler_run / "events.jsonl"))
    data = plot_data(evs)
    assert sorted(data.bpt) == sorted(data.batch) == list(range(WORKERS))
    for rank in range(WORKERS):
        assert len(data.bpt[rank].xs) == len(data.bpt[rank].ys) >= 3
    # The slow host's workers are the slowest, in BPT and in throughput. A
    # KILL_RESTART leaves a NaN break in the series (no line joins two processes).
    steps = {r: [y for y in s.ys if not math.isnan(y)] for r, s in data.bpt.items()}
    mean_bpt = {r: sum(ys) / len(ys) for r, ys in steps.items()}
    assert max(mean_bpt, key=mean_bpt.__getitem__) in SLOW
    assert min(data.worker_throughput, key=data.worker_throughput.__getitem__) in SLOW
    # One marker per decision with an action, at its time since the first event.
    origin = evs[0].wall
    decided = [(e.wall - origin, e.data["action"]) for e in evs
               if e.kind == "decision" and "action" in e.data]  # fmt: skip
    assert decided, "the straggler should have caused at least one action"
    for marker, (at, name) in zip(data.markers, decided, strict=True):
        assert marker.action == name and marker.at_s == pytest.approx(at)
        if name == "KILL_RESTART":
            assert marker.label.startswith("KILL_RESTART worker ")
    assert any(m.action == "ADJUST_BS" for m in data.markers)
    # Shards per worker add up to what the DDS finished; the slow host's did fewest.
    done = summary(straggler_run)["shards_done"]
    assert sum(data.shards.values()) == done == DATASET // 60  # its --shard-size
    assert min(data.shards, key=data.shards.__getitem__) in SLOW
    # Global throughput: positive, and all samples of the data set are in it.
    assert data.throughput.xs and min(data.throughput.ys) >= 0 and max(data.throughput.ys) > 0


def test_reports_events_hold_every_step_and_stay_out_of_the_timeline(
    straggler_run: Path,
) -> None:
    reports = [e for e in events(straggler_run) if e["kind"] == "reports"]
    samples = sum(sum(e["samples"]) for e in reports)
    assert samples >= DATASET  # every record was trained and reported (re-runs may add)
    for e in reports:
        assert e["role"] == "worker" and e["rank"] in range(WORKERS)
        assert e["t"] == sorted(e["t"]) and e["t"][-1] <= e["mono"] + 1e-6
        assert len({len(e[k]) for k in ("step", "batch_size", "compute_s", "t")}) == 1
    result = _replay(str(straggler_run))
    assert result.returncode == 0, result.stderr
    labels = [ln.split()[1] for ln in result.stdout.splitlines() if ln.lstrip().startswith("+")]
    assert labels and not {"reports", "shards_do", "shards_done"} & set(labels)
    text = " ".join(result.stdout.split())
    assert "steps reported by worker: 0:" in text
    assert "shards/w done by worker: 0:" in text


def test_missing_matplotlib_names_the_extra_to_install(straggler_run: Path, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None; "
        "from dtlaunch.cli import main; sys.argv = ['dtlaunch', *sys.argv[1:]]; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "replay", str(straggler_run), "--plot",
         str(tmp_path / "x.png")],
        env=job_env(), cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "pip install 'dtlaunch[plot]'" in " ".join(result.stderr.split())
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--plot", "run.jpg"], "one of .png, .svg, .pdf"),
        (["--plot", "no/such/folder/run.png"], "does not exist; create it first"),
        (["--follow", "--plot", "run.png"], "use --plot and --policy once it has ended"),
    ],
)
def test_bad_plot_requests_exit_2_naming_the_fix(
    straggler_run: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    extra = [str(tmp_path / a) if a.endswith((".jpg", ".png")) else a for a in extra]
    result = run(["replay", str(straggler_run), *extra], env={}, timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split())
