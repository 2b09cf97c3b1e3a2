"""DLRover's resource-throughput model (§4.1) and its adjust rules (§4.2). Pure.

A PS job's throughput grows with its workers until the parameter servers run out
of CPU: with ``ŵ`` the CPU cores one worker uses and ``ŝ`` the server cores each
worker's updates use (measured with few workers: the *sample* phase), a job of
``C_total`` cores runs at most ``N_w = C_total / (ŵ + ŝ)`` workers (eq. 10),
leaving ``s_total = C_total - N_w·ŵ`` cores to the servers (eq. 11). The
*adjust* phase then fixes what the model missed: servers with CPU to spare take
more workers, at most ``√N_w`` more at a time (§4.2's √K cap, with K the
workers running: a small job grows by one, a job of 16 by four), and a *hot*
server needs ``min(ŝ_hot / ŝ_total · ŝ · N_w, C_max)`` cores to keep up.

On hosts of different sizes the workers are not alike: a process's CPU share is
its host's cores over its slots, so a worker added on a big host trains faster
than one on a small host, and eq. 10's ``N_w`` counts them as equal.
:func:`plan_workers_on_slots` solves the problem (2)-(4) behind it for
dtlaunch's placement instead: the slots a scale fills next, in its order, each
with its share, each worker worth ``min(share, demand) / ŵ`` sampled workers
(eq. 1's ``min(w_i, ŵ)``), the servers' CPU bounding the sum (eq. 4), the
cores the hostfile declares bounding workers and servers together (eq. 3).

A server's CPU limit is fixed while it runs, so with a fixed number of servers
``s_total`` is also bounded by the CPU the servers were given
(:func:`workers_for`), and the model's throughput is the one-worker rate times
the workers the servers can feed (:func:`predicted_throughput`). Since the
built-in servers scale (``dtlaunch scale --servers``), :func:`plan_job` solves
eq. 10-11 with the servers' count free as well: the model's ``N_w`` and the
servers that carry ``N_w·ŝ`` cores, within the slots the hosts have.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dtlaunch.errors import InfeasibleError
from dtlaunch.solvers.spread import spread_blocks

__all__ = [
    "JobPlan",
    "SlotPlan",
    "WorkerPlan",
    "added_workers",
    "busiest_share",
    "hot_server_cores",
    "plan_job",
    "plan_workers",
    "plan_workers_on_slots",
    "predicted_throughput",
    "servers_for",
    "workers_for",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerPlan:
    """The *optimize* phase's answer (eq. 10-11), with what bounded it."""

    workers: int  # N_w, within [min_workers, max_workers]
    model_workers: float  # C_total / (ŵ + ŝ) before rounding and bounds
    server_cores: float  # s_total = C_total - N_w·ŵ (eq. 11) for the plan's N_w
    bound: str  # "model" | "servers" | "max_workers" | "min_workers"


def plan_workers(
    *,
    total_cores: float,
    worker_cores: float,
    server_cores_per_worker: float,
    server_cores_given: float | None = None,
    min_workers: int = 1,
    max_workers: int | None = None,
) -> WorkerPlan:
    """Eq. 10 (``N_w = C_total / (ŵ + ŝ)``, rounded down) and eq. 11, bounded by
    ``[min_workers, max_workers]`` and, when the servers' CPU is fixed at
    ``server_cores_given``, by the workers those cores can serve (``s_given / ŝ``).

    Raises:
        InfeasibleError: a measurement or bound that is not a finite number > 0
            (``ŝ`` may be 0: servers that did no measurable work bound nothing).
    """
    _positive("total_cores", total_cores)
    _positive("worker_cores", worker_cores)
    if not (math.isfinite(server_cores_per_worker) and server_cores_per_worker >= 0):
        raise InfeasibleError(
            f"server_cores_per_worker must be >= 0, got {server_cores_per_worker}"
        )
    if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
        raise InfeasibleError(f"worker bounds [{min_workers}, {max_workers}] are empty")
    model = total_cores / (worker_cores + server_cores_per_worker)
    workers, bound = math.floor(model + 1e-9), "model"
    if server_cores_given is not None:
        fed = workers_for(server_cores_given, server_cores_per_worker)
        if fed is not None and fed < workers:
            workers, bound = fed, "servers"
    if max_workers is not None and workers > max_workers:
        workers, bound = max_workers, "max_workers"
    if workers < min_workers:
        workers, bound = min_workers, "min_workers"
    return WorkerPlan(
        workers=workers,
        model_workers=model,
        server_cores=max(0.0, total_cores - workers * worker_cores),
        bound=bound,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotPlan:
    """:func:`plan_workers_on_slots`' answer, with what bounded it."""

    workers: int  # N_w: the running ones and the first added slots
    sampled_workers: float  # their work in sampled workers (sum of min(share, demand) / ŵ)
    fed: float | None  # sampled workers the servers' CPU feeds (s_given / ŝ; None: no bound)
    bound: str  # "servers" | "model" | "slots" | "max_workers" | "min_workers"


def plan_workers_on_slots(
    *,
    running: Sequence[float],
    free: Sequence[float],
    worker_cores: float,
    worker_demand: float,
    server_cores_per_worker: float,
    server_cores_given: float | None,
    total_cores: float,
    min_workers: int = 1,
    max_workers: int | None = None,
) -> SlotPlan:
    """The workers to run when their CPU shares differ (hosts of different sizes).

    ``running``: the CPU share of each running worker; ``free``: the share a
    worker would get in each free slot, in the order a scale fills them.
    ``worker_cores`` (ŵ): what a sampled worker used; ``worker_demand``: what a
    worker uses when its share is no limit (``inf`` when the sampled workers
    used all they were given: a CPU-bound worker uses any share). A worker on a
    share ``c`` does ``min(c, demand) / ŵ`` of a sampled worker's work (eq. 1)
    and its updates load the servers as much (``ŝ`` cores per sampled worker).

    The answer is the most workers, the running ones first and then the free
    slots in their order, whose work the servers' CPU feeds (eq. 4: ``work · ŝ
    ≤ s_given``) and whose cores with the servers' load fit ``total_cores``
    (eq. 3; the running workers count whatever they use), within
    ``[min_workers, max_workers]``. With equal shares it is eq. 10-11's
    ``N_w``. It is fewer than run now when the running ones overload the servers.

    Raises:
        InfeasibleError: a measurement or bound that is not a finite number > 0,
            or a share below 0.
    """
    _positive("worker_cores", worker_cores)
    _positive("total_cores", total_cores)
    if not worker_demand > 0:
        raise InfeasibleError(f"worker_demand must be > 0, got {worker_demand}")
    if not (math.isfinite(server_cores_per_worker) and server_cores_per_worker >= 0):
        raise InfeasibleError(
            f"server_cores_per_worker must be >= 0, got {server_cores_per_worker}"
        )
    if any(not (math.isfinite(c) and c >= 0) for c in (*running, *free)):
        raise InfeasibleError("a worker's CPU share must be a finite number >= 0")
    if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
        raise InfeasibleError(f"worker bounds [{min_workers}, {max_workers}] are empty")
    fed = None
    if server_cores_given is not None and server_cores_per_worker > 0:
        fed = server_cores_given / server_cores_per_worker
    shares = [*running, *free]
    top = len(shares) if max_workers is None else min(len(shares), max_workers)
    bound = "max_workers" if top < len(shares) else "slots"
    n, work, cores = 0, 0.0, 0.0
    while n < top:
        used = min(shares[n], worker_demand)
        more = used / worker_cores
        if fed is not None and work + more > fed + 1e-9:
            bound = "servers"
            break
        if n >= len(running) and (
            cores + used + (work + more) * server_cores_per_worker > total_cores + 1e-9
        ):
            bound = "model"
            break
        n, work, cores = n + 1, work + more, cores + used
    if n < min_workers:
        n, bound = min_workers, "min_workers"
        work = sum(min(c, worker_demand) / worker_cores for c in shares[:n])
    return SlotPlan(workers=n, sampled_workers=work, fed=fed, bound=bound)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPlan:
    """Eq. 10-11 with the servers' count free: workers and servers together."""

    workers: int  # N_w
    servers: int  # N_s: they carry N_w·ŝ cores at the load asked
    model_workers: float  # C_total / (ŵ + ŝ) before rounding and bounds
    server_cores: float  # s_total = C_total - N_w·ŵ (eq. 11) for the plan's N_w
    bound: str  # "model" | "max_workers" | "slots" | "min_workers"


def servers_for(
    workers: int,
    server_cores_per_worker: float,
    server_limit: float,
    *,
    load: float,
    at_least: int,
    block_bytes: Sequence[int] = (),
    at_most: int | None = None,
    share: Callable[[int], float] | None = None,
) -> int | None:
    """The fewest servers, not fewer than ``at_least`` nor more than ``at_most``,
    whose busiest carries its share of ``workers``' updates (``N_w·ŝ`` cores) at
    ``load`` of its ``server_limit`` cores; None when none do. The share is
    ``1 / N_s`` for a model in fine blocks; with ``block_bytes`` it is the
    busiest server's bytes once the blocks are spread (``spread_blocks``): a
    block is never split, so servers beyond what the largest block allows help
    nobody. ``share``: that share by server count, when the caller keeps it
    (``plan_job`` asks for the same counts for every number of workers)."""
    if server_cores_per_worker <= 0 or server_limit <= 0 or load <= 0:
        return at_least
    demand = workers * server_cores_per_worker
    even = math.ceil(demand / (load * server_limit) - 1e-9)  # enough for a model in fine blocks
    top = at_most if at_most is not None else max(at_least, even)
    if block_bytes:
        top = min(top, max(at_least, len(block_bytes)))
    busiest = share or functools.partial(busiest_share, block_bytes)
    for servers in range(max(1, at_least), top + 1):
        if demand * busiest(servers) <= load * server_limit + 1e-9:
            return servers
    return None


def busiest_share(block_bytes: Sequence[int], servers: int) -> float:
    """The share of the bytes the busiest of ``servers`` servers holds once the
    blocks are spread over them (``1 / servers`` without ``block_bytes``)."""
    total = sum(block_bytes)
    if not block_bytes or total <= 0:
        return 1.0 / servers
    owner = spread_blocks(block_bytes, [0] * len(block_bytes), servers)
    loads = [0] * servers
    for size, server in zip(block_bytes, owner, strict=True):
        loads[server] += size
    return max(loads) / total


def plan_job(
    *,
    total_cores: float,
    worker_cores: float,
    server_cores_per_worker: float,
    server_limit: float,
    workers_now: int,
    servers_now: int,
    free_slots: int,
    load: float = 0.9,
    min_workers: int = 1,
    max_workers: int | None = None,
    block_bytes: Sequence[int] = (),
) -> JobPlan:
    """Eq. 10 (``N_w = C_total / (ŵ + ŝ)``, rounded down, within ``[min_workers,
    max_workers]``) with the servers that feed them (:func:`servers_for`, at
    ``load`` of ``server_limit`` each, never fewer than now, the model's blocks
    ``block_bytes`` spread over them): the most workers for which workers and
    servers fit the slots (``free_slots`` more processes than the
    ``workers_now`` and ``servers_now`` running).

    Raises:
        InfeasibleError: as :func:`plan_workers`, or a server limit that is not
            a finite number > 0.
    """
    _positive("server_limit", server_limit)
    top = plan_workers(
        total_cores=total_cores,
        worker_cores=worker_cores,
        server_cores_per_worker=server_cores_per_worker,
        min_workers=min_workers,
        max_workers=max_workers,
    )
    slots = workers_now + servers_now + max(0, free_slots)
    # One spread of the blocks per server count, whatever the workers tried.
    share = functools.cache(functools.partial(busiest_share, block_bytes))
    for workers in range(top.workers, min_workers - 1, -1):
        servers = servers_for(
            workers,
            server_cores_per_worker,
            server_limit,
            load=load,
            at_least=servers_now,
            block_bytes=block_bytes,
            at_most=slots - workers,
            share=share,
        )
        if servers is not None and workers + servers <= slots:
            return JobPlan(
                workers=workers,
                servers=servers,
                model_workers=top.model_workers,
                server_cores=max(0.0, total_cores - workers * worker_cores),
                bound=top.bound if workers == top.workers else "slots",
            )
    return JobPlan(
        workers=min_workers,
        servers=servers_now,
        model_workers=top.model_workers,
        server_cores=max(0.0, total_cores - min_workers * worker_cores),
        bound="min_workers",
    )


def workers_for(server_cores: float, server_cores_per_worker: float) -> int | None:
    """How many workers ``server_cores`` serve at ``ŝ`` cores each (eq. 4's
    ``N_w·ŝ < s_total``); None when ``ŝ`` is 0 (no bound)."""
    if server_cores_per_worker <= 0:
        return None
    return math.floor(server_cores / server_cores_per_worker + 1e-9)


def added_workers(*, workers: int, server_cores_given: float, server_cores_used: float) -> int:
    """§4.2's idle-PS rule: with ``ŝ = ŝ_total / N_w`` measured now, the servers
    serve ``s_total / ŝ`` workers; add the difference, at most ``√N_w`` (at
    least one) at a time. 0 when the servers are busy (or did no measurable work)."""
    if workers < 1 or server_cores_used <= 0:
        return 0
    per_worker = server_cores_used / workers
    fed = workers_for(server_cores_given, per_worker)
    if fed is None or fed <= workers:
        return 0
    return min(fed - workers, max(1, math.floor(math.sqrt(workers))))


def hot_server_cores(
    *, hot_used: float, servers_used: float, one_worker_cores: float, workers: int, max_cores: float
) -> float:
    """§4.2's hot-PS rule: the cores the hot server needs for ``workers`` workers,
    ``min(ŝ_hot / ŝ_total · ŝ · N_w, C_max)``, with ``ŝ`` the servers' cores per
    worker measured with one worker (``one_worker_cores``)."""
    if servers_used <= 0:
        return 0.0
    return min(hot_used / servers_used * one_worker_cores * workers, max_cores)


def predicted_throughput(
    *,
    one_worker_rate: float,
    workers: int,
    server_cores_given: float,
    server_cores_per_worker: float,
) -> float:
    """Eq. 1 under the model's assumptions: each worker adds the rate one worker
    reached, as long as the servers keep up (``N_w·ŝ ≤ s_total``)."""
    fed = workers_for(server_cores_given, server_cores_per_worker)
    effective = workers if fed is None else min(workers, max(fed, 1))
    return one_worker_rate * effective


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InfeasibleError(f"{name} must be a finite number > 0, got {value!r}")
