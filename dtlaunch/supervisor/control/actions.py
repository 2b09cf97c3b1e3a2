"""Straggler-mitigation actions a policy emits (AntDT Table II).

Every action carries ``reason`` (one sentence for a person) and ``inputs`` (what
the decision saw: windows, lambda, per-node throughput, solver output), so the
Controller can log it as a ``decision`` event and ``replay`` can show why. Keep
``inputs`` JSON-friendly (numbers, strings, lists, dicts).

Node actions (``KillRestart``) need no synchronisation; global actions
(``AdjustBatchSize``, ``AdjustLR``) name the step at which every worker applies
them, so all apply in the same iteration; ``ReassignBlocks`` moves parameter
blocks between servers at a step boundary the servers agree on (``psfleet``).
``ScaleWorkers`` (DLRover's elasticity, ``--policy auto``) changes the number of
workers as ``dtlaunch scale`` does, ``ScaleServers`` (PSLD §5, DLRover's server
count) the number of built-in parameter servers as ``dtlaunch scale --servers``.
``RnaGroups`` (RNA §4) splits an RNA job's workers into groups that run their
rounds apart and exchange through a parameter server.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """Base of every action; ``NAME`` is the Table II name used in events."""

    NAME: ClassVar[str] = ""
    reason: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdjustBatchSize(Action):
    """Set each worker's local batch size (rank -> size) from ``apply_at_step`` on.

    ``accumulations`` (rank -> passes per step, AntDT-DD's ``C_i``) is given only
    by ``dd``; a rank not in it makes one pass. A step then trains
    ``accumulations[r] x sizes[r]`` records of worker ``r``.
    """

    NAME: ClassVar[str] = "ADJUST_BS"
    sizes: dict[int, int]
    apply_at_step: int
    accumulations: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class KillRestart(Action):
    """Kill one node and start it again; ``target_host`` None means the same host."""

    NAME: ClassVar[str] = "KILL_RESTART"
    role: str
    rank: int
    target_host: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AdjustLR(Action):
    """Scale each worker's learning rate (rank -> factor) from ``apply_at_step`` on."""

    NAME: ClassVar[str] = "ADJUST_LR"
    factors: dict[int, float]
    apply_at_step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BackupWorkers(Action):
    """Each step waits only for the first ``n - count`` workers' gradients."""

    NAME: ClassVar[str] = "BACKUP_WORKERS"
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReassignBlocks(Action):
    """PSLD's block reassignment: block ``i`` of the placement map ``from_version``
    goes to server ``owner[i]``, live, at a step boundary the servers agree on."""

    NAME: ClassVar[str] = "REASSIGN_BLOCKS"
    owner: list[int]
    from_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleWorkers(Action):
    """Run ``count`` workers from now on (new ranks start, the highest leave)."""

    NAME: ClassVar[str] = "SCALE_WORKERS"
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleServers(Action):
    """Run ``count`` built-in parameter servers from now on: new ones take their
    share of the blocks, the highest ranks hand theirs over and stop."""

    NAME: ClassVar[str] = "SCALE_SERVERS"
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RnaGroups(Action):
    """Hierarchical RNA (§4): the workers run their rounds in ``groups`` (lists
    of ranks, together every rank once) from now on, without a restart."""

    NAME: ClassVar[str] = "RNA_GROUPS"
    groups: list[list[int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class NoAction(Action):
    """The dummy action: nothing to do this interval (still logged with its inputs)."""

    NAME: ClassVar[str] = "NONE"


def action_name(action: Action) -> str:
    """``"ADJUST_BS" | "KILL_RESTART" | "ADJUST_LR" | "BACKUP_WORKERS" |
    "REASSIGN_BLOCKS" | "SCALE_WORKERS" | "SCALE_SERVERS" | "RNA_GROUPS" | "NONE"``.

    Raises:
        TypeError: ``action`` is not one of the action classes above.
    """
    if not isinstance(action, Action) or not type(action).NAME:
        raise TypeError(f"not a dtlaunch action: {action!r}")
    return type(action).NAME


def action_fields(action: Action) -> dict[str, Any]:
    """The action as a plain dict (``action`` name first) for an event payload.

    Dict keys stay as they are (int ranks); JSON writers turn them into strings.
    """
    out: dict[str, Any] = {"action": action_name(action)}
    for f in fields(action):
        value = getattr(action, f.name)
        out[f.name] = dict(value) if isinstance(value, dict) else value
    return out
