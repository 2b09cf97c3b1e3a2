"""Which process runs where: workers and servers onto hosts' slots. Pure.

Rules (deterministic, so ranks stay the same across supervisor restarts):

* spare hosts get nothing at start;
* servers first go to hosts with a ``servers=`` quota, in hostfile order, up to
  the quota; servers beyond all quotas take free slots, hosts in hostfile order;
* workers then fill the remaining free slots host by host in hostfile order;
* a host that declares ``gpus=N`` runs at most N workers (one GPU each);
* ranks are given in blocks per role, hosts in hostfile order (like ``mpirun``
  by-slot mapping or torchrun node ranks): ranks ``0..k-1`` on the first host
  running that role, and so on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import HostSpec

__all__ = ["ROLE_SERVER", "ROLE_WORKER", "Assignment", "place"]

ROLE_WORKER = "worker"
ROLE_SERVER = "server"
_SHOWN_HOSTS = 6  # hosts listed by name in a capacity error before "..."


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    """One process of the job and the host slot it runs in."""

    role: str  # ROLE_WORKER | ROLE_SERVER
    rank: int  # rank within its role, 0..n-1
    host: str  # HostSpec.label
    local_rank: int  # index among processes of the same role on that host
    local_world_size: int  # processes of the same role on that host
    group_rank: int  # index of the host among hosts running this role (torchrun GROUP_RANK)


def place(hosts: Sequence[HostSpec], *, workers: int, servers: int) -> list[Assignment]:
    """Assign ``workers`` workers and ``servers`` servers to ``hosts``' slots.

    Returns the assignments sorted by role (workers, then servers), then rank.

    Raises:
        ConfigError: counts out of range, repeated host labels, or fewer free
            slots on non-spare hosts than ``workers + servers``.
    """
    _check_request(hosts, workers=workers, servers=servers)
    active = [host for host in hosts if not host.spare]
    free = {host.label: host.slots for host in active}

    server_counts = dict.fromkeys(free, 0)
    remaining = servers
    for host in active:  # quota first
        take = min(host.servers, free[host.label], remaining)
        server_counts[host.label] += take
        free[host.label] -= take
        remaining -= take
    _fill(active, free, server_counts, remaining)  # beyond quotas: any free slot
    worker_counts = dict.fromkeys(free, 0)
    _fill(active, free, worker_counts, workers)  # _check_request made sure all fit
    _check_gpus(active, worker_counts)
    return _ranks(ROLE_WORKER, active, worker_counts) + _ranks(ROLE_SERVER, active, server_counts)


def _fill(
    active: Sequence[HostSpec], free: dict[str, int], counts: dict[str, int], wanted: int
) -> None:
    """Put up to ``wanted`` processes into free slots, hosts in order."""
    for host in active:
        take = min(free[host.label], wanted)
        counts[host.label] += take
        free[host.label] -= take
        wanted -= take


def _ranks(role: str, active: Sequence[HostSpec], counts: dict[str, int]) -> list[Assignment]:
    """Block ranks: hosts in order, each host's processes contiguous."""
    assignments: list[Assignment] = []
    used = [host.label for host in active if counts[host.label] > 0]
    for group_rank, label in enumerate(used):
        local_world_size = counts[label]
        for local_rank in range(local_world_size):
            assignments.append(
                Assignment(
                    role=role,
                    rank=len(assignments),
                    host=label,
                    local_rank=local_rank,
                    local_world_size=local_world_size,
                    group_rank=group_rank,
                )
            )
    return assignments


def _check_gpus(active: Sequence[HostSpec], worker_counts: dict[str, int]) -> None:
    """Each worker on a host with declared GPUs gets one of its own."""
    crowded = [h for h in active if h.gpus and worker_counts[h.label] > h.gpus]
    if not crowded:
        return
    detail = "; ".join(
        f"{h.label} would run {worker_counts[h.label]} workers but declares gpus={h.gpus}"
        for h in crowded
    )
    raise ConfigError(
        f"more workers than GPUs: {detail}. Each worker on a host with gpus= takes one GPU. "
        "Fix: set slots= (or --nproc-per-node) to at most the GPU count plus servers=, "
        "or lower --workers."
    )


def _check_request(hosts: Sequence[HostSpec], *, workers: int, servers: int) -> None:
    """Refuse impossible requests with a message that says how to fix them."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be a whole number >= 1 (got {workers!r})")
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
        raise ConfigError(
            f"--servers must be a whole number >= 0 (got {servers!r}); use 0 for allreduce mode"
        )
    seen: set[str] = set()
    for host in hosts:
        if host.label in seen:
            raise ConfigError(
                f"host {host.label!r} is listed twice ({host.origin or 'no origin'}); "
                "each host may appear once"
            )
        seen.add(host.label)
    active = [host for host in hosts if not host.spare]
    capacity = sum(host.slots for host in active)
    needed = workers + servers
    if needed <= capacity:
        return
    shown = ", ".join(f"{host.label} slots={host.slots}" for host in active[:_SHOWN_HOSTS])
    if len(active) > _SHOWN_HOSTS:
        shown += f", ... ({len(active) - _SHOWN_HOSTS} more)"
    offer = (
        f"only {capacity} exist on {_count(len(active), 'non-spare host')} ({shown})"
        if active
        else "there is no non-spare host, so no slot at all"
    )
    spares = [host for host in hosts if host.spare]
    spare_note = (
        f"; {_count(len(spares), 'spare host')} with {sum(h.slots for h in spares)} slots "
        "kept for relaunches and not used at start (drop 'spare' to use them)"
        if spares
        else ""
    )
    raise ConfigError(
        f"not enough slots: {needed} needed ({workers} workers + {servers} servers) but "
        f"{offer}{spare_note}. Fix: raise slots= on hostfile lines (or node:N in -H), "
        "add hosts, or lower --workers/--servers."
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
