"""msgpack encoding of wire messages, with strict validation on the way in.

A frame is a msgpack map ``{"t": TYPE, "v": PROTOCOL_VERSION, **fields}``; nested
``Record`` values are plain maps. ``decode`` trusts nothing: it checks the size
before unpacking, refuses ext types, bounds nesting (msgpack's unpacker stack;
validation follows the schema, never the data's depth), and validates every
field against the message dataclass's type hints (exact types: ``bool`` is not
``int``; an ``int`` is accepted for a ``float``), the enumerated strings and the
value ranges below.
Anything wrong becomes a ``WireError`` and nothing else, so a receive loop needs
one ``except`` to log and drop a bad frame.

``to_dict``/``from_dict`` are the JSON form of the same messages (the agent's
bootstrap line, event logs): identical except that ``bytes`` fields travel as
base64 text.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib
import math
import reprlib
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgpack

from dtlaunch.errors import WireError
from dtlaunch.wire import messages as _messages
from dtlaunch.wire.fastcheck import FastField, compile_fast
from dtlaunch.wire.fieldrules import field_rule
from dtlaunch.wire.messages import (
    PROTOCOL_VERSION,
    Message,
    Record,
)

__all__ = ["MAX_MESSAGE_BYTES", "compile_all", "decode", "encode", "from_dict", "to_dict"]

MAX_MESSAGE_BYTES = 4 * 1024 * 1024

M = TypeVar("M", bound=Message)

_TAG_KEYS = ("t", "v")
# The registry by tag, filled one protocol module at a time as they are imported
# (see ``messages``); a tag not in it makes the codec import the rest once.
_TYPES_BY_TAG: dict[str, type[Message]] = {}
_LOADED: set[str] = set()  # protocol modules whose MESSAGES are in _TYPES_BY_TAG

# (value, path) -> validated value; raises WireError naming ``path``.
_Check = Callable[[Any, str], Any]
_RECORD_CHECKS: dict[tuple[type[Any], bool], _Check] = {}
_FAST_CHECKS: dict[type[Any], Callable[[Any], Any]] = {}
_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}
# The path a checker gets on the fast first pass (see _build): build no names.
_NO_PATH = ""
_SCALARS = frozenset({float, int, str, bool, type(None)})


# ------------------------------------------------------------------- public API


def encode(msg: Message) -> bytes:
    """Encode ``msg`` as one msgpack frame.

    Raises:
        WireError: ``msg`` breaks the protocol (a bug in the sender: wrong field
            type, value out of range) or encodes to more than ``MAX_MESSAGE_BYTES``.
    """
    plain = _plain_message(msg, json_form=False)
    _build(type(msg), plain, json_form=False)  # the receiver would drop it: fail here
    try:
        data: bytes = msgpack.packb(plain, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"{msg.TYPE}: cannot encode: {exc}") from exc
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(
            f"{msg.TYPE}: encodes to {len(data)} bytes, over the {MAX_MESSAGE_BYTES}-byte "
            "frame limit; send the payload in smaller chunks"
        )
    return data


def decode(data: bytes) -> Message:
    """Decode and validate one frame.

    Raises:
        WireError: on any problem whatsoever (size, msgpack syntax, ext types,
            unknown type tag, other protocol version, field types or values).
    """
    try:
        size = len(data)
    except TypeError:
        raise WireError(f"frame is {type(data).__name__}, not bytes") from None
    if size > MAX_MESSAGE_BYTES:
        raise WireError(f"frame of {size} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
            timestamp=0,
        )
    except WireError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types; all mean "not a message"
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise WireError(f"not valid msgpack ({detail})") from exc
    if type(obj) is not dict:
        raise WireError(f"frame holds a msgpack {type(obj).__name__}, expected a map")
    # Version before type: a newer peer's new message type is a version problem.
    version = obj.get("v")
    if type(version) is not int:
        raise WireError(f"frame has no integer protocol version 'v' (got {_short(version)})")
    if version != PROTOCOL_VERSION:
        raise WireError(_version_mismatch(version))
    tag = obj.get("t")
    if type(tag) is not str:
        raise WireError(f"frame has no string type tag 't' (got {_short(tag)})")
    cls = _TYPES_BY_TAG.get(tag) or _registered_tag(tag)
    if cls is None:
        raise WireError(f"unknown message type {_short(tag)}")
    try:
        return _build(cls, obj, json_form=False)
    except WireError:
        raise
    except Exception as exc:  # a bug of ours must still not let a frame through, or out
        raise WireError(f"{cls.TYPE}: not a valid message ({type(exc).__name__})") from exc


def to_dict(msg: Message) -> dict[str, object]:
    """The JSON-able plain form of ``msg``: tags, fields, nested maps; bytes as base64."""
    return _plain_message(msg, json_form=True)


def from_dict(cls: type[M], data: Mapping[str, object]) -> M:
    """Build a ``cls`` from its ``to_dict`` form, validating it as strictly as ``decode``.

    ``"t"`` and ``"v"`` may be absent; when present they must match ``cls.TYPE``
    and ``PROTOCOL_VERSION``. ``bytes`` fields take base64 text (or raw bytes).

    Raises:
        WireError: ``data`` is not a valid ``cls``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Message) and cls.TYPE):
        raise WireError(f"{cls!r} is not a message class")
    if not isinstance(data, Mapping):
        raise WireError(f"{cls.TYPE}: expected a mapping, got {type(data).__name__}")
    return _build(cls, data, json_form=True)


# ------------------------------------------------------------------ validation


def _build(cls: type[M], data: Mapping[Any, Any], *, json_form: bool) -> M:
    """Validate ``data`` (fields plus optional tags) and construct ``cls``."""
    tag = data.get("t", cls.TYPE)
    if tag != cls.TYPE:
        raise WireError(f"type tag {_short(tag)} does not match {cls.TYPE!r}")
    version = data.get("v", PROTOCOL_VERSION)
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise WireError(f"{cls.TYPE}: {_version_mismatch(version)}")
    fields = {k: v for k, v in data.items() if k not in _TAG_KEYS}
    try:
        # First a validator compiled for the class (``fastcheck``) or, for the JSON
        # form, the checkers without paths: naming every field and list item as it
        # goes costs as much as the checks themselves, and nearly every frame is valid.
        if json_form:
            return typing.cast(M, _record_check(cls, json_form)(fields, _NO_PATH))
        return typing.cast(M, _fast_check(cls)(fields))
    except WireError:
        # Again, to name what is wrong.
        return typing.cast(M, _record_check(cls, json_form)(fields, cls.TYPE))


def _record_check(cls: type[Any], json_form: bool) -> _Check:
    """A checker turning a plain map into a ``cls`` instance (compiled once per class)."""
    check = _RECORD_CHECKS.get((cls, json_form))
    if check is None:
        check = _RECORD_CHECKS[cls, json_form] = _compile_record_check(cls, json_form)
    return check


def _fast_check(cls: type[Any]) -> Callable[[Any], Any]:
    """The compiled first pass for the binary form of ``cls`` (compiled once)."""
    fast = _FAST_CHECKS.get(cls)
    if fast is None:
        hints = typing.get_type_hints(cls)
        specs = []
        for f in dataclasses.fields(cls):
            name = f.name
            choices, low, strict, ports = field_rule(cls, name)
            specs.append(
                FastField(
                    name=name,
                    hint=hints[name],
                    required=f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING,
                    choices=choices,
                    low=low,
                    strict=strict,
                    ordinary=_field_check(cls, name, hints[name], json_form=False),
                    plain=not ports,
                )
            )
        fast = _FAST_CHECKS[cls] = compile_fast(cls, specs, _fast_check)
    return fast


def _compile_record_check(cls: type[Any], json_form: bool) -> _Check:
    hints = typing.get_type_hints(cls)
    specs: list[tuple[str, _Check, bool]] = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        specs.append((f.name, _field_check(cls, f.name, hints[f.name], json_form), required))
    known = frozenset(name for name, _, _ in specs)

    def check(value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            raise WireError(f"{path}: expected a map, got {_type_name(value)}")
        unknown = [k for k in value if k not in known]
        if unknown:
            names = ", ".join(sorted(_short(k) for k in unknown))
            raise WireError(f"{path}: unknown field(s) {names}")
        missing = [name for name, _, req in specs if req and name not in value]
        if missing:
            raise WireError(f"{path}: missing required field(s) {', '.join(missing)}")
        if not path:
            kwargs = {
                name: field_check(value[name], _NO_PATH)
                for name, field_check, _ in specs
                if name in value
            }
        else:
            kwargs = {
                name: field_check(value[name], f"{path}.{name}")
                for name, field_check, _ in specs
                if name in value
            }
        try:
            return cls(**kwargs)
        except Exception as exc:  # a __post_init__ check; never seen with today's classes
            raise WireError(f"{path}: {exc}") from exc

    return check


def _field_check(owner: type[Any], name: str, hint: Any, json_form: bool) -> _Check:
    """The type checker for one field plus the field's rule (``fieldrules.field_rule``)."""
    base = _type_check(hint, json_form)
    choices, low, strict, ports = field_rule(owner, name)
    if choices is not None:
        return _with_choices(base, choices)
    if low is not None:
        if typing.get_origin(hint) is list:  # a column of numbers: the bound holds for each
            return _with_min_each(base, low, strict=strict)
        return _with_min(base, low, strict=strict)
    if ports:
        return _with_ports(base)
    return base


def _with_choices(base: _Check, choices: tuple[str, ...]) -> _Check:
    def check(value: Any, path: str) -> Any:
        value = base(value, path)
        if value not in choices:
            raise WireError(f"{path}: {_short(value)} is not one of {', '.join(choices)}")
        return value

    return check


def _with_min(base: _Check, low: float, *, strict: bool) -> _Check:
    def check(value: Any, path: str) -> Any:
        value = base(value, path)
        if value is not None and (value <= low if strict else value < low):
            bound = f"> {low}" if strict else f">= {low}"
            raise WireError(f"{path}: {value} is out of range (must be {bound})")
        return value

    return check


def _with_min_each(base: _Check, low: float, *, strict: bool) -> _Check:
    def check(value: Any, path: str) -> Any:
        value = base(value, path)
        for i, item in enumerate(value):
            if item <= low if strict else item < low:
                bound = f"> {low}" if strict else f">= {low}"
                raise WireError(f"{path}[{i}]: {item} is out of range (must be {bound})")
        return value

    return check


def _with_ports(base: _Check) -> _Check:
    def check(value: Any, path: str) -> Any:
        value = base(value, path)
        for i, port in enumerate(value):
            if not 1 <= port <= 65535:
                raise WireError(f"{path}[{i}]: {port} is not a TCP port (1..65535)")
        return value

    return check


def _type_check(hint: Any, json_form: bool) -> _Check:
    """A checker for one type hint: exact scalars, unions with None, lists, dicts, records."""
    if hint is bool:
        return _exact(bool)
    if hint is int:
        return _exact(int)
    if hint is str:
        return _exact(str)
    if hint is float:
        return _float
    if hint is bytes:
        return _bytes_json if json_form else _exact(bytes)
    if hint is type(None):
        return _exact(type(None))
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union([_type_check(arg, json_form) for arg in args], hint)
    if origin is list and len(args) == 1:
        return _list(_type_check(args[0], json_form))
    if origin is dict and len(args) == 2 and args[0] is str:
        return _dict(_type_check(args[1], json_form))
    if isinstance(hint, type) and issubclass(hint, Record) and dataclasses.is_dataclass(hint):
        return _record_check(hint, json_form)
    raise TypeError(f"the wire codec cannot validate fields of type {hint!r}")


def _exact(expected: type[Any]) -> _Check:
    name = "null" if expected is type(None) else expected.__name__

    def check(value: Any, path: str) -> Any:
        if type(value) is not expected:
            raise WireError(f"{path}: expected {name}, got {_type_name(value)}")
        return value

    return check


def _float(value: Any, path: str) -> Any:
    if type(value) is int:
        value = float(value)
    elif type(value) is not float:
        raise WireError(f"{path}: expected float, got {_type_name(value)}")
    if not math.isfinite(value):
        raise WireError(f"{path}: {value} is not a finite number")
    return value


def _all_finite_floats(values: list[Any]) -> bool:
    """Whether ``_float`` would pass every item unchanged (else it checks each)."""
    return all(type(v) is float for v in values) and all(map(math.isfinite, values))


def _bytes_json(value: Any, path: str) -> Any:
    if type(value) is bytes:
        return value
    if type(value) is not str:
        raise WireError(f"{path}: expected base64 text, got {_type_name(value)}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WireError(f"{path}: not valid base64: {exc}") from exc


def _union(options: list[_Check], hint: Any) -> _Check:
    def check(value: Any, path: str) -> Any:
        for option in options:
            try:
                return option(value, path)
            except WireError:
                continue
        raise WireError(f"{path}: expected {_hint_name(hint)}, got {_type_name(value)}")

    return check


def _list(item: _Check) -> _Check:
    def check(value: Any, path: str) -> Any:
        if type(value) is not list:
            raise WireError(f"{path}: expected a list, got {_type_name(value)}")
        if item is _float and _all_finite_floats(value):
            return value  # a status snapshot's sparklines: 10^4 floats, one pass
        if not path:
            return [item(v, _NO_PATH) for v in value]
        return [item(v, f"{path}[{i}]") for i, v in enumerate(value)]

    return check


def _dict(item: _Check) -> _Check:
    def check(value: Any, path: str) -> Any:
        if type(value) is not dict:
            raise WireError(f"{path}: expected a map, got {_type_name(value)}")
        out: dict[str, Any] = {}
        for k, v in value.items():
            if type(k) is not str:
                raise WireError(f"{path}: key {_short(k)} is not a string")
            out[k] = item(v, path if not path else f"{path}[{k!r}]")
        return out

    return check


def _registered(cls: type[Message]) -> bool:
    """``cls`` is in the registry (its protocol module's ``MESSAGES`` are loaded here
    on its first message)."""
    if _TYPES_BY_TAG.get(cls.TYPE) is cls:
        return True
    _load_protocol(cls.__module__)
    return _TYPES_BY_TAG.get(cls.TYPE) is cls


def _registered_tag(tag: str) -> type[Message] | None:
    """The class of a tag not seen yet: from the protocol modules imported already,
    else every protocol module is imported (once)."""
    for module in _messages.PROTOCOL_MODULES:
        if module in sys.modules:
            _load_protocol(module)
    if tag not in _TYPES_BY_TAG:
        for module in _messages.PROTOCOL_MODULES:
            _load_protocol(module)
    return _TYPES_BY_TAG.get(tag)


def _load_protocol(module: str) -> None:
    if module in _LOADED or module not in _messages.PROTOCOL_MODULES:
        return
    for cls in importlib.import_module(module).MESSAGES:
        _TYPES_BY_TAG[cls.TYPE] = cls
    _LOADED.add(module)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack ext type {code} is not allowed")


def compile_all() -> None:
    """Compile every class's checkers now, else each on its first use (a field type
    the codec cannot validate fails here; tests call it). Not at import: that took
    140 ms of every agent's and worker's start, for the few classes each decodes."""
    for cls in _messages.registry():
        _record_check(cls, False)
        _record_check(cls, True)
        _fast_check(cls)


# ---------------------------------------------------------------- plain forms


def _plain_message(msg: Message, *, json_form: bool) -> dict[str, object]:
    if not isinstance(msg, Message) or not _registered(type(msg)):
        raise WireError(f"{type(msg).__name__} is not a registered wire message")
    out: dict[str, object] = {"t": msg.TYPE, "v": PROTOCOL_VERSION}
    for name in _field_names(type(msg)):
        field = getattr(msg, name)
        out[name] = field if type(field) in _SCALARS else _plain_value(field, json_form)
    return out


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    """A record's field names; ``dataclasses.fields`` rebuilds them on every call."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _plain_value(value: object, json_form: bool) -> object:
    # Numbers and text first, without a call per field: a status answer holds
    # 1,000 records of fifteen fields, nearly all of them scalars.
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Record):
        plain: dict[str, object] = {}
        for name in _field_names(type(value)):
            field = getattr(value, name)
            plain[name] = field if type(field) in _SCALARS else _plain_value(field, json_form)
        return plain
    if isinstance(value, list | tuple):
        if all(type(v) in _SCALARS for v in value):
            return list(value)  # numbers and text stay as they are: no call per item
        return [_plain_value(v, json_form) for v in value]
    if isinstance(value, dict):
        return {k: _plain_value(v, json_form) for k, v in value.items()}
    if json_form and isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    return value


# ------------------------------------------------------------- error helpers


def _version_mismatch(version: object) -> str:
    return (
        f"protocol version {_short(version)} from the peer, this side speaks "
        f"{PROTOCOL_VERSION}; run the same dtlaunch version on every host"
    )


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _hint_name(hint: Any) -> str:
    return str(hint).replace("NoneType", "None")


# Error messages quote untrusted input: a few levels of it, a few items each, so a
# value nested a thousand deep or a million long costs nothing to describe.
_QUOTE = reprlib.Repr()  # keyword arguments only from Python 3.12
_QUOTE.maxlevel, _QUOTE.maxlist, _QUOTE.maxdict = 3, 4, 4
_QUOTE.maxstring = _QUOTE.maxother = _QUOTE.maxlong = 40


def _short(value: object, limit: int = 60) -> str:
    """A bounded ``repr`` of untrusted input, cut to ``limit`` characters."""
    text = _QUOTE.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
