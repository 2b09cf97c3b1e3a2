"""What the job serves besides its node table, as ``job.py`` builds it for the
``Supervisor``: one bundle, so the event loop's constructor stays readable."""

from __future__ import annotations

from dataclasses import dataclass

from dtlaunch.events import EventRecorder
from dtlaunch.supervisor.control import Controller
from dtlaunch.supervisor.dds import DdsService
from dtlaunch.supervisor.output import OutputRouter
from dtlaunch.supervisor.psfleet import PlacementKeeper
from dtlaunch.supervisor.regroup import RegroupCoordinator
from dtlaunch.supervisor.rna import GroupedCoordinator
from dtlaunch.wire.keys import PeerKeys

__all__ = ["JobServices"]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobServices:
    """What the job serves besides its node table, as ``job.py`` built it."""

    recorder: EventRecorder  # the event log and the status fold
    output: OutputRouter  # process output to the logs and the console
    dds: DdsService  # the shard queue and its write-ahead log
    controller: Controller | None  # the policy's Controller; None for --policy none
    regroup: RegroupCoordinator | None  # allreduce mode: replace without a group restart
    placements: PlacementKeeper | None  # PS mode: the job's block placement map
    ps_keys: PeerKeys | None  # built-in PS: how the supervisor reaches the servers
    rounds: GroupedCoordinator | None = None  # --policy rna: groups, probes and rounds
