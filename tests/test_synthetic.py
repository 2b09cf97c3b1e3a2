"""examples/synthetic.py under dtlaunch (DDS, injection, ADJUST_BS) and under real
torchrun; the straggler benchmark's argument parsing and result writers."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from types import ModuleType

import pytest

from tests.jobs import REPO, events, run, summary

SYNTHETIC = str(REPO / "examples" / "synthetic.py")
LINE = re.compile(r"synthetic: jct_s=(\S+) train_s=(\S+) steps=(\d+) records=(\d+)")


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "stragglers_bench", REPO / "benchmarks" / "stragglers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def final_line(text: str) -> tuple[float, float, int, int]:
    match = LINE.search(text)
    assert match, text[-3000:]
    jct, train, steps, records = match.groups()
    return float(jct), float(train), int(steps), int(records)


# In make test-slow: 30 s. make test runs synthetic.py under dtlaunch in the demo's
# test (nd, two jobs), and lb-bsp's balancing of an injected straggler in test_control.
@pytest.mark.slow
@pytest.mark.integration
def test_synthetic_under_dtlaunch_balances_an_injected_straggler(tmp_path):
    run_dir = tmp_path / "run"
    result = run(
        [
            "run", "--workers", "3", "--run-dir", str(run_dir), "--output", "0",
            "--policy", "lb-bsp:l_trans=0.6,l_per=1.2,apply_after=4,min_batch=4",
            "--control-interval", "0.3",
            "--inject", "persistent:role=worker,ranks=2,delay=0.06",
            SYNTHETIC, "--dataset-size", "2400", "--shard-size", "60", "--global-batch", "30",
            "--capacity", "1000",
        ],
        env={},
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    log = (run_dir / "logs" / "worker-0.log").read_text()
    _, train_s, steps, records = final_line(log)
    assert records == 2400  # every record trained once, no restart
    # 80 steps at 10 records/worker: a step costs >= 0.01 s of "compute"; the straggler
    # adds 0.06 s to the steps it still takes part in.
    assert steps >= 80 and train_s >= 0.8
    data = summary(run_dir)
    assert data["status"] == "succeeded" and data["records_total"] == 2400
    assert data["actions"].get("ADJUST_BS", 0) >= 1
    plan = next(e for e in events(run_dir) if e.get("action") == "ADJUST_BS")
    sizes = {int(k): v for k, v in plan["sizes"].items()}
    assert sum(sizes.values()) == 30 and sizes[2] < 10
    injected = [e for e in events(run_dir) if e["kind"] == "injected"]
    assert injected and {e["rank"] for e in injected} == {2}


@pytest.mark.integration
@pytest.mark.slow  # ~35 s; the straggler benchmark's torchrun column (its quick mode: test-slow)
def test_synthetic_under_torchrun_uses_a_static_partition_and_the_same_injection(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTLAUNCH_")}
    common = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        SYNTHETIC, "--torchrun", "--dataset-size", "400", "--global-batch", "20",
        "--capacity", "1000", "--hosts", "a,b",
    ]  # fmt: skip
    plain = subprocess.run(
        common, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert plain.returncode == 0, plain.stderr
    slow = subprocess.run(
        [*common, "--inject", "persistent:hosts=b,delay=0.05"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert slow.returncode == 0, slow.stderr
    _, plain_s, steps, records = final_line(plain.stdout)
    _, slow_s, slow_steps, _ = final_line(slow.stdout)
    assert (steps, records, slow_steps) == (20, 400, 20)  # 400 / 20, equal shares
    # Host b's delay holds back every step of the BSP loop: 20 x 0.05 s more.
    assert slow_s - plain_s >= 0.8, (plain_s, slow_s)


def test_synthetic_runs_standalone_for_debugging():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTLAUNCH_")}
    env.pop("RANK", None)
    result = subprocess.run(
        [sys.executable, SYNTHETIC, "--dataset-size", "200", "--global-batch", "20",
         "--capacity", "4000"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert final_line(result.stdout)[2:] == (10, 200)  # one process reads the whole data set


def test_synthetic_rejects_bad_arguments(capsys):
    # In this process: three interpreters importing torch cost 14 s for three
    # argparse errors; the command line's own path runs in the tests above.
    spec = importlib.util.spec_from_file_location("synthetic_example", SYNTHETIC)
    assert spec is not None and spec.loader is not None
    synthetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic)
    for args, words in (
        (["--capacity", "10,x"], "--capacity"),
        (["--inject", "persistent:delay=1"], "--torchrun"),
        (["--global-batch", "0"], "--global-batch"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            synthetic.parse_args(args)
        assert exit_info.value.code == 2
        assert words in capsys.readouterr().err, args


def test_benchmark_help_and_arguments(tmp_path):
    bench = load_benchmark()
    help_text = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "stragglers.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "--quick" in help_text and "--out" in help_text
    quick = bench.parse_args(["--quick"])
    assert quick.out.name == "stragglers.quick.json" and quick.overhead_pairs == 0
    full = bench.parse_args(["--out", str(tmp_path / "x.json")])
    assert full.out == tmp_path / "x.json" and full.overhead_pairs == 2
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", str(tmp_path / "x.txt")])
    with pytest.raises(SystemExit):
        bench.parse_args(["--overhead-pairs", "-1"])
    assert full.intensities == bench.INTENSITIES
    part = bench.parse_args(["--intensities", "0.8,0.3"])
    assert part.intensities == (0.3, 0.8) and part.out.name == "stragglers.partial.json"
    bad_args = (["--intensities", "0"], ["--intensities", "x"], ["--quick", "--intensities", "1"])
    for bad in bad_args:
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_benchmark_scenario_scales_antdt_and_its_pattern_is_seeded():
    bench = load_benchmark()
    specs = bench.FULL.injections(0.8)
    assert bench.FULL.injections(0.0) == []
    persistent, transient = specs
    assert "hosts=127.0.0.5" in persistent and "delay=0.32" in persistent  # 4 s x 0.8 / 10
    assert "prob=0.3" in transient and "sleep=0.15" in transient and "intensity=0.8" in transient
    first = bench.transient_pattern(bench.FULL, 0.8, 8)
    assert first == bench.transient_pattern(bench.FULL, 0.8, 8)
    disturbed = sum(sum(w) for w in first.values())
    assert 0 < disturbed < 10 * 8  # about 0.3 of host-windows


def test_benchmark_results_table_and_files(tmp_path):
    bench = load_benchmark()
    # (intensity, wall time from launch, training time = the JCT)
    times = {"ideal": (0.0, 58.0, 40.0), "none": (0.8, 106.0, 88.0), "torchrun": (0.8, 98.0, 80.0),
             "lb-bsp": (0.8, 78.0, 60.0), "nd": (0.8, 61.0, 42.0)}  # fmt: skip
    outcomes = [
        bench.Outcome(column=c, intensity=si, jct_s=j, train_s=t, ok=True, detail={})
        for c, (si, j, t) in times.items()
    ]
    results = bench.summarize(bench.QUICK, outcomes, quick=True, overhead=None)
    assert results["jct_s"] == {
        "0.8": {"none": 88.0, "torchrun": 80.0, "lb-bsp": 60.0, "nd": 42.0, "ideal": 40.0}
    }
    assert results["wall_s"]["0.8"]["nd"] == 61.0
    assert results["speedup_nd_over_none"]["0.8"] == pytest.approx(88 / 42, abs=1e-3)
    assert all(results["targets"].values())  # 42 <= 1.1 x 40 and 88 / 42 >= 2
    text = bench.render_text(results)
    assert "2.10x" in text and "nd / ideal" in text
    md_path = bench.write_results(results, tmp_path / "r" / "s.json")
    assert json.loads((tmp_path / "r" / "s.json").read_text())["jct_s"]["0.8"]["nd"] == 42.0
    md = md_path.read_text()
    assert md_path.suffix == ".md" and "| 0.8 | 88.0 | 80.0 | 60.0 | 42.0 | 40.0 |" in md
    failed = bench.summarize(bench.QUICK, outcomes[:2], quick=True, overhead=None)
    assert failed["jct_s"]["0.8"]["nd"] is None and not any(failed["targets"].values())
    assert "failed" in bench.render_text(failed)


def test_benchmark_full_results_add_the_backup_column_and_the_server_side(tmp_path):
    bench = load_benchmark()
    times = {"ideal": (0.0, 40.0), "none": (0.8, 88.0), "torchrun": (0.8, 80.0),
             "lb-bsp": (0.8, 60.0), "nd": (0.8, 43.0), "backup": (0.8, 70.0),
             "server:ideal": (0.0, 41.0), "server:none": (0.8, 90.0),
             "server:nd": (0.8, 44.0)}  # fmt: skip
    outcomes = [
        bench.Outcome(column=c, intensity=si, jct_s=t + 18, train_s=t, ok=True, detail={})
        for c, (si, t) in times.items()
    ]
    results = bench.summarize(bench.FULL, outcomes, quick=False, overhead=None)
    assert results["jct_s"]["0.8"]["backup"] == 70.0
    assert "server:none" not in results["jct_s"]["0.8"]  # the sides stay apart
    assert results["server"]["jct_s"] == {"0.8": {"none": 90.0, "nd": 44.0, "ideal": 41.0}}
    assert results["server"]["speedup"]["0.8"] == pytest.approx(90 / 44, abs=1e-3)
    assert results["targets"]["server_nd_speedup_over_none_at_0.8>=2.0"] is True
    assert results["server_injections"]["0.8"] == [
        "persistent:role=server,hosts=127.0.0.3,delay=0.32"
    ]
    md = bench.write_results(results, tmp_path / "full.json").read_text()
    assert "| SI | none | torchrun | lb-bsp | nd | ideal | backup |" in md
    assert "| 0.8 | 90.0 | 44.0 | 41.0 | 2.04x (+104.5%) |" in md
    assert "backup: backup:b=1 in PS mode" in md
