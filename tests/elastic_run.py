"""One real allreduce job whose host-bound straggler AntDT-ND replaces on a spare
host, shared (session fixture ``elastic_run``) by the regroup tests and by
``replay --policy`` (what-if) tests, so the suite pays for it once."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.jobs import REPO, SCRIPTS, hostfile, run

# nd decides KILL_RESTART about 4 s into training (l_per=4); the replacement then
# imports torch on the spare host while the group trains on, 4.5 s on an idle
# machine, 6-8 s or more under make test. 2400 records (80 steps) often ran out
# first: then the regroup was abandoned after its timeout and the newcomer waited
# out the 120 s stall bound (a 150 s job that failed the phase check). 4800
# records leave the hand-over about twice that time.
DATASET = 4800
POLICY = "nd:l_trans=2,l_per=4,restart_cost=1,min_batch=6"
STEP_S = 0.05
# Rank 2 runs on the second host: 0.05 + 0.07 s a step, 2.4x the others, so
# 1.64x the mean of three: lambda 1.5 calls it persistent, lambda 2.0 does not.
# Shrunk to min_batch (6 of 10) it still looks under 2x: its equal-share BPT
# scales the fixed delay up by 10/6 (see dtlaunch.supervisor.control.monitor).
DELAY_S = 0.07


@dataclass(frozen=True, slots=True)
class ElasticRun:
    run_dir: Path
    ledger: Path
    hosts: tuple[str, str, str]  # two worker hosts and the spare
    result: subprocess.CompletedProcess[str]

    def encode(self) -> dict[str, Any]:
        """As JSON, for the other test worker (see tests/once.py)."""
        result = self.result
        return {
            "run_dir": str(self.run_dir),
            "ledger": str(self.ledger),
            "hosts": list(self.hosts),
            "result": [result.args, result.returncode, result.stdout, result.stderr],
        }

    @classmethod
    def decode(cls, data: dict[str, Any]) -> ElasticRun:
        a0, a1, a2 = data["hosts"]
        return cls(
            run_dir=Path(data["run_dir"]),
            ledger=Path(data["ledger"]),
            hosts=(a0, a1, a2),
            result=subprocess.CompletedProcess(*data["result"]),
        )


def run_elastic_job(sshd: Any, base: Path) -> ElasticRun:
    a0, a1, a2 = sshd.addresses
    hosts = hostfile(sshd, base / "hosts", [f"{a0} slots=2", f"{a1} slots=1", f"{a2} spare"])
    ledger = base / "ledger"
    ledger.mkdir()
    run_dir = base / "run"
    args = [
        "run", "-H", str(hosts), "--workers", "3", "--run-dir", str(run_dir),
        "--dataset-size", str(DATASET), "--shard-size", "60", "--global-batch", "30",
        "--policy", POLICY, "--control-interval", "0.5",
        # Resource contention on one host: moving off it escapes the delay.
        "--inject", f"persistent:role=worker,hosts={a1},delay={DELAY_S}",
        "--output", "0",
        str(SCRIPTS / "elastic_worker.py"), str(ledger), str(STEP_S),
    ]  # fmt: skip
    result = run(args, env=sshd.env(), timeout=240.0, cwd=REPO)
    return ElasticRun(run_dir=run_dir, ledger=ledger, hosts=(a0, a1, a2), result=result)
