"""What a wire field's value may be beyond its type: the rules the codec checks.

A field has at most one rule, looked up by ``field_rule``: a set of choices (per
message class and field, or by field name wherever it appears), an inclusive or
exclusive lower bound (by field name, wherever it appears), or "a list of TCP
ports". The codec's checkers and its compiled first pass (``fastcheck``) both
take the rule from here, so that the two cannot disagree.
"""

from __future__ import annotations

from typing import Any

from dtlaunch.wire import messages
from dtlaunch.wire.messages.base import PROC_STATES, STREAMS

__all__ = ["field_rule"]

# Enumerated string fields, per (class name, field): the same name means different
# sets in different messages (a Hello's role may be "agent", a Spawn's may not).
# The sets are named, not imported: importing them would import every protocol
# module that ``messages`` imports only when asked (its docstring says why).
_CHOICES: dict[tuple[str, str], str] = {
    ("Hello", "role"): "ROLES",
    ("Spawn", "role"): "PROC_ROLES",
    ("ProcReport", "role"): "PROC_ROLES",
    ("PsOptimizer", "name"): "PS_OPTIMIZERS",
    ("PsStats", "mode"): "PS_MODES",
    ("NodeStatus", "role"): "PROC_ROLES",
    ("StatusSnapshot", "phase"): "STATUS_PHASES",
    ("StatusSnapshot", "source"): "STATUS_SOURCES",
}
# These names mean the same thing wherever they appear.
_CHOICES_BY_NAME: dict[str, tuple[str, ...]] = {"stream": STREAMS, "state": PROC_STATES}

# Inclusive lower bounds by field name, wherever the field appears. An int field
# named here that is None (``signal: int | None``) is not checked.
_INT_MIN: dict[str, int] = {
    "rank": -1,  # -1 = "no rank" (agents, control clients)
    "attempt": 0,
    "pid": 1,
    "seq": 0,
    "rss_bytes": 0,
    "signal": 1,
    "dead_after": 1,
    # DDS
    "lease_id": 0,
    "epoch": 0,
    "shard": 0,
    "start": 0,
    "end": 0,
    "request_id": 0,
    "count": 1,
    "step": 0,
    "dataset_size": 1,
    "shard_size": 1,
    "epochs": 1,
    "global_batch": 0,
    "seed": 0,
    # Monitor and actions
    "batch_size": 0,
    "samples": 0,
    "apply_at_step": 0,
    # elastic regroup
    "gen": 1,
    "leaving_rank": -1,  # -1: a resize, where no one rank is replaced
    "world_size": 0,
    "store_rank": 0,
    "store_port": 1,
    "master_port": 1,
    "source_rank": 0,
    "group_size": 0,
    # parameter server (messages' "version" is not here: Hello.version is a str)
    "worker": 0,
    "server": 0,
    "block_id": 0,
    "backup": 0,
    "min_version": 0,
    "at_version": 0,
    "since_version": 0,
    "incarnation": 0,
    "recovered_at": 0,
    "nbytes": 0,
    # status
    "restarts": 0,
    "shards_done": 0,
    "shards_total": 0,
}
_FLOAT_MIN: dict[str, float] = {
    "runtime_s": 0.0,
    "cpu_percent": 0.0,
    "cpu_throttled": 0.0,
    "grace_s": 0.0,
    "kill_grace": 0.0,
    "orphan_timeout": 0.0,
    "retry_after": 0.0,
    "compute_s": 0.0,
    "comm_s": 0.0,
    "age_s": 0.0,
    "injected_s": 0.0,
    "update_s": 0.0,
    "wait_s": 0.0,
    "waited_s": 0.0,
    "seconds": 0.0,
    "ended_s": 0.0,
    "now_s": 0.0,
    # status (eta_s may be None: unknown)
    "elapsed_s": 0.0,
    "bpt_s": 0.0,
    "throughput": 0.0,
    "eta_s": 0.0,
    "at_s": 0.0,
}
_FLOAT_POSITIVE = frozenset({"heartbeat_interval", "factor"})  # 0 would make a busy loop
_PORT_LISTS = frozenset({"free_ports"})


def field_rule(
    owner: type[Any], name: str
) -> tuple[tuple[str, ...] | None, float | None, bool, bool]:
    """A field's one rule beyond its type, in this order of precedence: its
    choices, or its lower bound (and whether the bound is excluded), or that it
    is a list of ports."""
    named = _CHOICES.get((owner.__name__, name))
    choices = getattr(messages, named) if named else _CHOICES_BY_NAME.get(name)
    if choices is not None:
        return choices, None, False, False
    if name in _INT_MIN:
        return None, _INT_MIN[name], False, False
    if name in _FLOAT_MIN:
        return None, _FLOAT_MIN[name], False, False
    if name in _FLOAT_POSITIVE:
        return None, 0.0, True, False
    return None, None, False, name in _PORT_LISTS
