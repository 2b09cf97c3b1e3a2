"""The supervisor's ``BlockReassigner`` driving real servers (PSLD §5.2), with the
placement keeper's two-phase record in a run directory: a reassignment carried
out mid-training, and the two crash points a resumed supervisor must handle
(before the commit: roll back; after it: complete). Each run must end bit for
bit where the run without a reassignment does (``test_ps_reassign``'s harness).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dtlaunch.events import EventRecorder
from dtlaunch.ps import Placement
from dtlaunch.ps.control import ServerControl
from dtlaunch.ps.placement_map import from_wire, to_wire
from dtlaunch.supervisor.psfleet.placement import PENDING_FILE, PlacementKeeper
from dtlaunch.supervisor.psfleet.reassign import (
    PACE_UPDATES,
    BlockReassigner,
    step_time,
    subset,
)
from dtlaunch.wire.keys import PeerKeys
from dtlaunch.wire.messages import PsUpdate
from tests.test_ps_reassign import (
    STEPS,
    STRAGGLE_S,
    TIMEOUT_S,
    StaticRun,
    assert_same_run,
    new_keys,
    run_threads,
    server_state,
    serving,
    training,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def peer_keys(tmp_path: Path) -> PeerKeys:
    return new_keys(tmp_path)


@pytest.fixture(scope="module")
def unmoved(tmp_path_factory: pytest.TempPathFactory) -> StaticRun:
    """The run without a reassignment (as ``test_ps_reassign``'s ``static_run``)."""
    keys = new_keys(tmp_path_factory.mktemp("static"))
    with serving(keys, 3) as endpoints, training(endpoints, keys) as run:
        run_threads([run.worker(0), run.worker(1)])
        placement = run.clients[0].placement
        return StaticRun(
            params=[p.detach().clone() for p in run.models[0].parameters()],
            state=server_state(endpoints, keys, placement),
            placement=placement,
        )


def _keeper(run_dir: Path) -> PlacementKeeper:
    return PlacementKeeper(run_dir, EventRecorder([]))


def _reassigner(keeper: PlacementKeeper, endpoints: list[str], keys: PeerKeys) -> BlockReassigner:
    return BlockReassigner(
        keeper=keeper,
        endpoint_of=lambda j: endpoints[j],
        keys=keys,
        timeout=TIMEOUT_S,
        stop=threading.Event(),
    )


def _wait_for_version(endpoint: str, keys: PeerKeys, version: int) -> None:
    with ServerControl(endpoint, keys, timeout=TIMEOUT_S) as ctl:
        deadline = time.monotonic() + TIMEOUT_S
        while ctl.stats().version < version:
            assert time.monotonic() < deadline, f"version {version} not reached"
            time.sleep(0.005)


def _moves(old: Placement) -> list[int]:
    """Server 2's blocks to 0 and 1, one of 0's to 1: the new owner list."""
    owner = list(old.owner)
    on_2 = [b.block_id for b in old.blocks_on(2)]
    owner[on_2[0]] = 0
    for b in on_2[1:]:
        owner[b] = 1
    owner[old.blocks_on(0)[0].block_id] = 1
    return owner


@contextlib.contextmanager
def _train_with(
    keys: PeerKeys,
    run_dir: Path,
    supervisor: Callable[[PlacementKeeper, list[str]], None],
    *,
    straggle_s: float = STRAGGLE_S,
) -> Iterator[tuple[Any, list[str], PlacementKeeper]]:
    """Two workers train while ``supervisor(keeper, endpoints)`` acts from a thread
    once the servers are at version 3 (worker 1 ``straggle_s`` slower a step);
    the clients follow the keeper's map. The servers serve until the caller's
    block ends."""
    keeper = _keeper(run_dir)
    with serving(keys, 3) as endpoints:

        def source() -> tuple[Placement, list[str]]:
            assert keeper.placement is not None
            placement = from_wire(keeper.placement)  # a scale-in's map has fewer servers
            return placement, endpoints[: placement.servers]

        with training(endpoints, keys, source=source) as run:
            keeper.register(0, to_wire(run.clients[0].placement))

            def act() -> None:
                _wait_for_version(endpoints[0], keys, 3)
                supervisor(keeper, endpoints)

            run_threads([run.worker(0), run.worker(1, straggle_s), act])
            yield run, endpoints, keeper


def _reassign_once(keys: Any, done: list[Any]) -> Any:
    """The supervisor's part: carry out ``_moves`` once, its outcome into ``done``."""

    def supervisor(keeper: PlacementKeeper, endpoints: list[str]) -> None:
        assert keeper.placement is not None
        owner = _moves(from_wire(keeper.placement))
        done.append(_reassigner(keeper, endpoints, keys).carry_out(owner))

    return supervisor


def test_the_reassigner_moves_blocks_mid_training_and_the_run_is_unchanged(
    peer_keys, unmoved, tmp_path
):
    keys = peer_keys
    done: list[Any] = []
    supervisor = _reassign_once(keys, done)
    with _train_with(keys, tmp_path, supervisor) as (run, endpoints, keeper):
        _check_reassigned(run, endpoints, keeper, done, unmoved, keys, tmp_path)


def test_with_slow_steps_the_blocks_move_at_the_very_next_version(peer_keys, unmoved, tmp_path):
    """Steps of 0.25 s (>= SLOW_STEP_S): the fence is the version after the newest,
    not two ahead, so the workers wait no further slow step for the move."""
    keys = peer_keys
    done: list[Any] = []
    supervisor = _reassign_once(keys, done)
    with _train_with(keys, tmp_path, supervisor, straggle_s=0.25) as (run, endpoints, keeper):
        _check_reassigned(run, endpoints, keeper, done, unmoved, keys, tmp_path)
    [reassigned] = done
    assert reassigned.lead == 1, reassigned


def test_step_time_is_the_median_gap_between_a_servers_newest_updates():
    def updates(*ended: float) -> list[PsUpdate]:
        return [
            PsUpdate(version=v, step=v - 1, update_s=0.0, samples=1, applied=[0], ended_s=e)
            for v, e in enumerate(ended, start=1)
        ]

    assert step_time([]) == 0.0
    assert step_time(updates(5.0)) == 0.0  # one update: no gap yet
    assert step_time(updates(0.0, 0.0)) == 0.0  # no clock (an old server): unknown
    assert step_time(updates(1.0, 1.2, 1.4, 3.0)) == pytest.approx(0.2)  # one stall
    # Only the newest PACE_UPDATES count: the fast start is forgotten.
    slow = [0.01 * i for i in range(20)] + [0.2 + 0.5 * i for i in range(1, PACE_UPDATES + 1)]
    assert step_time(updates(*slow)) == pytest.approx(0.5)


def _check_reassigned(run, endpoints, keeper, done, unmoved, keys, tmp_path) -> None:
    [reassigned] = done
    moved = len(unmoved.placement.blocks_on(2)) + 1
    assert (reassigned.version, reassigned.blocks, reassigned.tries) == (1, moved, 1)
    assert reassigned.at_version > 3 and reassigned.lead in (1, 2), reassigned
    assert 0 < reassigned.pause_s < 3.0
    assert keeper.pending is None and not (tmp_path / PENDING_FILE).exists()
    assert keeper.placement is not None
    new = from_wire(keeper.placement)
    assert [c.placement.version for c in run.clients] == [1, 1]
    assert run.dropped == []
    assert_same_run(run, endpoints, keys, new, unmoved)


def _begin_and_hold(
    keeper: PlacementKeeper,
    endpoints: list[str],
    keys: PeerKeys,
    *,
    commit: bool,
    servers: int | None = None,
):
    """What a supervisor killed mid-way left: the pending record, the sources'
    blocks on hold at the fence, and (``commit``) the imports and the new map
    (of ``servers`` servers: a scale-in; default: as many as now)."""
    assert keeper.placement is not None
    with ServerControl(endpoints[0], keys, timeout=TIMEOUT_S) as ctl:
        fence = ctl.stats().version + 2
    pending = keeper.begin(_moves(from_wire(keeper.placement)), fence, servers)
    exported = {}
    giving: dict[int, list[int]] = {}
    for move in pending.moves:
        giving.setdefault(move.source, []).extend(move.blocks)
    results: dict[int, object] = {}

    def export(source: int) -> None:
        with ServerControl(endpoints[source], keys, timeout=TIMEOUT_S) as ctl:
            results[source] = ctl.export(
                sorted(giving[source]), at_version=fence, remove=False, hold=True
            )

    threads = [threading.Thread(target=export, args=(s,)) for s in giving]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    exported = results
    if commit:
        for move in pending.moves:
            with ServerControl(endpoints[move.target], keys, timeout=TIMEOUT_S) as ctl:
                ctl.import_blocks(subset(exported[move.source], move.blocks))  # type: ignore[arg-type]
        keeper.commit()
    # The workers are held at the fence now, and nobody will release them...
    time.sleep(0.2)
    for endpoint in endpoints:
        with ServerControl(endpoint, keys, timeout=TIMEOUT_S) as ctl:
            assert ctl.stats().version == fence


@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "after-commit"])
def test_a_resumed_supervisor_completes_or_rolls_back_what_it_finds(
    peer_keys, unmoved, tmp_path, committed
):
    keys = peer_keys
    outcome = []

    def supervisor(keeper: PlacementKeeper, endpoints: list[str]) -> None:
        _begin_and_hold(keeper, endpoints, keys, commit=committed)
        # ...until a new supervisor reads the run directory and recovers.
        resumed = _keeper(tmp_path)
        assert resumed.pending is not None and resumed.committed is committed
        outcome.append(_reassigner(resumed, endpoints, keys).recover())
        assert resumed.pending is None and not (tmp_path / PENDING_FILE).exists()
        keeper.placement = resumed.placement  # the clients ask the old object

    with _train_with(keys, tmp_path, supervisor) as (run, endpoints, keeper):
        _check_recovered(run, endpoints, keeper, outcome, committed, unmoved, keys)


def _check_recovered(run, endpoints, keeper, outcome, committed, unmoved, keys) -> None:
    assert outcome == ["completed" if committed else "rolled back"]
    assert keeper.placement is not None
    placement = from_wire(keeper.placement)
    assert placement.version == (1 if committed else 0)
    assert [c.placement.version for c in run.clients] == [placement.version] * 2
    assert run.dropped == []
    for j, endpoint in enumerate(endpoints[: placement.servers]):  # a scale-in's stay behind
        with ServerControl(endpoint, keys, timeout=TIMEOUT_S) as ctl:
            stats = ctl.stats()
            assert stats.version == STEPS
            assert stats.blocks == [b.block_id for b in placement.blocks_on(j)]
    assert_same_run(run, endpoints, keys, placement, unmoved)
