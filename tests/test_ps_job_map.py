"""Where a worker's client finds the job's map's servers (``ps.placement_map.job_map``):
as the supervisor says with the map; when it does not know them yet (a resumed
supervisor before the agents said hello), the servers this process was started
with, by rank, when they are enough; else it asks again, for a bounded time.
A worker a scale added while the supervisor was down once failed the whole job
here: its environment listed 2 servers, the map still had 1."""

from __future__ import annotations

import pytest

from dtlaunch.errors import PsError
from dtlaunch.ps.blocks import Block, Placement
from dtlaunch.ps.placement_map import job_map, to_wire


def placement(servers: int) -> Placement:
    blocks = tuple(
        Block(block_id=i, param=i, name=f"p{i}", row_start=0, row_end=1, shape=(1,),
              dtype="float32", nbytes=4)
        for i in range(2)
    )  # fmt: skip
    return Placement(version=0, servers=servers, blocks=blocks, owner=(0, servers - 1))


class Job:
    """The SDK's side: the job's map, and the endpoints the supervisor told (after
    ``tell_after`` questions)."""

    def __init__(self, servers: int, told: list[str], tell_after: int = 0) -> None:
        self.map = to_wire(placement(servers))
        self.told, self.tell_after, self.asked = told, tell_after, 0
        self.ps_endpoints: list[str] = []

    def ps_placement(self, planned):
        self.asked += 1
        self.ps_endpoints = self.told if self.asked > self.tell_after else []
        return self.map


ENV = ["tcp://a:1", "tcp://b:2"]  # what the worker was started with, by rank


def test_the_supervisor_s_endpoints_come_first():
    got, endpoints = job_map(Job(2, ["tcp://x:1", "tcp://y:2"]), placement(1), ENV)
    assert got.servers == 2 and endpoints == ["tcp://x:1", "tcp://y:2"]


def test_a_map_with_fewer_servers_than_the_worker_knows_uses_the_first_by_rank():
    got, endpoints = job_map(Job(1, []), placement(2), ENV)
    assert got.servers == 1 and endpoints == ["tcp://a:1"]


def test_a_map_with_more_servers_waits_until_the_supervisor_says_where():
    job = Job(3, ["tcp://a:1", "tcp://b:2", "tcp://c:3"], tell_after=3)
    got, endpoints = job_map(job, placement(2), ENV, wait_s=5.0)
    assert job.asked == 4 and got.servers == 3 and endpoints[2] == "tcp://c:3"
    with pytest.raises(PsError, match="map has 3 servers, this worker knows 2"):
        job_map(Job(3, []), placement(2), ENV, wait_s=0.3)
