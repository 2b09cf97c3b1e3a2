"""Straggler-mitigation policies and ``--policy`` parsing.

``--policy`` text forms::

    none | lb-bsp | nd | backup | dd | psld | rna | auto  a built-in with its defaults
    nd:lambda=1.5,l_trans=30,l_per=120       a built-in with parameters
    pkg.mod:MyPolicy[:k=v,...]               a user's class, imported from pkg.mod

A user's class is built as ``MyPolicy(**kwargs)``; values that read as ``int``,
``float`` or ``true``/``false`` are converted, the rest stay strings. It needs a
``decide(snap) -> list[Action]`` method; ``name``, ``l_trans``, ``l_per`` and
``lam`` are optional (defaults from ``base``). The module must be importable by
the supervisor (installed, or on ``PYTHONPATH``); dtlaunch needs no change.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.supervisor.control.actions import Action
from dtlaunch.supervisor.control.monitor import Monitor, MonitorSnapshot
from dtlaunch.supervisor.control.policies.auto import AutoPolicy
from dtlaunch.supervisor.control.policies.backup import BackupPolicy
from dtlaunch.supervisor.control.policies.base import (
    DEFAULT_L_PER,
    DEFAULT_L_TRANS,
    DEFAULT_LAMBDA,
    Policy,
)
from dtlaunch.supervisor.control.policies.dd import DdPolicy
from dtlaunch.supervisor.control.policies.lb_bsp import LbBspPolicy
from dtlaunch.supervisor.control.policies.nd import NdPolicy
from dtlaunch.supervisor.control.policies.none import NonePolicy
from dtlaunch.supervisor.control.policies.psld import PsldPolicy
from dtlaunch.supervisor.control.policies.rna import RnaPolicy

__all__ = [
    "BUILTIN_POLICIES",
    "AutoPolicy",
    "BackupPolicy",
    "DdPolicy",
    "ExternalPolicy",
    "LbBspPolicy",
    "NdPolicy",
    "NonePolicy",
    "Policy",
    "PsldPolicy",
    "RnaPolicy",
    "monitor_for",
    "parse_policy",
]

BUILTIN_POLICIES: dict[str, Callable[[dict[str, str]], Policy]] = {
    "none": NonePolicy,
    "lb-bsp": LbBspPolicy,
    "nd": NdPolicy,
    "backup": BackupPolicy,
    "dd": DdPolicy,
    "psld": PsldPolicy,
    "rna": RnaPolicy,
    "auto": AutoPolicy,
}

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")


def parse_policy(text: str) -> Policy:
    """Build the policy ``text`` names (forms in the module doc).

    Raises:
        ConfigError: unknown policy name, malformed or unknown parameter, bad value,
            or a user class that cannot be imported or built.
    """
    text = text.strip()
    head, _, rest = text.partition(":")
    if head in BUILTIN_POLICIES:
        return BUILTIN_POLICIES[head](_parse_params(head, rest))
    class_name, _, param_text = rest.partition(":")
    if not (_MODULE.match(head) and _IDENT.match(class_name)):
        raise ConfigError(
            f"unknown policy {text!r}; use one of {', '.join(BUILTIN_POLICIES)} "
            "(optionally with :k=v,... parameters) or module:Class for your own policy "
            "class, e.g. mypkg.policies:MyPolicy:threshold=2"
        )
    where = f"{head}:{class_name}"
    return _load_user_policy(head, class_name, _parse_params(where, param_text))


def monitor_for(policy: Policy) -> Monitor:
    """A Monitor with the policy's window lengths."""
    return Monitor(l_trans=policy.l_trans, l_per=policy.l_per)


def _parse_params(policy: str, text: str) -> dict[str, str]:
    params: dict[str, str] = {}
    if not text.strip():
        return params
    for item in text.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value:
            raise ConfigError(
                f"policy {policy}: parameter {item.strip()!r} is not key=value; "
                "write e.g. nd:lambda=1.5,l_trans=30"
            )
        if key in params:
            raise ConfigError(f"policy {policy}: parameter {key} given twice")
        params[key] = value
    return params


def _convert(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _load_user_policy(module_name: str, class_name: str, params: dict[str, str]) -> Policy:
    where = f"{module_name}:{class_name}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"policy {where}: cannot import module {module_name} ({err}); install it or "
            "add its folder to PYTHONPATH"
        ) from err
    except Exception as err:  # the user's module itself failed while importing
        raise ConfigError(
            f"policy {where}: importing {module_name} failed: {type(err).__name__}: {err}"
        ) from err
    cls = getattr(module, class_name, None)
    if cls is None or not callable(cls):
        raise ConfigError(f"policy {where}: module {module_name} has no class {class_name}")
    bad = [k for k in params if not _IDENT.match(k)]
    if bad:
        raise ConfigError(f"policy {where}: parameter names must be identifiers: {bad}")
    try:
        obj = cls(**{k: _convert(v) for k, v in params.items()})
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(
            f"policy {where}: {class_name}({', '.join(params)}) failed: "
            f"{type(err).__name__}: {err}; check the parameters it accepts"
        ) from err
    if not callable(getattr(obj, "decide", None)):
        raise ConfigError(
            f"policy {where}: {class_name} has no decide(snapshot) method returning actions"
        )
    return ExternalPolicy(obj, default_name=where)


class ExternalPolicy:
    """A user's policy object, with defaults for what it does not define."""

    def __init__(self, inner: Any, *, default_name: str) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", default_name))
        try:
            self.l_trans = float(getattr(inner, "l_trans", DEFAULT_L_TRANS))
            self.l_per = float(getattr(inner, "l_per", max(DEFAULT_L_PER, self.l_trans)))
            self.lam = float(getattr(inner, "lam", DEFAULT_LAMBDA))
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"policy {self.name}: l_trans, l_per and lam must be numbers ({err})"
            ) from err
        if not 0 < self.l_trans <= self.l_per:
            raise ConfigError(
                f"policy {self.name}: needs 0 < l_trans <= l_per, got "
                f"l_trans={self.l_trans:g} l_per={self.l_per:g}"
            )

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        """The user's actions; anything else is refused here, not deep in the caller.

        Raises: TypeError if ``decide`` returned something that is not a list of actions.
        """
        actions = self.inner.decide(snap)
        if not isinstance(actions, list) or not all(isinstance(a, Action) for a in actions):
            raise TypeError(
                f"policy {self.name}: decide() must return a list of dtlaunch actions, "
                f"got {actions!r}"
            )
        return actions
