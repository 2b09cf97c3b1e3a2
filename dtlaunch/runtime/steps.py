"""Per-step measurements for the Monitor, injected delays, and pending actions.

A step runs from the first batch a worker takes after its previous ``step()``
to the next ``step()``: its batch processing time (AntDT §II). Communication
time is what the script reports with ``job.record_comm(seconds)`` (the
weighted-allreduce helpers do it for you); the rest is compute.

Each step's report goes to the link thread as the step ends; the link sends
them every ``report_every_s`` seconds (the supervisor passes half its control
interval, at most 1 s, in ``DTLAUNCH_REPORT_INTERVAL``), so a policy deciding
every interval sees windows at most half an interval old, and the steps of a
training loop that then hangs are still reported. A message carries at most
``REPORT_MAX_STEPS`` steps. One message an interval rather than one every few
steps: at 1,000 workers of 10 steps/s the supervisor's cost is per message as
much as per step.

Injected stragglers (``dtlaunch run --inject``, AntDT §VII-A-4) sleep when a
step's first batch is taken, i.e. at the start of its compute: they count as
compute time exactly like a slow node would, and, as in the papers' method, they
run alongside the other workers' compute instead of after the step's collective
(a sleep after the allreduce would add to every worker's step). A ``slowdown``
factor scales the previous step's compute time, the last one known by then.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from dtlaunch.inject import InjectionSpec, injected_delay
from dtlaunch.wire.messages import ServerComm, StepReport

REPORT_MAX_STEPS = 32  # steps per StepReports message, at most
REPORT_EVERY_S = 1.0  # the link's default report interval


@dataclass(frozen=True, slots=True)
class TimedReport:
    ended: float  # time.monotonic() when the step ended
    report: StepReport  # age_s is filled in when it is sent


class StepTimer:
    def __init__(
        self,
        *,
        role: str,
        rank: int,
        host: str,
        injections: tuple[InjectionSpec, ...] = (),
        job_start_wall: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._role = role
        self._rank = rank
        self._host = host
        self._injections = injections
        self._job_start = job_start_wall or time.time()
        self._rng = random.Random(seed)  # the same seed everywhere: windows agree
        self._started: float | None = None
        self._comm = 0.0
        self._samples = 0
        self._injected = 0.0  # slept in the current step
        self._wait = 0.0  # waited for the other workers in the current step
        self._last_compute = 0.0  # the previous step's compute, without injected delay
        self._servers: dict[int, tuple[int, float]] = {}  # server -> (bytes, seconds) this step
        self.injected_total_s = 0.0

    def batch_taken(self, records: int) -> None:
        if self._started is None:
            self._started = time.monotonic()
            self._inject()
        self._samples += records

    def _inject(self) -> None:
        if not self._injections:
            return
        delay = injected_delay(
            self._injections,
            role=self._role,
            rank=self._rank,
            host=self._host,
            now=time.time() - self._job_start,
            step_compute_s=self._last_compute,
            rng=self._rng,
        )
        if delay > 0:
            time.sleep(delay)
            self._injected = delay
            self.injected_total_s += delay

    @property
    def samples_in_step(self) -> int:
        """Records taken since the last ``end_step``."""
        return self._samples

    def record_comm(self, seconds: float) -> None:
        if seconds > 0:
            self._comm += seconds

    def record_server(self, server: int, nbytes: int, seconds: float) -> None:
        """One exchange with parameter server ``server`` in this step (PS mode)."""
        moved, spent = self._servers.get(server, (0, 0.0))
        self._servers[server] = (moved + max(0, nbytes), spent + max(0.0, seconds))

    def record_wait(self, seconds: float) -> None:
        """Time spent waiting for other workers at a barrier: neither this worker's
        compute nor its communication, so it is left out of its BPT."""
        if seconds > 0:
            self._wait += seconds

    def end_step(self, step: int, batch_size: int) -> TimedReport:
        """Close the step; returns its report, for the link to send."""
        now = time.monotonic()
        started = self._started if self._started is not None else now
        injected, self._injected = self._injected, 0.0
        compute = max(0.0, now - started - self._comm - self._wait)
        self._last_compute = max(0.0, compute - injected)
        report = StepReport(
            step=step,
            batch_size=batch_size,
            compute_s=compute,
            comm_s=self._comm,
            samples=self._samples,
            injected_s=injected,
            servers=[
                ServerComm(server=j, nbytes=moved, comm_s=spent)
                for j, (moved, spent) in sorted(self._servers.items())
            ],
        )
        self._servers = {}
        self._started, self._comm, self._wait, self._samples = None, 0.0, 0.0, 0
        return TimedReport(ended=now, report=report)
