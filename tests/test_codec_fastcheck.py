"""The codec's compiled first pass (``wire/fastcheck.py``) against its ordinary checkers.

The compiled validator may only say "valid, here is the record" when the
ordinary checkers would say the same and build the same record; on any doubt it
must defer. These tests run both on every sample message and on frames mutated
field by field (nested records and list items included), and fail on any frame
the compiled code accepts differently.
"""

from __future__ import annotations

import math
import subprocess
import sys

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtlaunch.errors import WireError
from dtlaunch.wire import codec
from dtlaunch.wire.codec import decode, encode
from dtlaunch.wire.messages import MESSAGE_TYPES, NodeStatus, StepReport, StepReports
from tests.test_codec import SAMPLES, values

FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def both_ways(cls, fields):
    """(compiled result or None, ordinary result or None): None means refused."""
    try:
        fast = codec._fast_check(cls)(dict(fields))
    except WireError:
        fast = None
    try:
        ordinary = codec._record_check(cls, False)(dict(fields), cls.__name__)
    except WireError:
        ordinary = None
    return fast, ordinary


def assert_agree(cls, fields):
    fast, ordinary = both_ways(cls, fields)
    if fast is not None:  # accepted by the compiled pass: exactly what the checkers build
        assert ordinary is not None, f"compiled pass accepted what the checkers refuse: {fields!r}"
        assert fast == ordinary
        assert _same_types(fast, ordinary)


def _same_types(a, b) -> bool:
    """Equal values of the same types (1 == 1.0 would hide an int left unconverted)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_types, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_types(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return all(_same_types(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return True


def plain_fields(msg) -> dict:
    fields = msgpack.unpackb(encode(msg))
    del fields["t"], fields["v"]
    return fields


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_sample_is_taken_by_the_compiled_pass(msg):
    fast, ordinary = both_ways(type(msg), plain_fields(msg))
    assert fast == ordinary == msg
    assert _same_types(fast, ordinary)


def test_every_message_type_has_a_compiled_pass():
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES)
    codec.compile_all()  # a field type the codec cannot validate fails here
    for cls in MESSAGE_TYPES:
        assert callable(codec._fast_check(cls))
        assert callable(codec._record_check(cls, True))


def test_importing_the_codec_compiles_nothing():
    """Checkers are compiled on first use: an agent or a worker pays for the few
    classes it decodes, not for all of them at import (140 ms of its start)."""
    code = (
        "import dtlaunch.wire.codec as c; from dtlaunch.wire.messages import Ping\n"
        "assert not c._FAST_CHECKS and not c._RECORD_CHECKS, 'compiled at import'\n"
        "c.decode(c.encode(Ping(seq=1)))\n"
        "assert set(c._FAST_CHECKS) == {Ping} and not c._RECORD_CHECKS\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_bounds_choices_and_conversions_match_the_checkers():
    report = plain_fields(
        StepReports.of(
            [
                StepReport(step=1, batch_size=2, compute_s=0.5),
                StepReport(step=2, batch_size=2, compute_s=0.25, samples=2),
            ]
        )
    )
    cases = [
        ("step", [1, -1]),  # a column's bound holds for each item
        ("step", [-1]),
        ("step", [1, 2.0]),
        ("step", 1),
        ("compute_s", [0.5, -0.1]),
        ("compute_s", [1, 0.25]),  # an int becomes a float
        ("compute_s", [math.inf, 0.1]),
        ("compute_s", [0.1, math.nan]),
        ("compute_s", [True, 0.1]),
        ("compute_s", [0.5]),  # shorter than the other columns
        ("batch_size", [2.0, 2]),
        ("batch_size", [True, 2]),
        ("samples", [0, -2]),
        ("age_s", ["x", 0.0]),
        ("servers", [[{"server": 0, "nbytes": 1, "comm_s": 0}], []]),
        ("servers", [[{"server": -1, "nbytes": 1, "comm_s": 0.1}], []]),
        ("servers", [[{"server": 0, "nbytes": 1}], []]),
        ("servers", [[{"server": 0, "nbytes": 1, "comm_s": 0.1, "x": 1}], []]),
        ("servers", [[]]),  # one list for two steps
        ("servers", {}),
    ]
    for key, value in cases:
        assert_agree(StepReports, dict(report, **{key: value}))
    frame = msgpack.packb(
        {"t": StepReports.TYPE, "v": codec.PROTOCOL_VERSION, **dict(report, step=[1, -1])}
    )
    with pytest.raises(WireError, match=r"step_reports\.step\[1\]: -1 is out of range"):
        decode(frame)  # the compiled pass defers; the checkers name the problem
    frame = msgpack.packb(
        {"t": StepReports.TYPE, "v": codec.PROTOCOL_VERSION, **dict(report, samples=[0])}
    )
    with pytest.raises(WireError, match="columns of unequal length"):
        decode(frame)


@pytest.mark.parametrize(
    "recent",
    [[0.1, 0.2], [1, 0.2], [0.1, math.nan], [0.1, math.inf], [0.1, "x"], [True], [], [None], 1.0],
)
def test_a_nested_list_of_floats_is_checked_and_converted_as_by_the_checkers(recent):
    node = plain_fields_of_record(NodeStatus(role="worker", rank=0, host="h", proc_state="running"))
    assert_agree(NodeStatus, dict(node, recent_bpt_s=recent))


def plain_fields_of_record(record) -> dict:
    return msgpack.unpackb(msgpack.packb(codec._plain_value(record, False)))


def _mutate(value, data, depth=0):
    """``value`` with one part replaced, dropped or added, chosen by ``data``."""
    if isinstance(value, dict) and value and depth < 4:
        key = data.draw(st.sampled_from(sorted(value, key=repr)))
        action = data.draw(st.sampled_from(["drop", "set", "add", "deeper"]))
        out = dict(value)
        if action == "drop":
            del out[key]
        elif action == "set":
            out[key] = data.draw(values)
        elif action == "add":
            out[data.draw(st.text(max_size=8))] = data.draw(values)
        else:
            out[key] = _mutate(value[key], data, depth + 1)
        return out
    if isinstance(value, list) and value and depth < 4:
        i = data.draw(st.integers(0, len(value) - 1))
        out = list(value)
        out[i] = (
            _mutate(value[i], data, depth + 1) if data.draw(st.booleans()) else data.draw(values)
        )
        return out
    return data.draw(values)


@FUZZ
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_mutated_frames_are_never_accepted_differently(msg, data):
    fields = plain_fields(msg)
    mutated = _mutate(fields, data)
    if isinstance(mutated, dict):
        assert_agree(type(msg), mutated)
