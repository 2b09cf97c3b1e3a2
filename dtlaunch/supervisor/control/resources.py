"""The job's processes' measured use and the capacity the hostfile declares, as
the policies see them (``MonitorSnapshot.resources``; built from the node table
by ``control/loop.py``'s ``job_resources``). I/O-free records."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JobResources", "ProcessUse"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessUse:
    """What a running process used at its agent's last measurement."""

    host: str
    cpu_cores: float  # its process tree's CPU, in cores (-1: not measured yet)
    cpu_limit: float  # cores it may use: its limit, else its share of its host's
    rss_bytes: int
    memory_limit: int  # 0: none
    cpu_throttled: float = 0.0  # share of its CPU periods its quota stopped it in


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResources:
    """The job's processes' use and the capacity the hostfile declares (DLRover
    §4.1's ``C_total``), for ``--policy auto``."""

    workers: dict[int, ProcessUse]  # running workers by rank
    servers: dict[int, ProcessUse]  # running servers by rank
    host_cores: dict[str, float]  # every host: its cpus= (or one core a slot)
    free_worker_slots: int  # where more workers could start now
    # The CPU share a worker added now would get in each free slot, in the order
    # a scale fills them (hosts of different sizes give different shares).
    free_worker_shares: tuple[float, ...] = ()
    # Whether the servers may be scaled now (built-in servers, a block map):
    # SCALE_SERVERS can then add the servers a plan needs.
    servers_scalable: bool = False
    # Every worker rank the job has (running, starting, restarting or finished):
    # the count a SCALE_WORKERS changes. None: the running ones are all there are.
    job_workers: int | None = None
    # Workers that ended with their data (``job.batches()`` ran out): the job is
    # ending, and a scale planned from the ones still running would undo its ranks.
    finished_workers: tuple[int, ...] = ()

    @property
    def worker_count(self) -> int:
        """The workers the job runs, the base of a SCALE_WORKERS."""
        return len(self.workers) if self.job_workers is None else self.job_workers

    @property
    def total_cores(self) -> float:
        return sum(self.host_cores.values())

    @property
    def server_cores_given(self) -> float:
        """The cores the servers may use together (what bounds their updates)."""
        return sum(use.cpu_limit for use in self.servers.values())
