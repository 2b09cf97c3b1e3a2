"""Compiled first-pass validators: the codec's fast path for frames that are valid.

The codec (``codec.py``) validates a frame with small checker functions, one per
field and list item, that name the path of whatever is wrong. At thousands of
frames a second that generality was the largest single cost of the supervisor
(a step report of a few steps made some forty checker calls). Nearly every
frame is valid, so the codec first runs a validator compiled for the record
class: straight-line code per field, the same tests inline. It answers only
"valid, here is the record" or "not sure": on any doubt it raises ``WireError``
and the codec runs its ordinary checkers, which accept or name the problem
exactly as before. The compiled code must therefore never accept what the
ordinary checkers refuse; ``tests/test_codec_fastcheck.py`` holds the two
against each other on every message type and on mutated frames.

Fields whose rule is not a plain scalar, a list of scalars or a nested record
(unions, maps, port lists, bytes) call the field's ordinary checker from the
compiled code, so every rule stays written once.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dtlaunch.errors import WireError

__all__ = ["NOT_TAKEN", "FastField", "compile_fast"]

# The text of a miss; never shown: the codec's checkers raise their own error.
NOT_TAKEN = "not taken by the compiled first pass"


@dataclass(frozen=True, slots=True)
class FastField:
    """One field of a record as the compiled validator needs it."""

    name: str
    hint: Any  # the field's type hint
    required: bool
    choices: tuple[str, ...] | None  # allowed values of a str field
    low: float | None  # lower bound of a number
    strict: bool  # the bound itself excluded
    ordinary: Callable[[Any, str], Any]  # the codec's checker for this field
    plain: bool  # no rule beyond type, choices and bound (e.g. not a port list)


def compile_fast(
    cls: type[Any],
    fields: list[FastField],
    nested: Callable[[type[Any]], Callable[[Any], Any]],
) -> Callable[[Any], Any]:
    """A function taking a decoded map to a ``cls`` instance, or raising
    ``WireError``. ``nested(R)`` gives the compiled validator of record ``R``
    (compiled on first use, so records may nest)."""
    names = {f.name for f in fields}
    required = [f.name for f in fields if f.required]
    env: dict[str, Any] = {
        "WireError": WireError,
        "NOT_TAKEN": NOT_TAKEN,
        "CLS": cls,
        "KNOWN": frozenset(names),
        "isfinite": math.isfinite,
        "all_finite": _all_finite_floats,
        "to_float": _to_float,
    }
    lines = [
        "def fast(value):",
        "    if type(value) is not dict or not value.keys() <= KNOWN:",
        "        raise WireError(NOT_TAKEN)",
    ]
    if required:
        present = " and ".join(f"{name!r} in value" for name in required)
        lines += [f"    if not ({present}):", "        raise WireError(NOT_TAKEN)"]
    lines.append("    kw = {}")
    for i, spec in enumerate(fields):
        body = _field_code(spec, f"f{i}", env, nested)
        indent = "    " if spec.required else "        "
        if not spec.required:
            lines.append(f"    if {spec.name!r} in value:")
        lines.append(f"{indent}v = value[{spec.name!r}]")
        lines += [indent + line for line in body]
        lines.append(f"{indent}kw[{spec.name!r}] = v")
    lines += [
        "    try:",
        "        return CLS(**kw)",
        "    except Exception:",  # a __post_init__ refusal: the ordinary path names it
        "        raise WireError(NOT_TAKEN) from None",
    ]
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), env, namespace)  # built from our own type hints, never from input
    fast: Callable[[Any], Any] = namespace["fast"]
    return fast


def _field_code(
    spec: FastField,
    key: str,
    env: dict[str, Any],
    nested: Callable[[type[Any]], Callable[[Any], Any]],
) -> list[str]:
    """Statements that check ``v`` and leave the validated value in ``v``."""
    hint = spec.hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    scalar = _scalar_test(hint)
    if spec.plain and scalar is not None:
        code = [f"if {scalar.format(v='v')}:", "    raise WireError(NOT_TAKEN)"]
        if hint is float:
            code = [
                "if type(v) is int:",
                "    v = float(v)",
                "elif type(v) is not float or not isfinite(v):",
                "    raise WireError(NOT_TAKEN)",
            ]
        if spec.choices is not None:
            env[f"{key}_choices"] = frozenset(spec.choices)
            code += [f"if v not in {key}_choices:", "    raise WireError(NOT_TAKEN)"]
        if spec.low is not None:
            op = "<=" if spec.strict else "<"
            code += [f"if v {op} {spec.low!r}:", "    raise WireError(NOT_TAKEN)"]
        return code
    if spec.plain and spec.choices is None and origin is list:
        item = args[0]
        # A bound on a list holds for each item (a column of a StepReports).
        bound = (
            []
            if spec.low is None
            else [
                f"if v and min(v) {'<=' if spec.strict else '<'} {spec.low!r}:",
                "    raise WireError(NOT_TAKEN)",
            ]
        )
        if item is float:
            return [
                "if type(v) is not list:",
                "    raise WireError(NOT_TAKEN)",
                "if not all_finite(v):",
                "    v = [to_float(x) for x in v]",
                *bound,
            ]
        item_test = _scalar_test(item)
        if item_test is not None and (spec.low is None or item is int):
            return [
                "if type(v) is not list:",
                "    raise WireError(NOT_TAKEN)",
                "for x in v:",
                f"    if {item_test.format(v='x')}:",
                "        raise WireError(NOT_TAKEN)",
                *bound,
            ]
    if spec.plain and spec.choices is None and spec.low is None and origin is list:
        item = args[0]
        if _is_record(item):
            env[f"{key}_item"] = nested(item)
            return [
                "if type(v) is not list:",
                "    raise WireError(NOT_TAKEN)",
                f"v = [{key}_item(x) for x in v]",
            ]
    if spec.plain and spec.choices is None and spec.low is None and _is_record(hint):
        env[f"{key}_record"] = nested(hint)
        return [f"v = {key}_record(v)"]
    # Anything else: the field's ordinary checker (it raises WireError, which the
    # codec treats as a miss too).
    env[f"{key}_ordinary"] = spec.ordinary
    return [f"v = {key}_ordinary(v, '')"]


def _scalar_test(hint: Any) -> str | None:
    """A test that is true when ``{v}`` is NOT of the exact scalar type."""
    if hint is float:
        return "type({v}) is not float"  # replaced by the float code; lists use to_float
    for scalar in (int, str, bool):
        if hint is scalar:
            return f"type({{v}}) is not {scalar.__name__}"
    return None


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and hasattr(hint, "__dataclass_fields__")


def _to_float(value: Any) -> float:
    if type(value) is int:
        return float(value)
    if type(value) is not float or not math.isfinite(value):
        raise WireError(NOT_TAKEN)
    return value


def _all_finite_floats(values: list[Any]) -> bool:
    return all(type(v) is float for v in values) and all(map(math.isfinite, values))
