"""tf.train.Example without TensorFlow: make_example -> parse round trips and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.data import (
    FixedLenFeature,
    SparseTensorValue,
    TFRecordDataset,
    TFRecordWriter,
    VarLenFeature,
    make_example,
    parse_example,
    parse_single_example,
    string,
)

VALUES = {
    "image/encoded": b"\xff\xd8jpeg\x00bytes",
    "image/class/label": 7,
    "bbox": np.array([0.25, 0.5, -1.5, 3e38], np.float32),
    "ids": [-1, 0, 2**40, -(2**63), 2**63 - 1],
    "names": ["a", "bé", ""],
    "flag": True,
}


def spec() -> dict:
    return {
        "image/encoded": FixedLenFeature([], string),
        "image/class/label": FixedLenFeature([], np.int64),
        "bbox": FixedLenFeature([2, 2], np.float32),
        "ids": VarLenFeature(np.int64),
        "names": FixedLenFeature([3], bytes),
        "flag": FixedLenFeature([1], np.int64),
        "missing": FixedLenFeature([2], np.float32, default_value=[1.0, 2.0]),
    }


def test_round_trip_every_field_type():
    parsed = parse_single_example(make_example(VALUES), spec())
    assert parsed["image/encoded"] == VALUES["image/encoded"]
    assert type(parsed["image/encoded"]) is bytes
    assert parsed["image/class/label"].dtype == np.int64 and parsed["image/class/label"] == 7
    np.testing.assert_array_equal(parsed["bbox"], VALUES["bbox"].reshape(2, 2))
    assert parsed["bbox"].dtype == np.float32
    ids = parsed["ids"]
    assert isinstance(ids, SparseTensorValue)
    np.testing.assert_array_equal(ids.values, np.array(VALUES["ids"], np.int64))
    np.testing.assert_array_equal(ids.indices, np.arange(5)[:, None])
    np.testing.assert_array_equal(ids.dense_shape, [5])
    assert parsed["names"].dtype == object
    assert parsed["names"].tolist() == [b"a", "bé".encode(), b""]
    assert parsed["flag"].tolist() == [1]
    np.testing.assert_array_equal(parsed["missing"], [1.0, 2.0])


def test_parse_example_stacks_a_batch_and_joins_var_len_values():
    records = [make_example({"x": [1, 2], "s": b"a"}), make_example({"x": [], "s": b"bb"})]
    records.append(make_example({"x": [5], "s": b""}))
    out = parse_example(records, {"x": VarLenFeature(np.int64), "s": FixedLenFeature([], string)})
    assert out["s"].tolist() == [b"a", b"bb", b""]
    np.testing.assert_array_equal(out["x"].indices, [[0, 0], [0, 1], [2, 0]])
    np.testing.assert_array_equal(out["x"].values, [1, 2, 5])
    np.testing.assert_array_equal(out["x"].dense_shape, [3, 2])


def test_through_the_writer_and_reader_with_map(tmp_path):
    path = str(tmp_path / "examples.tfrecord")
    with TFRecordWriter(path, "GZIP") as writer:
        for i in range(6):
            writer.write(make_example({"label": i, "x": [float(i), -float(i)]}))
    features = {"label": FixedLenFeature([], np.int64), "x": FixedLenFeature([2], np.float32)}
    ds = TFRecordDataset(path, "GZIP").map(lambda r: parse_single_example(r, features))
    batches = list(ds.batch(4))
    assert batches[0]["label"].tolist() == [0, 1, 2, 3]
    assert batches[1]["x"].tolist() == [[4.0, -4.0], [5.0, -5.0]]


def test_a_missing_key_without_default_names_the_key():
    with pytest.raises(ValueError, match="'label' is missing"):
        parse_single_example(make_example({"x": 1}), {"label": FixedLenFeature([], np.int64)})


def test_a_wrong_type_names_the_key_and_both_types():
    with pytest.raises(TypeError, match="'x' holds a int64_list but the spec asks for float_list"):
        parse_single_example(make_example({"x": 1}), {"x": FixedLenFeature([], np.float32)})


def test_a_shape_that_does_not_fit_names_the_key():
    with pytest.raises(ValueError, match="'x' has 3 values but FixedLenFeature shape"):
        parse_single_example(make_example({"x": [1, 2, 3]}), {"x": FixedLenFeature([2], np.int64)})


def test_errors_in_a_batch_name_the_key_and_the_row():
    records = [make_example({"x": 1}), make_example({"y": 1})]
    with pytest.raises(ValueError, match=r"'x' is missing.*row 1"):
        parse_example(records, {"x": FixedLenFeature([], np.int64)})


def test_bad_specs_and_inputs_are_refused():
    with pytest.raises(TypeError, match="dtype"):
        FixedLenFeature([], np.int32)
    with pytest.raises(ValueError, match="VarLenFeature"):
        FixedLenFeature([None], np.int64)
    with pytest.raises(TypeError, match="FixedLenFeature"):
        parse_single_example(b"", {"x": np.int64})
    with pytest.raises(TypeError, match="serialized Example"):
        parse_single_example(3, {})
    with pytest.raises(ValueError, match=r"not a serialized tf\.train\.Example"):
        parse_single_example(b"\x0a\x09abc", {"x": VarLenFeature(np.int64)})
    with pytest.raises(TypeError, match="'x' must hold"):
        make_example({"x": [object()]})
    with pytest.raises(ValueError, match="default_value"):
        parse_single_example(b"", {"x": FixedLenFeature([3], np.int64, default_value=[1, 2])})


def test_an_empty_record_is_an_example_without_features():
    out = parse_single_example(b"", {"x": VarLenFeature(string)})
    assert out["x"].values.shape == (0,) and out["x"].dense_shape.tolist() == [0]


def test_unpacked_lists_and_unknown_fields_are_read():
    # Int64List with two unpacked varints (tag 0x08) and FloatList with one fixed32 (0x0d),
    # plus an unknown varint field 9 in the Feature: legal protobuf that writers may emit.
    ints = b"\x08\x05\x08\x7f"
    floats = b"\x0d" + np.float32(1.5).tobytes()
    feature_i = b"\x48\x01" + b"\x1a" + bytes([len(ints)]) + ints
    feature_f = b"\x12" + bytes([len(floats)]) + floats

    def entry(key: bytes, feature: bytes) -> bytes:
        body = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(feature)]) + feature
        return b"\x0a" + bytes([len(body)]) + body

    features = entry(b"i", feature_i) + entry(b"f", feature_f)
    record = b"\x0a" + bytes([len(features)]) + features
    out = parse_single_example(
        record, {"i": FixedLenFeature([2], np.int64), "f": FixedLenFeature([], np.float32)}
    )
    assert out["i"].tolist() == [5, 127] and out["f"] == np.float32(1.5)


INT64 = st.integers(-(2**63), 2**63 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False)
FEATURE = st.one_of(
    st.lists(INT64, max_size=300).map(lambda v: ("int", v)),
    st.lists(FLOAT32, max_size=50).map(lambda v: ("float", v)),
    st.lists(st.binary(max_size=40), max_size=5).map(lambda v: ("bytes", v)),
)


@settings(max_examples=50, deadline=None)
@given(values=st.dictionaries(st.text(max_size=8), FEATURE, max_size=5))
def test_any_example_round_trips(values):
    dtypes = {"int": np.int64, "float": np.float32, "bytes": string}
    arrays = {
        k: np.array(v, np.int64) if kind == "int" else np.array(v, np.float32)
        for k, (kind, v) in values.items()
        if kind != "bytes"
    }
    record = make_example(
        {k: (list(v) if kind == "bytes" else arrays[k]) for k, (kind, v) in values.items()}
    )
    spec = {k: VarLenFeature(dtypes[kind]) for k, (kind, _) in values.items()}
    parsed = parse_single_example(record, spec)
    for key, (kind, v) in values.items():
        got = parsed[key].values
        if kind == "bytes":
            assert got.tolist() == v
        else:
            assert got.dtype == arrays[key].dtype and got.tobytes() == arrays[key].tobytes()
        fixed = parse_single_example(record, {key: FixedLenFeature([len(v)], dtypes[kind])})
        assert np.asarray(fixed[key]).tolist() == got.tolist()


@settings(max_examples=150, deadline=None)
@given(
    damage=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=4),
    cut=st.floats(0, 1),
)
def test_a_damaged_example_is_a_clear_error_or_parses(damage, cut):
    record = bytearray(make_example(VALUES))
    for where, value in damage:
        record[int(where * len(record))] = value
    record = bytes(record[: int(cut * len(record)) or None])
    try:
        parse_single_example(record, spec())
    except (ValueError, TypeError) as e:
        assert str(e)  # a message, never an IndexError or a crash inside the decoder


def test_a_ten_byte_varint_keeps_its_low_64_bits_as_protobuf_does():
    ints = b"\x0a\x0a" + b"\xff" * 9 + b"\x7f"  # 70 bits set; int64 keeps 64: -1
    feature = b"\x1a" + bytes([len(ints)]) + ints
    body = b"\x0a\x01x\x12" + bytes([len(feature)]) + feature
    record = b"\x0a" + bytes([len(body) + 2]) + b"\x0a" + bytes([len(body)]) + body
    out = parse_single_example(record, {"x": FixedLenFeature([], np.int64)})
    assert out["x"] == -1
