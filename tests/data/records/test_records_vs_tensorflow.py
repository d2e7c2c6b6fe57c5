"""Side by side with TensorFlow: its files read by phalanx, phalanx's files read by it, and
parse_single_example / parse_example equal to tf.io's on records TensorFlow wrote."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from record_files_helpers import write_shards

from phalanx.data import (
    FixedLenFeature,
    TFRecordDataset,
    VarLenFeature,
    make_example,
    parse_example,
    parse_single_example,
    string,
)

tf = pytest.importorskip(
    "tensorflow", reason="TensorFlow (the `tensorflow` test extra) compares with tf.data"
)


def tf_example(**values) -> bytes:
    feature = {}
    for key, (kind, v) in values.items():
        if kind == "bytes":
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=v))
        elif kind == "float":
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=v))
        else:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=v))
    proto = tf.train.Example(features=tf.train.Features(feature=feature))
    return proto.SerializeToString()


RECORDS = [
    tf_example(
        img=("bytes", [b"\xff\xd8\x00jpeg", b""]),
        label=("int", [3]),
        box=("float", [0.1, 0.2, 0.3, 0.4]),
        ids=("int", [-5, 2**62, -(2**63)]),
        words=("bytes", [b"x"]),
        score=("float", [1e-30]),
    ),
    tf_example(
        img=("bytes", [b"a", b"bb"]),
        label=("int", [-9]),
        box=("float", [np.inf, -0.0, 3.4e38, -1.5]),
        ids=("int", []),
        words=("bytes", []),
        score=("float", [2.5, 3.5]),
    ),
]
OURS = {
    "img": FixedLenFeature([2], string),
    "label": FixedLenFeature([], np.int64),
    "box": FixedLenFeature([2, 2], np.float32),
    "ids": VarLenFeature(np.int64),
    "words": VarLenFeature(string),
    "score": VarLenFeature(np.float32),
    "absent": FixedLenFeature([3], np.float32, default_value=[7.0, 8.0, 9.0]),
}
THEIRS = {
    "img": tf.io.FixedLenFeature([2], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "box": tf.io.FixedLenFeature([2, 2], tf.float32),
    "ids": tf.io.VarLenFeature(tf.int64),
    "words": tf.io.VarLenFeature(tf.string),
    "score": tf.io.VarLenFeature(tf.float32),
    "absent": tf.io.FixedLenFeature([3], tf.float32, default_value=[7.0, 8.0, 9.0]),
}


def same(ours, theirs) -> None:
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, tf.SparseTensor):
            for part in ("indices", "values", "dense_shape"):
                a, b = getattr(ours[key], part), getattr(value, part).numpy()
                assert a.dtype == b.dtype and a.shape == b.shape, (key, part)
                equal = (
                    a.tolist() == b.tolist() if a.dtype == object else a.tobytes() == b.tobytes()
                )
                assert equal, (key, part)  # bitwise: NaNs and -0.0 too
        else:
            a, b = np.asarray(ours[key]), value.numpy()
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert a.tobytes() == b.tobytes() if a.dtype != object else a.tolist() == b.tolist()


@pytest.mark.parametrize("record", range(len(RECORDS)))
def test_parse_single_example_equals_tf(record):
    same(
        parse_single_example(RECORDS[record], OURS),
        tf.io.parse_single_example(RECORDS[record], THEIRS),
    )


def test_parse_example_equals_tf():
    same(parse_example(RECORDS, OURS), tf.io.parse_example(RECORDS, THEIRS))


def test_make_example_is_read_by_tf():
    record = make_example(
        {
            "img": [b"q", b"r"],
            "label": 4,
            "box": [1.0, 2.0, 3.0, 4.0],
            "ids": [1, -2],
            "words": ["w"],
            "score": [],
        }
    )
    same(parse_single_example(record, OURS), tf.io.parse_single_example(record, THEIRS))


@pytest.mark.parametrize("kind", ["", "GZIP", "ZLIB"])
def test_tf_reads_phalanx_files_and_phalanx_reads_tf_files(tmp_path, kind):
    paths, _ = write_shards(tmp_path, 3, [4, 9, 2], kind)
    for reads in (None, 2):
        theirs = [r.numpy() for r in tf.data.TFRecordDataset(paths, kind, num_parallel_reads=reads)]
        assert theirs == list(TFRecordDataset(paths, kind, num_parallel_reads=reads))
    path = str(tmp_path / f"written-by-tf{kind}")
    with tf.io.TFRecordWriter(path, kind) as writer:
        for r in RECORDS * 3:
            writer.write(r)
    assert list(TFRecordDataset(path, kind)) == RECORDS * 3


LISTS = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200).map(lambda v: ("int", v)),
    st.lists(st.floats(width=32), max_size=40).map(lambda v: ("float", v)),
    st.lists(st.binary(max_size=30), max_size=4).map(lambda v: ("bytes", v)),
)
KINDS = {
    "int": (np.int64, tf.int64),
    "float": (np.float32, tf.float32),
    "bytes": (string, tf.string),
}


@settings(max_examples=25, deadline=None)
@given(values=st.dictionaries(st.sampled_from("abcdef"), LISTS, min_size=1, max_size=4))
def test_any_example_tf_wrote_parses_as_tf_parses_it(values):
    ours = {k: VarLenFeature(KINDS[kind][0]) for k, (kind, _) in values.items()}
    theirs = {k: tf.io.VarLenFeature(KINDS[kind][1]) for k, (kind, _) in values.items()}
    for key, (kind, v) in values.items():
        ours[f"{key}_fixed"] = FixedLenFeature([len(v)], KINDS[kind][0])
        theirs[f"{key}_fixed"] = tf.io.FixedLenFeature([len(v)], KINDS[kind][1])
    # tf.io reads every feature by its key: the fixed ones are the same list again.
    fixed = {f"{k}_fixed": kv for k, kv in values.items()}
    record = tf_example(**values, **fixed)
    same(parse_single_example(record, ours), tf.io.parse_single_example(record, theirs))
