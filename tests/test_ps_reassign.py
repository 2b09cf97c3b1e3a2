"""Live block reassignment between running servers (PSLD §5.2): servers and clients.

In-process ``PsServer``s on threads, real ZeroMQ + CURVE, ``Client``s on
threads. A test thread drives the protocol as the supervisor does
(``psfleet.reassign``): ``export(hold=True)`` at a fence version on each source,
``import_blocks`` at each target, the map committed (the clients'
``placement_source`` answers it from then on), ``release`` at the sources; or,
rolled back, ``hold_end`` at the sources and ``release(..., 0)`` at the targets.

Two workers push 4 records each: a power of two, so every weighted gradient is
exact and a step's aggregate does not depend on which push came first. A run
with a reassignment in the middle must then end bit for bit where the static
run does, Adam's state included: no update lost, none applied twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from dtlaunch.errors import PsError
from dtlaunch.inject import parse_injections
from dtlaunch.ps import Client, Placement
from dtlaunch.ps.control import ExportedBlocks, ServerControl
from dtlaunch.ps.placement_map import to_wire
from dtlaunch.ps.server import PsServer, ServerConfig
from dtlaunch.ps.transport import ServerLink, new_context
from dtlaunch.supervisor.psfleet.placement import BlockMove, PendingReassignment, PlacementKeeper
from dtlaunch.supervisor.psfleet.reassign import BlockReassigner, subset
from dtlaunch.wire.keys import PeerKeys, create_run_keys, load_peer_keys, write_peer_keys
from dtlaunch.wire.messages import (
    Message,
    PsExport,
    PsHoldEnd,
    PsImport,
    PsPull,
    PsPush,
    PsPushAck,
    PsRelease,
    PsReply,
    PsStats,
    PsStatsRequest,
)

pytestmark = pytest.mark.integration

BLOCK_BYTES = 96  # the first weight is cut in 4 blocks of 4 rows: 7 blocks in all
X = torch.randn(8, 6, generator=torch.Generator().manual_seed(21))
Y = torch.randn(8, 1, generator=torch.Generator().manual_seed(22))
ROWS = (slice(0, 4), slice(4, 8))  # 4 records per worker: see the module docstring
RECORDS = 4
STEPS = 14
STRAGGLE_S = 0.03  # worker 1 computes this much longer: worker 0's pulls wait at the servers
TIMEOUT_S = 20.0


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def gradients(model: torch.nn.Module, rows: slice) -> None:
    model.zero_grad()
    torch.nn.functional.mse_loss(model(X[rows]), Y[rows]).backward()


def new_keys(base: Path) -> PeerKeys:
    write_peer_keys(base / "keys", create_run_keys(base / "run-keys").peer())
    return load_peer_keys(base / "keys")


@pytest.fixture
def keys(tmp_path: Path) -> PeerKeys:
    return new_keys(tmp_path)


@contextlib.contextmanager
def serving(keys: PeerKeys, count: int, workers=(0, 1), **config) -> Iterator[list[str]]:
    """``count`` servers on threads of this process; their endpoints."""
    servers = [
        PsServer(ServerConfig(rank=i, workers=workers, **config), keys) for i in range(count)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=s.serve, args=(stop,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield [s.endpoint for s in servers]
    finally:
        stop.set()
        for t in threads:
            t.join(10)


def control(endpoint: str, keys: PeerKeys) -> ServerControl:
    return ServerControl(endpoint, keys, timeout=TIMEOUT_S)


def client(model, endpoints, keys, worker, **kw) -> Client:
    kw.setdefault("timeout", TIMEOUT_S)
    return Client(
        model, "adam", lr=0.05, servers=endpoints, keys=keys, worker=worker,
        block_bytes=BLOCK_BYTES, **kw,
    )  # fmt: skip


def run_threads(targets: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


class StepBudget:
    """How many steps the workers of a run train: STEPS, or, once ``extend`` was
    called, as many as it said (until then they train on). A test whose control
    thread must act while training still runs extends it when done: a fixed
    count raced the thread (on a loaded machine training could end before a
    reassignment's fence, which then was never reached)."""

    def __init__(self, *, open_ended: bool = False) -> None:
        self.total: int | None = None if open_ended else STEPS

    def more(self, step: int) -> bool:
        total = self.total
        return total is None or step < total

    def extend(self, servers_version: int) -> int:
        """End at least two steps past the servers' ``servers_version`` (a worker
        may be one step ahead of it), and no sooner than STEPS; the total."""
        self.total = max(STEPS, servers_version + 3)
        return self.total


@dataclass
class Training:
    """Two workers' BSP run: their models, clients and the pushes they saw dropped."""

    models: list[torch.nn.Module]
    clients: list[Client]
    dropped: list[int]

    def worker(
        self, w: int, straggle_s: float = 0.0, budget: StepBudget | None = None
    ) -> Callable[[], None]:
        steps = budget or StepBudget()

        def train() -> None:
            ps, model = self.clients[w], self.models[w]
            step = 0
            while steps.more(step):
                step += 1
                ps.pull()
                gradients(model, ROWS[w])
                time.sleep(straggle_s)
                ps.push(RECORDS)
                self.dropped += ps.dropped
            ps.pull()

        return train


@contextlib.contextmanager
def training(endpoints, keys, source=None) -> Iterator[Training]:
    models = [make_model() for _ in range(2)]  # here: the global RNG is not for threads
    clients = [client(m, endpoints, keys, w, placement_source=source) for w, m in enumerate(models)]
    try:
        yield Training(models, clients, [])
    finally:
        for c in clients:
            c.close()


BlockState = tuple[int, dict[str, torch.Tensor]]  # optimizer step, param and state tensors


def server_state(endpoints, keys, placement: Placement) -> dict[int, BlockState]:
    """Every block's parameter and optimizer state, copied from the server that holds it."""
    state: dict[int, BlockState] = {}
    for j, endpoint in enumerate(endpoints):
        blocks = [b.block_id for b in placement.blocks_on(j)]
        if not blocks:
            continue
        with control(endpoint, keys) as ctl:
            exported = ctl.export(blocks, remove=False)
            tensors = exported.tensors()
            for record in exported.message.blocks:
                b = record.block.block_id
                state[b] = (record.step, {k: v.clone() for k, v in tensors[b].items()})
    return state


@dataclass(frozen=True)
class StaticRun:
    params: list[torch.Tensor]
    state: dict[int, BlockState]
    placement: Placement


@pytest.fixture(scope="module")
def static_run(tmp_path_factory: pytest.TempPathFactory) -> StaticRun:
    """The run without a reassignment that every reassigned run must equal."""
    keys = new_keys(tmp_path_factory.mktemp("static"))
    with serving(keys, 3) as endpoints, training(endpoints, keys) as run:
        run_threads([run.worker(0), run.worker(1)])
        assert run.dropped == []
        placement = run.clients[0].placement
        return StaticRun(
            params=[p.detach().clone() for p in run.models[0].parameters()],
            state=server_state(endpoints, keys, placement),
            placement=placement,
        )


def assert_same_run(run: Training, endpoints, keys, placement: Placement, static: StaticRun):
    for model in run.models:
        for p, q in zip(model.parameters(), static.params, strict=True):
            assert torch.equal(p.detach(), q)
    state = server_state(endpoints, keys, placement)
    assert state.keys() == static.state.keys()
    for b, (step, tensors) in static.state.items():
        assert state[b][0] == step, b
        assert state[b][1].keys() == tensors.keys()
        for name, value in tensors.items():
            assert torch.equal(state[b][1][name], value), (b, name)


# ------------------------------------------------------------ the supervisor's part


@dataclass
class Reassigned:
    fence: int
    tries: int
    held_s: float  # from the first export's answer to the last release (the workers' pause)
    versions_held: list[int]  # every server's version while the blocks were held


class Controls:
    """A ``ServerControl`` per server for one thread, closed with it."""

    def __init__(self, endpoints: list[str], keys: PeerKeys) -> None:
        self.of = [control(e, keys) for e in endpoints]

    def versions(self) -> list[int]:
        return [c.stats().version for c in self.of]

    def close(self) -> None:
        for c in self.of:
            c.close()


def export_on_hold(
    endpoint: str, blocks: list[int], *, keys: PeerKeys, fence: int
) -> tuple[ExportedBlocks | PsError, float]:
    """The source's answer, on a thread and a control of its own (exports wait at
    once), and when it came."""
    with control(endpoint, keys) as ctl:
        try:
            return ctl.export(blocks, at_version=fence, remove=False, hold=True), time.monotonic()
        except PsError as exc:
            return exc, time.monotonic()


def reassign(
    endpoints: list[str],
    keys: PeerKeys,
    new: Placement,
    old: Placement,
    committed: list[Placement],
    *,
    roll_back: bool = False,
    leads: tuple[int, ...] = (2, 4, 8),
) -> Reassigned:
    """Move blocks from ``old`` to ``new``'s owners as ``psfleet.reassign`` does:
    a fence ``lead`` versions ahead, further ahead when a source refused it."""
    pairs: dict[tuple[int, int], list[int]] = {}
    for block, source, target in old.moves_to(new):
        pairs.setdefault((source, target), []).append(block)
    giving: dict[int, list[int]] = {}
    for (source, _), blocks in pairs.items():
        giving.setdefault(source, []).extend(blocks)
    controls = Controls(endpoints, keys)
    try:
        refusals: list[PsError] = []
        for tries, lead in enumerate(leads, start=1):
            fence = max(controls.versions()) + lead
            export = functools.partial(export_on_hold, keys=keys, fence=fence)
            with ThreadPoolExecutor(len(giving)) as pool:
                got = pool.map(export, [endpoints[s] for s in giving], giving.values())
                answers = dict(zip(giving, got, strict=True))
            refusals = [a for a, _ in answers.values() if isinstance(a, PsError)]
            if refusals:
                for source, (answer, _) in answers.items():
                    if not isinstance(answer, PsError):
                        controls.of[source].hold_end(giving[source])
                continue
            first_hold = min(at for _, at in answers.values())
            for (source, target), blocks in pairs.items():
                exported = answers[source][0]
                assert isinstance(exported, ExportedBlocks) and exported.message.version == fence
                controls.of[target].import_blocks(subset(exported, blocks))
            time.sleep(0.1)  # the workers stay held, however long this takes
            versions = controls.versions()
            if roll_back:  # the targets first: the workers let go push the old map's blocks
                for (_, target), blocks in pairs.items():
                    controls.of[target].release(blocks, 0)
                for source, blocks in giving.items():
                    controls.of[source].hold_end(blocks)
            else:
                committed.append(new)
                for source, blocks in giving.items():
                    controls.of[source].release(blocks, new.version)
            return Reassigned(fence, tries, time.monotonic() - first_hold, versions)
        raise AssertionError(f"every fence was refused: {refusals}")
    finally:
        controls.close()


@contextlib.contextmanager
def reassigned_run(
    keys: PeerKeys, moves_from: Callable[[Placement], dict[int, int]], *, roll_back: bool = False
) -> Iterator[tuple[Training, list[str], Reassigned, Placement, Placement]]:
    """Train with a reassignment (``moves_from(the first map)``) from a test
    thread once the servers are at version 3; the run, the endpoints, what the
    reassignment did, the old map and the new one."""
    with serving(keys, 3) as endpoints:
        committed: list[Placement] = []
        with training(endpoints, keys, source=lambda: committed[-1]) as run:
            old = run.clients[0].placement
            committed.append(old)
            new = old.reassign(moves_from(old))
            done: list[Reassigned] = []

            def supervisor() -> None:
                with control(endpoints[0], keys) as ctl:
                    while ctl.stats().version < 3:
                        time.sleep(0.005)
                done.append(reassign(endpoints, keys, new, old, committed, roll_back=roll_back))

            run_threads([run.worker(0), run.worker(1, STRAGGLE_S), supervisor])
            yield run, endpoints, done[0], old, new


def test_a_reassignment_mid_training_ends_where_the_static_run_does(keys, static_run):
    """Server 2 gives all its blocks away, to 0 and 1, and 0 gives one to 1."""

    def moves(old: Placement) -> dict[int, int]:
        on_0, on_2 = old.blocks_on(0), old.blocks_on(2)
        assert len(on_2) >= 2 and on_0
        return {on_2[0].block_id: 0, **{b.block_id: 1 for b in on_2[1:]}, on_0[0].block_id: 1}

    with reassigned_run(keys, moves) as (run, endpoints, done, old, new):
        assert done.tries == 1, done  # the exports came before the fence: none refused
        # Held: no server went past the fence before the release.
        assert done.versions_held == [done.fence] * 3, done
        assert 0.1 <= done.held_s < 3.0, done
        assert run.dropped == []
        assert [c.placement.version for c in run.clients] == [new.version] * 2 == [1, 1]
        assert [c.placement.owner for c in run.clients] == [new.owner] * 2
        assert new.blocks_on(2) == ()
        for j, endpoint in enumerate(endpoints):
            with control(endpoint, keys) as ctl:
                stats = ctl.stats()
                assert stats.version == STEPS
                assert stats.blocks == [b.block_id for b in new.blocks_on(j)]
        assert_same_run(run, endpoints, keys, new, static_run)
        assert old.owner == static_run.placement.owner


def test_blocks_move_both_ways_between_two_servers_at_once(keys, static_run):
    """Servers 0 and 1 swap a block: each is a source and a target."""

    def moves(old: Placement) -> dict[int, int]:
        return {old.blocks_on(0)[0].block_id: 1, old.blocks_on(1)[0].block_id: 0}

    with reassigned_run(keys, moves) as (run, endpoints, done, _, new):
        assert done.tries == 1 and done.versions_held == [done.fence] * 3, done
        assert run.dropped == []
        assert [c.placement.version for c in run.clients] == [1, 1]
        assert_same_run(run, endpoints, keys, new, static_run)


def test_a_rolled_back_reassignment_leaves_training_on_the_old_placement(keys, static_run):
    def moves(old: Placement) -> dict[int, int]:
        return {old.blocks_on(2)[0].block_id: 0}

    with reassigned_run(keys, moves, roll_back=True) as (run, endpoints, done, old, _):
        assert done.versions_held == [done.fence] * 3, done  # held until the hold ended
        assert run.dropped == []
        assert [c.placement.version for c in run.clients] == [0, 0]
        for j, endpoint in enumerate(endpoints):
            with control(endpoint, keys) as ctl:  # the target dropped what it imported
                assert ctl.stats().blocks == [b.block_id for b in old.blocks_on(j)]
        assert_same_run(run, endpoints, keys, old, static_run)


# ------------------------------------------------------------------ one worker, by hand


def step(ps: Client, model: torch.nn.Module) -> None:
    ps.pull()
    gradients(model, ROWS[0])
    ps.push(RECORDS)


def test_a_hold_whose_fence_has_passed_is_refused_and_changes_nothing(keys):
    with serving(keys, 2, workers=(0,)) as endpoints:
        model = make_model()
        with contextlib.ExitStack() as stack, client(model, endpoints, keys, 0, timeout=5.0) as ps:
            step(ps, model)
            step(ps, model)  # both servers at version 2; the next pull asks for it
            blocks = [b.block_id for b in ps.placement.blocks_on(0)]
            ctl = stack.enter_context(control(endpoints[0], keys))
            with pytest.raises(PsError, match="at version 2, past the fence 1"):
                ctl.export(blocks, at_version=1, remove=False, hold=True)
            ps.pull()  # version 2, answered at once: nothing is held
            with pytest.raises(PsError, match=r"a pull of version 2 was answered with blocks"):
                ctl.export(blocks, at_version=2, remove=False, hold=True)
            assert ctl.hold_end(blocks) == 2  # nothing held: a no-op, answered
            gradients(model, ROWS[0])
            ps.push(RECORDS)
            step(ps, model)
            ps.pull()
            assert ps.versions == [4, 4] and ps.placement.version == 0
            assert ctl.stats().blocks == blocks


def in_order(endpoint: str, keys: PeerKeys, *requests: tuple[Message, list[Any]]) -> list[Message]:
    """Send ``requests`` on one connection, so the server takes them in this
    order; their answers, in the order of the requests."""
    ctx = new_context()
    link = ServerLink(ctx, endpoint, keys, b"in-order")
    try:
        for msg, payloads in requests:
            link.send(msg, payloads)
        answers: dict[int, Message] = {}
        while len(answers) < len(requests):
            assert link.sock.poll(5000), f"answers so far: {answers}"
            got = link.recv_now()
            assert got is not None
            answers[getattr(got[0], "request_id", 0)] = got[0]
        return [answers[getattr(msg, "request_id", 0)] for msg, _ in requests]
    finally:
        link.close()
        ctx.term()


def phantom_push(placement: Placement, server: int, step: int) -> tuple[PsPush, list[Any]]:
    """Worker 7's push of zeros with no records (a member that adds nothing)."""
    blocks = placement.blocks_on(server)
    ids = [b.block_id for b in blocks]
    push = PsPush(request_id=3, worker=7, step=step, samples=0, blocks=ids)
    return push, [torch.zeros(b.shape).numpy() for b in blocks]


def import_request(exported: ExportedBlocks) -> tuple[PsImport, list[Any]]:
    """What ``ServerControl.import_blocks`` sends."""
    msg = exported.message
    request = PsImport(request_id=1, version=msg.version, optimizer=msg.optimizer,
                       blocks=msg.blocks)  # fmt: skip
    return request, list(exported.frames)


def test_a_seeded_target_behind_the_fence_takes_the_import_once_there(keys, tmp_path):
    """The target's step 1 also waits for a worker 7 (a membership of its own), so
    it is still at version 1 when the source exports at fence 2."""
    static_keys = new_keys(tmp_path / "static")
    expected = make_model()
    with (
        serving(static_keys, 2, workers=(0,)) as static_endpoints,
        client(expected, static_endpoints, static_keys, 0) as ps,
    ):
        for _ in range(5):
            step(ps, expected)
        ps.pull()
    with (
        serving(keys, 2, workers=(0,)) as endpoints,
        control(endpoints[0], keys) as source,
        control(endpoints[1], keys) as target,
    ):
        model = make_model()
        committed: list[Placement] = []
        with client(model, endpoints, keys, 0, placement_source=lambda: committed[-1]) as ps:
            old = ps.placement
            step(ps, model)
            target.membership([0, 7])
            step(ps, model)
            assert (source.stats().version, target.stats().version) == (2, 1)
            moving = [old.blocks_on(0)[0].block_id]
            exported = source.export(moving, at_version=2, remove=False, hold=True)
            # One connection: the server takes them in this order. The stats show
            # the import waiting; worker 7's push makes version 2, and it is taken.
            imported, stats, ack = in_order(
                endpoints[1],
                keys,
                import_request(exported),
                (PsStatsRequest(request_id=2), []),
                phantom_push(old, 1, 1),
            )
            assert isinstance(stats, PsStats) and stats.version == 1
            assert stats.blocks == [b.block_id for b in old.blocks_on(1)]
            assert isinstance(ack, PsPushAck) and ack.accepted and ack.version == 2
            assert isinstance(imported, PsReply) and imported.ok and imported.version == 2
            target.membership([0])
            new = old.reassign({moving[0]: 1})
            assert target.stats().blocks == [b.block_id for b in new.blocks_on(1)]
            committed.append(new)
            source.release(moving, new.version)
            step(ps, model)  # its pull is refused by the source, then follows the map
            step(ps, model)
            assert ps.placement.version == 1 and ps.versions == [3, 3]
            # A target ahead of an import refuses it: the blocks would be behind it.
            behind = source.export([b.block_id for b in new.blocks_on(0)], remove=False)
            step(ps, model)
            with pytest.raises(PsError, match="at version 5, so they would miss the steps"):
                target.import_blocks(behind)
            assert target.stats().blocks == [b.block_id for b in new.blocks_on(1)]
            ps.pull()
            assert ps.versions == [5, 5]
        for p, q in zip(model.parameters(), expected.parameters(), strict=True):
            assert torch.equal(p.detach(), q.detach())


def test_a_fence_that_only_held_workers_could_bring_the_target_to_is_seen_as_stuck(keys):
    """Target server 1's step 1 waits for worker 7, and worker 7's pull waits at
    source server 0's fence 2: the target never gets to the fence, so the import
    would wait for good. The servers say so (``waiting_for``, ``held``) and the
    reassigner's watch names it, as soon as the pull is held and not before."""
    model = make_model()
    with (
        serving(keys, 2, workers=(0,)) as endpoints,
        control(endpoints[0], keys) as source,
        control(endpoints[1], keys) as target,
        client(model, endpoints, keys, 0) as ps,
    ):
        old = ps.placement
        step(ps, model)
        target.membership([0, 7])
        step(ps, model)
        assert (source.stats().version, target.stats().version) == (2, 1)
        moving = [b.block_id for b in old.blocks_on(0)]
        source.export(moving, at_version=2, remove=False, hold=True)
        pending = PendingReassignment(
            placement=to_wire(old.reassign({b: 1 for b in moving})),
            at_version=2,
            moves=(BlockMove(source=0, target=1, blocks=tuple(moving)),),
        )
        watch = BlockReassigner(
            keeper=PlacementKeeper.__new__(PlacementKeeper),  # the watch reads no map
            endpoint_of=lambda j: endpoints[j],
            keys=keys,
            timeout=TIMEOUT_S,
            stop=threading.Event(),
        )
        assert target.stats().waiting_for == [7] and source.stats().held == []
        assert watch._stuck(pending) == ""  # worker 7 may still push
        ctx = new_context()
        phantom = ServerLink(ctx, endpoints[0], keys, b"worker-7")
        try:
            phantom.send(PsPull(request_id=1, min_version=2, blocks=moving, worker=7))
            deadline = time.monotonic() + TIMEOUT_S
            while source.stats().held != [7]:
                assert time.monotonic() < deadline, "worker 7's pull is not held"
                time.sleep(0.01)
            why = watch._stuck(pending)
            assert "server 1 is at version 1, below the fence" in why and "[7]" in why, why
            source.hold_end(moving)  # the pull is answered; nothing is stuck any more
            assert phantom.sock.poll(5000)
            assert source.stats().held == []
        finally:
            phantom.close()
            ctx.term()


def test_a_late_push_meeting_released_blocks_counts_as_dropped(keys):
    """BACKUP_WORKERS(1): worker 0's push applies step 0 alone; the blocks move at
    fence 1; worker 1's late push of step 0 meets the released source."""
    with contextlib.ExitStack() as stack, serving(keys, 2, backup=1) as endpoints:
        source, target = (stack.enter_context(control(e, keys)) for e in endpoints)
        models = [make_model() for _ in range(2)]
        committed: list[Placement] = []
        clients = [
            client(m, endpoints, keys, w, placement_source=lambda: committed[-1])
            for w, m in enumerate(models)
        ]
        try:
            old = clients[0].placement
            committed.append(old)
            for w in (0, 1):
                clients[w].pull()
                gradients(models[w], ROWS[w])
            clients[0].push(RECORDS)  # step 0 applies with worker 0 alone: version 1
            assert clients[0].dropped == []
            moving = [old.blocks_on(0)[0].block_id]
            new = old.reassign({moving[0]: 1})
            exported = source.export(moving, at_version=1, remove=False, hold=True)
            target.import_blocks(exported)
            committed.append(new)
            source.release(moving, new.version)
            clients[1].push(RECORDS)  # late, and naming blocks the source let go
            assert clients[1].dropped == [0, 1]
            assert clients[1].placement.version == 1
            clients[1].pull()  # what is there: version 1, from the new owners
            assert clients[1].versions == [1, 1]
            gradients(models[1], ROWS[1])
            clients[1].push(RECORDS)  # names the blocks of the new map, or it is refused
            assert clients[1].dropped == []
            clients[0].pull()
            assert clients[0].placement.version == 1
            assert target.stats().version == source.stats().version == 2
        finally:
            for c in clients:
                c.close()


def test_a_rolled_back_request_still_waiting_never_takes_effect(keys):
    """An export on hold still waiting for its fence when the hold ends, and an
    import still waiting for its version when the target drops the blocks, are
    refused: neither may hold or add blocks after the rollback."""
    with serving(keys, 2, workers=(0,)) as endpoints:
        model = make_model()
        with (
            client(model, endpoints, keys, 0, timeout=5.0) as ps,
            control(endpoints[0], keys) as source,
            control(endpoints[1], keys) as target,
        ):
            step(ps, model)  # version 1
            moving = [ps.placement.blocks_on(0)[0].block_id]
            export = PsExport(request_id=1, blocks=moving, at_version=2, remove=False, hold=True)
            refused, ended = in_order(
                endpoints[0], keys, (export, []), (PsHoldEnd(request_id=2, blocks=moving), [])
            )
            assert isinstance(refused, PsReply) and not refused.ok, refused
            assert "rolled back before its fence" in refused.detail
            assert isinstance(ended, PsReply) and ended.ok
            ahead, frames = import_request(source.export(moving, remove=False))
            ahead = dataclasses.replace(ahead, version=2)  # the target is at 1
            release = PsRelease(request_id=2, blocks=moving, placement_version=0)
            refused, released = in_order(endpoints[1], keys, (ahead, frames), (release, []))
            assert isinstance(refused, PsReply) and not refused.ok, refused
            assert "released before the import" in refused.detail
            assert isinstance(released, PsReply) and released.ok
            step(ps, model)  # version 2: neither the export nor the import is there
            step(ps, model)
            ps.pull()
            assert ps.versions == [3, 3]
            assert target.stats().blocks == [b.block_id for b in ps.placement.blocks_on(1)]


def test_a_client_with_no_map_to_follow_says_so(keys):
    with serving(keys, 2, workers=(0,)) as endpoints:
        model = make_model()
        with client(model, endpoints, keys, 0) as ps, control(endpoints[0], keys) as source:
            step(ps, model)
            moving = [ps.placement.blocks_on(0)[0].block_id]
            exported = source.export(moving, at_version=1, remove=False, hold=True)
            with control(endpoints[1], keys) as target:
                target.import_blocks(exported)
            source.release(moving, 1)
            with pytest.raises(PsError, match="no way to fetch the job's map"):
                ps.pull()


class TimedJob:
    """What ``Client`` reports to the job, recorded."""

    data_ended = False

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.server_comm: list[tuple[int, int, float]] = []

    def ps_placement(self, planned):
        return planned

    def record_comm(self, seconds: float) -> None:
        pass

    def record_wait(self, seconds: float) -> None:
        self.waits.append(seconds)

    def record_server_comm(self, server: int, nbytes: int, seconds: float) -> None:
        self.server_comm.append((server, nbytes, seconds))

    def mark_dropped(self) -> None:
        raise AssertionError("no push is dropped here")


def test_a_pulls_server_timing_is_its_service_not_the_barrier(keys):
    """Worker 1 pushes 0.4 s late; the server is slowed by 0.2 s per update
    (``--inject``). Worker 0's pull waits for both: the barrier (0.4 s) is its
    wait, the injected delay is the server's service time."""
    slow = parse_injections(["persistent:role=server,delay=0.2"])
    with serving(keys, 1, injections=slow) as endpoints:
        jobs = [TimedJob(), TimedJob()]
        models = [make_model() for _ in range(2)]
        clients = [client(m, endpoints, keys, w, job=jobs[w]) for w, m in enumerate(models)]
        try:
            run_threads([clients[0].pull, clients[1].pull])
            for w in (0, 1):
                gradients(models[w], ROWS[w])

            def late_push() -> None:
                time.sleep(0.4)
                clients[1].push(RECORDS)

            def push_then_pull() -> None:
                clients[0].push(RECORDS)
                jobs[0].waits.clear()
                jobs[0].server_comm.clear()
                clients[0].pull()

            run_threads([push_then_pull, late_push])
            [(server, nbytes, seconds)] = jobs[0].server_comm
            assert server == 0 and nbytes > 0
            assert 0.15 <= seconds < 0.35, seconds  # the injected 0.2 s, not the 0.6 s
            [wait] = jobs[0].waits
            assert 0.3 <= wait < 0.5, wait  # worker 1's lateness
        finally:
            for c in clients:
                c.close()
