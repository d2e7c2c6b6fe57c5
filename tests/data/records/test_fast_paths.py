"""The per-record fast paths agree with the general ones they stand in for.

`wire.features` reads the usual Example layout in one pass and leaves anything else to the
general decoder; packed int64 lists are decoded in Python when short and with NumPy when
long; a record file's cursor keeps its state ready for every record.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from record_files_helpers import write_shards

from phalanx._src.data.records import wire
from phalanx._src.data.records.record_files import RecordFiles
from phalanx.data import make_example

KEY = st.text(max_size=6) | st.sampled_from(["image/encoded", "k" * 127])
VALUE = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4),
    st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=4),
    st.lists(
        st.binary(max_size=20) | st.binary(min_size=130, max_size=300), min_size=1, max_size=3
    ),
    st.binary(min_size=16_400, max_size=16_500),  # 3-byte lengths, as a JPEG's
)
EXAMPLES = st.dictionaries(KEY, VALUE, max_size=4).map(make_example)
EDGES = [b"\x0a\x00", b"\x0a\x80\x00"]  # no features; a non-minimal length: still usual
# Layouts that writers do not emit, which the fast path must leave to the general one.
UNUSUAL = [
    b"",
    b"\x0a\x00\x0a\x00",  # two `features` fields, merged
    b"\x10\x05",  # an unknown varint field
    b"\x0a\x0c\x0a\x0a\x0a\x01k\x12\x05\x20\x01\x1a\x01\x05",  # an unknown field in a Feature
    b"\x0a\x07\x0a\x05\x0a\x01k\x12\x00",  # a Feature with no list
    b"\x0a\x09\x0a\x07\x12\x02\x1a\x00\x0a\x01k",  # value before key
    b"\x0a\x0b\x0a\x09\x0a\x01k\x12\x04\x1a\x00\x0a\x00",  # two lists in one Feature
    b"\x0a\x08\x0a\x06\x0a\x01k\x12\x01\x1a",  # a Feature cut inside its list
    b"\x0a\x05\x0a\x09\x0a\x01k",  # an entry longer than its message
    make_example({"k" * 128: [1]}),  # a key of 128 bytes or more
]


def both(record: bytes) -> tuple[object, object]:
    """The fast path's answer (None: not its layout) and the general path's (or its error)."""
    try:
        general: object = wire._any_features(record)
    except wire.WireError as e:
        general = e
    return wire._usual_features(record), general


@settings(max_examples=200, deadline=None)
@given(record=EXAMPLES)
def test_the_usual_layout_takes_the_fast_path_and_agrees(record):
    fast, general = both(record)
    assert fast is not None
    assert fast == general
    assert wire.features(record) == general


@settings(max_examples=300, deadline=None)
@given(
    record=EXAMPLES | st.sampled_from(UNUSUAL + EDGES),
    damage=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=3),
    cut=st.floats(0, 1),
    tail=st.sampled_from([b"", b"\x10\x05", b"\x0a\x00", make_example({"k": [1]})]),
)
def test_any_other_record_agrees_or_falls_back(record, damage, cut, tail):
    data = bytearray(record + tail)
    for where, value in damage:
        if data:
            data[int(where * len(data))] = value
    data = bytes(data[: int(cut * len(data)) or None])
    fast, general = both(data)
    if fast is not None:
        assert fast == general
    try:
        assert wire.features(data) == general
    except wire.WireError as e:
        assert str(e) == str(general)


@pytest.mark.parametrize("record", UNUSUAL)
def test_unusual_layouts_fall_back(record):
    assert both(EDGES[0]) == ({}, {}) and both(EDGES[1]) == ({}, {})
    fast, general = both(record)
    assert fast is None
    if not isinstance(general, Exception):
        assert wire.features(record) == general


@settings(max_examples=300, deadline=None)
@given(
    payload=st.binary(max_size=40)
    | st.lists(st.integers(0, 2**64 - 1)).map(lambda v: b"".join(wire._encode_varint(x) for x in v))
)
def test_short_and_long_packed_ints_decode_alike(payload):
    try:
        short = wire._int64s(wire._short_varints(payload, 0, len(payload)))
    except wire.WireError:
        short = None
    try:
        long = wire._packed_varints(payload, 0, len(payload)).view(np.int64)
    except wire.WireError:
        long = None
    if short is None or long is None:
        assert short is long  # both refuse it (their messages may say it differently)
    else:
        assert short.dtype == long.dtype == np.int64
        assert short.tolist() == long.tolist()


def test_int64s_wraps_past_two_to_the_63():
    got = wire._int64s([0, 2**63 - 1, 2**63, 2**64 - 1])
    assert got.dtype == np.int64
    assert got.tolist() == [0, 2**63 - 1, -(2**63), -1]
    assert wire._int64s([]).dtype == np.int64


def drain(cursor: object) -> tuple[list[bytes], list[dict]]:
    """The cursor's records, and its state before each and after the last."""
    records, states = [], [copy.deepcopy(cursor.state())]
    while True:
        try:
            records.append(next(cursor))
        except StopIteration:
            return records, states
        states.append(copy.deepcopy(cursor.state()))


@pytest.mark.parametrize("cycle", [1, 3])
def test_every_state_snapshot_stays_as_taken_and_resumes_at_its_record(tmp_path, cycle):
    paths, _ = write_shards(tmp_path, 4, [5, 0, 7, 3])
    node = RecordFiles(tuple(paths), "", None, cycle)
    cursor = node.open((), None)
    kept = []  # the snapshots themselves, which later records must leave alone
    records, states = [], []
    while True:
        kept.append(cursor.state())
        states.append(copy.deepcopy(kept[-1]))
        try:
            records.append(next(cursor))
        except StopIteration:
            break
    assert kept == states
    for i, state in enumerate(states):
        assert drain(node.open((), state))[0] == records[i:], i
