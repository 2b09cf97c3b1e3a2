"""Every message on the control wire, one module per protocol, and the one registry.

Open the protocol you need; each module"s docstring says who talks to whom:

- ``base``       ``Record`` and ``Message``, ``PROTOCOL_VERSION``, shared constants
- ``session``    every peer and the supervisor: Hello/Welcome/Rehello, Ping, StopJob/ScaleJob/Ack
- ``agent``      supervisor <-> agent: bootstrap, heartbeats, spawn, exits, output, kill
- ``dds``        worker <-> the shard queue: data set, fetch, grant, ack, release
- ``placement``  worker <-> supervisor: the parameter servers" block placement map
- ``steering``   worker <-> Controller: step reports, ADJUST_BS, ADJUST_LR, regroups
- ``rna``        worker <-> RNA"s round coordinator: groups, probes, rounds
- ``status``     ``dtlaunch status`` <-> supervisor, read-only
- ``ps``         worker/supervisor <-> a built-in parameter server, on its own socket

``MESSAGE_TYPES`` is the registry the codec validates against: a message whose
class is not in it can be neither sent nor received; each protocol module lists
its own part as ``MESSAGES``. Everything is re-exported here, so ``from
dtlaunch.wire.messages import Hello`` works for every message.

A protocol module is imported when one of its names is first asked for (PEP 562),
not with this package: making ~90 frozen dataclasses costs ~90 ms, and an agent
needs two protocols of eight. ``MESSAGE_TYPES`` imports them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dtlaunch.wire.messages.base import (
    PROC_ROLES,
    PROC_STATES,
    PROTOCOL_VERSION,
    ROLES,
    STREAMS,
    Message,
    Record,
)

if TYPE_CHECKING:  # what the names below resolve to, for the type checker
    from dtlaunch.wire.messages.agent import (
        AgentBootstrap,
        AgentHeartbeat,
        Bye,
        DumpStacks,
        Exited,
        Kill,
        Output,
        ProcReport,
        Shutdown,
        Spawn,
        Spawned,
        SpawnFailed,
        Stacks,
    )
    from dtlaunch.wire.messages.dds import (
        AckDone,
        AckShards,
        DatasetInfo,
        DatasetReady,
        FetchShards,
        Lease,
        RegisterDataset,
        ReleaseShards,
        ShardGrant,
    )
    from dtlaunch.wire.messages.placement import (
        PlacementReady,
        PsPlacedBlock,
        PsPlacementMap,
        RegisterPlacement,
    )
    from dtlaunch.wire.messages.ps import (
        PS_MESSAGE_TYPES,
        PS_MODES,
        PS_OPTIMIZERS,
        PsBlockSpec,
        PsBlockState,
        PsExport,
        PsExported,
        PsHoldEnd,
        PsIdle,
        PsIdleReply,
        PsImport,
        PsInit,
        PsInitReply,
        PsLeave,
        PsMembership,
        PsOptimizer,
        PsParams,
        PsPing,
        PsPull,
        PsPush,
        PsPushAck,
        PsRelease,
        PsReply,
        PsShutdown,
        PsSnapshotNow,
        PsStats,
        PsStatsRequest,
        PsUpdate,
    )
    from dtlaunch.wire.messages.rna import (
        RnaExchanged,
        RnaFailed,
        RnaFormed,
        RnaGroup,
        RnaJoin,
        RnaLeave,
        RnaLeft,
        RnaOpenStore,
        RnaProbe,
        RnaReady,
        RnaRoundRecord,
        RnaRounds,
        RnaStart,
        RnaStoreReady,
    )
    from dtlaunch.wire.messages.session import (
        Ack,
        Hello,
        Ping,
        Rehello,
        ScaleJob,
        StopJob,
        Welcome,
    )
    from dtlaunch.wire.messages.status import (
        STATUS_PHASES,
        STATUS_SOURCES,
        ActionStatus,
        NodeStatus,
        StatusReply,
        StatusRequest,
        StatusSnapshot,
    )
    from dtlaunch.wire.messages.steering import (
        AdjustBatchSize,
        AdjustLR,
        Attached,
        LeaveJob,
        RankBatch,
        RankFactor,
        Regroup,
        RegroupGo,
        RegroupReady,
        ServerComm,
        StepReport,
        StepReports,
    )

    MESSAGE_TYPES: tuple[type[Message], ...]

# The protocol modules, in registry order, and the names each one exports here.
_PROTOCOLS: dict[str, tuple[str, ...]] = {
    "session": (
        "Ack",
        "Hello",
        "Ping",
        "Rehello",
        "ScaleJob",
        "StopJob",
        "Welcome",
    ),
    "agent": (
        "AgentBootstrap",
        "AgentHeartbeat",
        "Bye",
        "DumpStacks",
        "Exited",
        "Kill",
        "Output",
        "ProcReport",
        "Shutdown",
        "Spawn",
        "Spawned",
        "SpawnFailed",
        "Stacks",
    ),
    "dds": (
        "AckDone",
        "AckShards",
        "DatasetInfo",
        "DatasetReady",
        "FetchShards",
        "Lease",
        "RegisterDataset",
        "ReleaseShards",
        "ShardGrant",
    ),
    "placement": (
        "PlacementReady",
        "PsPlacedBlock",
        "PsPlacementMap",
        "RegisterPlacement",
    ),
    "steering": (
        "AdjustBatchSize",
        "AdjustLR",
        "Attached",
        "LeaveJob",
        "RankBatch",
        "RankFactor",
        "Regroup",
        "RegroupGo",
        "RegroupReady",
        "ServerComm",
        "StepReport",
        "StepReports",
    ),
    "rna": (
        "RnaExchanged",
        "RnaFailed",
        "RnaFormed",
        "RnaGroup",
        "RnaJoin",
        "RnaLeave",
        "RnaLeft",
        "RnaOpenStore",
        "RnaProbe",
        "RnaReady",
        "RnaRoundRecord",
        "RnaRounds",
        "RnaStart",
        "RnaStoreReady",
    ),
    "status": (
        "STATUS_PHASES",
        "STATUS_SOURCES",
        "ActionStatus",
        "NodeStatus",
        "StatusReply",
        "StatusRequest",
        "StatusSnapshot",
    ),
    "ps": (
        "PS_MESSAGE_TYPES",
        "PS_MODES",
        "PS_OPTIMIZERS",
        "PsBlockSpec",
        "PsBlockState",
        "PsExport",
        "PsExported",
        "PsHoldEnd",
        "PsIdle",
        "PsIdleReply",
        "PsImport",
        "PsInit",
        "PsInitReply",
        "PsLeave",
        "PsMembership",
        "PsOptimizer",
        "PsParams",
        "PsPing",
        "PsPull",
        "PsPush",
        "PsPushAck",
        "PsRelease",
        "PsReply",
        "PsShutdown",
        "PsSnapshotNow",
        "PsStats",
        "PsStatsRequest",
        "PsUpdate",
    ),
}
_HOME = {name: module for module, names in _PROTOCOLS.items() for name in names}
# Their full names, for the codec's registry.
PROTOCOL_MODULES = tuple(f"{__name__}.{module}" for module in _PROTOCOLS)


def __getattr__(name: str) -> Any:
    """Import the protocol module that holds ``name`` (once; then it is a global)."""
    if name == "MESSAGE_TYPES":
        value: Any = registry()
    elif name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def registry() -> tuple[type[Message], ...]:
    """Every registered message class (``MESSAGE_TYPES``), importing every protocol."""
    out: list[type[Message]] = []
    for module in PROTOCOL_MODULES:
        out.extend(importlib.import_module(module).MESSAGES)
    return tuple(out)


__all__ = [
    "MESSAGE_TYPES",
    "PROC_ROLES",
    "PROC_STATES",
    "PROTOCOL_MODULES",
    "PROTOCOL_VERSION",
    "PS_MESSAGE_TYPES",
    "PS_MODES",
    "PS_OPTIMIZERS",
    "ROLES",
    "STATUS_PHASES",
    "STATUS_SOURCES",
    "STREAMS",
    "Ack",
    "AckDone",
    "AckShards",
    "ActionStatus",
    "AdjustBatchSize",
    "AdjustLR",
    "AgentBootstrap",
    "AgentHeartbeat",
    "Attached",
    "Bye",
    "DatasetInfo",
    "DatasetReady",
    "DumpStacks",
    "Exited",
    "FetchShards",
    "Hello",
    "Kill",
    "Lease",
    "LeaveJob",
    "Message",
    "NodeStatus",
    "Output",
    "Ping",
    "PlacementReady",
    "ProcReport",
    "PsBlockSpec",
    "PsBlockState",
    "PsExport",
    "PsExported",
    "PsHoldEnd",
    "PsIdle",
    "PsIdleReply",
    "PsImport",
    "PsInit",
    "PsInitReply",
    "PsLeave",
    "PsMembership",
    "PsOptimizer",
    "PsParams",
    "PsPing",
    "PsPlacedBlock",
    "PsPlacementMap",
    "PsPull",
    "PsPush",
    "PsPushAck",
    "PsRelease",
    "PsReply",
    "PsShutdown",
    "PsSnapshotNow",
    "PsStats",
    "PsStatsRequest",
    "PsUpdate",
    "RankBatch",
    "RankFactor",
    "Record",
    "RegisterDataset",
    "RegisterPlacement",
    "Regroup",
    "RegroupGo",
    "RegroupReady",
    "Rehello",
    "ReleaseShards",
    "RnaExchanged",
    "RnaFailed",
    "RnaFormed",
    "RnaGroup",
    "RnaJoin",
    "RnaLeave",
    "RnaLeft",
    "RnaOpenStore",
    "RnaProbe",
    "RnaReady",
    "RnaRoundRecord",
    "RnaRounds",
    "RnaStart",
    "RnaStoreReady",
    "ScaleJob",
    "ServerComm",
    "ShardGrant",
    "Shutdown",
    "Spawn",
    "SpawnFailed",
    "Spawned",
    "Stacks",
    "StatusReply",
    "StatusRequest",
    "StatusSnapshot",
    "StepReport",
    "StepReports",
    "StopJob",
    "Welcome",
    "registry",
]
