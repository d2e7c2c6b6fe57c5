"""TF's checkpoint files read without TensorFlow: every dtype bitwise as TF's own reader
returns it, the `checkpoint` state file, and a damaged file named in the error."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import phalanx
from phalanx._src.train.checkpoint.record import CheckpointError

tf = pytest.importorskip("tensorflow", reason="TensorFlow (the `tensorflow` extra) writes them")


def _write(folder, seed=0):
    rng = np.random.default_rng(seed)
    values = {
        "f32": rng.normal(size=(3, 4)).astype(np.float32),
        "f64": rng.normal(size=(5,)),
        "i64": rng.integers(-(2**62), 2**62, size=(2, 3)),
        "i32": np.int32(-7),
        "f16": rng.normal(size=(4, 2)).astype(np.float16),
        "u8": np.arange(10, dtype=np.uint8),
        "flags": np.array([True, False]),
        "large": rng.normal(size=(300, 70)).astype(np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "text": np.array([b"hello", b"", b"x" * 300]),
    }
    variables = {k: tf.Variable(v) for k, v in values.items()}
    variables["bf16"] = tf.Variable(tf.constant(rng.normal(size=(4,)), tf.bfloat16))
    checkpoint = tf.train.Checkpoint(**variables)
    manager = tf.train.CheckpointManager(checkpoint, str(folder), max_to_keep=3)
    manager.save()
    return manager.save()  # ckpt-2: the newest


def test_every_tensor_reads_bitwise_as_tfs_reader(tmp_path):
    prefix = _write(tmp_path)
    mine, theirs = phalanx.train.load_checkpoint(tmp_path), tf.train.load_checkpoint(prefix)
    assert mine.prefix == prefix  # the folder's state file names ckpt-2
    assert phalanx.train.list_variables(prefix) == [
        (name, list(shape)) for name, shape in tf.train.list_variables(prefix)
    ]
    assert mine.get_variable_to_shape_map() == theirs.get_variable_to_shape_map()
    for name in theirs.get_variable_to_shape_map():
        got, want = mine.get_tensor(name), np.asarray(theirs.get_tensor(name))
        assert got.shape == want.shape, name
        if got.dtype == object:  # strings: the object graph, the text variable
            assert list(got.ravel()) == list(want.ravel()), name
        else:
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    assert mine.get_variable_to_dtype_map()["bf16/.ATTRIBUTES/VARIABLE_VALUE"].name == "bfloat16"
    assert phalanx.latest_checkpoint(tmp_path) == tf.train.latest_checkpoint(tmp_path) == prefix


def test_a_damaged_checkpoint_names_its_file(tmp_path):
    prefix = _write(tmp_path / "good")
    key = "large/.ATTRIBUTES/VARIABLE_VALUE"
    reader = phalanx.train.load_checkpoint(prefix)
    entry = reader.entry(key)
    for name, offset, match in [
        (".index", 40, r"\.index is damaged: the checksum of the block"),
        (".index", -2, r"\.index is not a TF checkpoint index"),
        (".data-00000-of-00001", entry["offset"] + 100, r"data-00000-of-00001 is damaged.*large"),
    ]:
        folder = tmp_path / f"bad{name}{offset}"
        shutil.copytree(tmp_path / "good", folder)
        path = folder / (os.path.basename(prefix) + name)
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x10
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=match):
            phalanx.train.load_checkpoint(folder).get_tensor(key)
    os.remove(prefix + ".data-00000-of-00001")
    with pytest.raises(CheckpointError, match=r"data file .* is missing.*copy every"):
        phalanx.train.load_checkpoint(prefix).get_tensor(key)
    with pytest.raises(FileNotFoundError, match=r"ckpt-9\.index does not exist"):
        phalanx.train.load_checkpoint(str(tmp_path / "good" / "ckpt-9"))
    with pytest.raises(ValueError, match=r"no TF checkpoint found in the folder"):
        phalanx.train.load_checkpoint(tmp_path)
    with pytest.raises(KeyError, match=r"'nope' is not in the checkpoint"):
        reader.get_tensor("nope")


def test_a_tf1_checkpoint_reads_by_name(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        kernel = np.arange(6, dtype=np.float32).reshape(2, 3)
        tf.compat.v1.get_variable("dense/kernel", initializer=kernel)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = saver.save(session, str(tmp_path / "model"), global_step=5)
    assert phalanx.train.list_variables(tmp_path) == [("dense/kernel", [2, 3])]
    assert np.array_equal(phalanx.train.load_checkpoint(prefix).get_tensor("dense/kernel"), kernel)
    with pytest.raises(CheckpointError, match=r"no object graph.*init_from_checkpoint"):
        phalanx.Checkpoint(step=0).restore(prefix)
