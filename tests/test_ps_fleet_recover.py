"""A resumed supervisor's ``ServerFleet`` with a reassignment its predecessor
committed but did not release (a scale-in to two servers, killed right after
the commit): the agents say hello only after the fleet's first poll, so at
first it does not know where the source listens. It must wait for it (record
why), never stop the emptied server meanwhile (the workers' pulls are held
there), complete the reassignment once the server is back, and only then drain
it. Before the fix the recovery ran once at start, failed on the unknown
endpoint, and the scale-in's drain stopped the server that held the workers'
pulls: the job hung until the clients' timeout.

Real servers and clients (``test_psld_reassigner``'s harness); the node table
is a stand-in holding what the fleet asks of it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dtlaunch.events import EventRecorder, MemorySink
from dtlaunch.supervisor.control.loop import ReportIntake
from dtlaunch.supervisor.jobstate.nodes import ProcState
from dtlaunch.supervisor.psfleet.fleet import ServerFleet
from dtlaunch.supervisor.psfleet.placement import PENDING_FILE, PlacementKeeper
from tests.test_psld_reassigner import (
    TIMEOUT_S,
    _begin_and_hold,
    _check_recovered,
    _keeper,
    _train_with,
    peer_keys,  # noqa: F401 (a fixture)
    unmoved,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.integration

SOURCE = 2  # the server the scale-in empties: the committed map has 2 servers


class ResumedNodeTable:
    """The node table as a resumed supervisor has it: every server adopted as
    running, but an endpoint known only once its agent said hello (``back``)."""

    def __init__(self, endpoints: list[str]) -> None:
        self._endpoints = endpoints
        self.back: set[int] = set()
        self.procs = {
            f"server-{r}": SimpleNamespace(
                proc_id=f"server-{r}", role="server", rank=r, state=ProcState.RUNNING,
                host=f"127.0.0.{r + 2}",
            )
            for r in range(len(endpoints))
        }  # fmt: skip
        self.server_target = SOURCE
        self.ps_map_servers = 0
        self.ps_map_blocks = 0
        self.drained: list[int] = []

    def server_endpoint(self, rank: int) -> str:
        return self._endpoints[rank] if rank in self.back else ""

    def server_drained(self, rank: int) -> list[object]:
        # As the node table does, the server is the job's no longer: a stand-in
        # that kept it was drained again by the next poll ([2, 2] in CI).
        self.drained.append(rank)
        self.procs.pop(f"server-{rank}", None)
        return []  # the fleet's own part ends here

    def worker_ranks(self) -> list[int]:
        return [0, 1]


async def _resumed_fleet(run_dir: Path, endpoints: list[str], keys, sink: MemorySink) -> list[str]:
    keeper = PlacementKeeper(run_dir, EventRecorder([sink]))
    assert keeper.pending is not None and keeper.committed
    state = ResumedNodeTable(endpoints)
    state.back = {0, 1}  # the source's agent is not back yet
    recorder = EventRecorder([sink])
    fleet = ServerFleet(
        state=state,  # type: ignore[arg-type]
        keys=keys,
        recorder=recorder,
        apply=lambda commands: None,
        clock=time.monotonic,
        intake=ReportIntake(None, recorder=recorder, clock=time.monotonic),
        interval=0.05,
        placements=keeper,
    )

    def phases() -> list[str]:
        return [e.data.get("phase", "") for e in sink.events if e.kind == "ps_reassign"]

    polling = asyncio.create_task(fleet.run())  # polls every interval; closes its links
    try:
        await asyncio.sleep(0.5)
        # Waiting, said once, and nothing stopped: the workers' pulls wait at the source.
        assert phases() == ["recover_waiting"], phases()
        assert state.drained == []
        assert keeper.pending is not None
        state.back.add(SOURCE)
        deadline = time.monotonic() + TIMEOUT_S
        while keeper.pending is not None or not state.drained:
            assert time.monotonic() < deadline, (phases(), state.drained)
            await asyncio.sleep(0.05)
    finally:
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
    assert phases() == ["recover_waiting", "recovered"]
    assert state.drained == [SOURCE]  # only once the blocks were released
    return [e.data["outcome"] for e in sink.events if e.data.get("phase") == "recovered"]


def test_a_resumed_fleet_recovers_once_the_source_is_back_and_only_then_drains(
    peer_keys,  # noqa: F811
    unmoved,  # noqa: F811
    tmp_path,
):
    keys = peer_keys
    outcome: list[str] = []
    sink = MemorySink()

    def supervisor(keeper: PlacementKeeper, endpoints: list[str]) -> None:
        # Killed after the commit of a scale-in from 3 to 2 servers.
        _begin_and_hold(keeper, endpoints, keys, commit=True, servers=SOURCE)
        outcome.extend(asyncio.run(_resumed_fleet(tmp_path, endpoints, keys, sink)))
        assert not (tmp_path / PENDING_FILE).exists()
        keeper.placement = _keeper(tmp_path).placement  # the clients ask the old object

    with _train_with(keys, tmp_path, supervisor) as (run, endpoints, keeper):
        _check_recovered(run, endpoints, keeper, outcome, True, unmoved, keys)
