"""The job's node table: an I/O-free state machine (AntDT §V-D restart rules).

Stimuli go in through :class:`JobState`'s methods; each returns the commands the
supervisor carries out (:data:`Command`). ``nodes`` holds the vocabulary (states,
commands, records), ``failures`` classifies a process exit, ``machine`` the
transitions, ``workers`` the workers' identities (``worker:<rank>@<attempt>``)
and which of them still count, ``limits`` each process's memory and CPU limits
and the relaunch with more memory after an out-of-memory death, ``scaling``
which ranks ``dtlaunch scale`` starts where and which it stops.
"""

from dtlaunch.supervisor.jobstate.limits import LimitRules
from dtlaunch.supervisor.jobstate.machine import (
    LISTENERS_PER_HOST_MAX,
    AgentState,
    AskToLeave,
    Command,
    EmitEvent,
    Finish,
    JobState,
    LaunchAgent,
    Phase,
    ProcSlot,
    ProcState,
    SendToAgent,
    Timing,
    WorkerGone,
)
from dtlaunch.supervisor.jobstate.workers import WorkerPeers

__all__ = [
    "LISTENERS_PER_HOST_MAX",
    "AgentState",
    "AskToLeave",
    "Command",
    "EmitEvent",
    "Finish",
    "JobState",
    "LaunchAgent",
    "LimitRules",
    "Phase",
    "ProcSlot",
    "ProcState",
    "SendToAgent",
    "Timing",
    "WorkerGone",
    "WorkerPeers",
]
