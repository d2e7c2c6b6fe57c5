"""Dataset.save / Dataset.load: the elements come back as saved, with random access, resume
after a kill, and a half-written save is never read."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import phalanx
from phalanx.data import DataLossError, Dataset, TensorSpec

Pair = collections.namedtuple("Pair", ["image", "label"])
REPO = Path(__file__).resolve().parents[2]


def same(a, b) -> None:
    """Equal element structures, leaf types, dtypes and values."""
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert type(x) is type(y), (x, y)
        if isinstance(x, np.ndarray | np.generic):
            assert x.dtype == y.dtype and np.shape(x) == np.shape(y)
            if x.dtype == object:
                assert all(
                    type(p) is type(q) for p, q in zip(np.ravel(x), np.ravel(y), strict=True)
                )
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


def roundtrip(ds: Dataset, path: Path, **kwargs) -> Dataset:
    ds.save(path, **kwargs)
    return Dataset.load(path)


def records(n: int = 13) -> Dataset:
    rng = np.random.default_rng(0)
    return Dataset.from_tensor_slices(
        {
            "image": rng.integers(0, 255, (n, 4, 3), dtype=np.uint8),
            "weight": rng.random(n).astype(np.float16),
            "word": [f"w{i}é" for i in range(n)],
            "raw": [bytes([i]) * i for i in range(n)],
            "flag": np.arange(n) % 2 == 0,
        }
    )


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_elements_come_back_as_saved(tmp_path, compression):
    ds = records()
    loaded = roundtrip(ds, tmp_path / "d", compression=compression)
    assert loaded.cardinality == 13
    for a, b in zip(ds, loaded, strict=True):
        same(a, b)
    assert loaded.element_spec == ds.element_spec


def test_structures_ragged_leaves_and_batches(tmp_path):
    pairs = Dataset.range(9).map(lambda i: Pair(np.full((i % 3, 2), i, np.int32), (i, None, [i])))
    loaded = roundtrip(pairs, tmp_path / "pairs")
    for a, b in zip(pairs, loaded, strict=True):
        same(a, b)
    assert isinstance(next(iter(loaded)), Pair)
    assert loaded.element_spec.image == TensorSpec((None, 2), np.int32)
    # A ragged leaf read several at a time is an object array of rows (as on the host).
    rows = next(iter(loaded.batch(3))).image
    assert rows.dtype == object and [r.shape for r in rows] == [(0, 2), (1, 2), (2, 2)]
    # Batches, the last one short, stay batches (bfloat16 included).
    x = np.arange(20, dtype=jax.numpy.bfloat16).reshape(10, 2)
    batches = Dataset.from_tensor_slices((x, np.arange(10))).batch(4)
    loaded = roundtrip(batches, tmp_path / "batches")
    assert [b[1].tolist() for b in loaded] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for a, b in zip(batches, loaded, strict=True):
        same(a, b)
    assert all(b[0].flags.writeable for b in loaded)


def test_streaming_pipelines_save_their_elements(tmp_path):
    ds = Dataset.range(30).filter(lambda x: x % 3 == 0).map(lambda x: (x, np.arange(x % 4)))
    loaded = roundtrip(ds, tmp_path / "s", shard_func=lambda x, _: x % 2)
    assert [a.tolist() for a, _ in loaded] == list(range(0, 30, 3))  # the saved order
    meta = json.loads((tmp_path / "s" / "dataset.json").read_text())
    assert len(meta["files"]) == 2 and sum(f["records"] for f in meta["files"]) == 10
    empty = roundtrip(Dataset.range(5).filter(lambda x: x > 9), tmp_path / "empty")
    assert list(empty) == [] and len(empty) == 0


def test_load_is_random_access_and_resumes_exactly(tmp_path):
    loaded = roundtrip(records(), tmp_path / "d").shuffle(13, seed=3).batch(4)
    full = [b["word"].tolist() for b in loaded]
    assert sorted(w for b in full for w in b) == sorted(f"w{i}é" for i in range(13))
    it = iter(loaded)
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [b["word"].tolist() for b in it]
    again = iter(loaded)
    again.set_state(state)
    assert [b["word"].tolist() for b in again] == rest
    # Each process reads its rows of every global batch (of the first epoch).
    fresh = Dataset.load(tmp_path / "d").shuffle(13, seed=3).batch(4)
    parts = [[b["word"].tolist() for b in fresh.process_split(i, 2)] for i in range(2)]
    for step, whole in enumerate(full):
        assert parts[0][step] + parts[1][step] == whole


def test_a_replaced_save_and_element_spec(tmp_path):
    path = tmp_path / "d"
    Dataset.range(3).save(path)
    Dataset.range(5).map(lambda x: x * 10).save(path)  # replaces the earlier one
    assert [int(x) for x in Dataset.load(path)] == [0, 10, 20, 30, 40]
    pairs = Dataset.range(4).map(lambda x: (x, x * 2.0))
    pairs.save(tmp_path / "p")
    spec = {"a": TensorSpec((), np.int64), "b": TensorSpec((), np.float64)}
    first = next(iter(Dataset.load(tmp_path / "p", element_spec=spec)))
    assert first == {"a": 0, "b": 0.0}
    with pytest.raises(ValueError, match="does not match the dataset saved"):
        Dataset.load(tmp_path / "p", element_spec=(TensorSpec((), np.float32),) * 2)
    with pytest.raises(ValueError, match="saved with compression None, not 'GZIP'"):
        Dataset.load(tmp_path / "p", compression="GZIP")


def test_bad_arguments_fail_before_anything_is_written(tmp_path):
    ds = Dataset.range(4)
    with pytest.raises(ValueError, match="compression must be None"):
        ds.save(tmp_path / "a", compression="SNAPPY")
    with pytest.raises(ValueError, match="checkpoint_interval"):
        ds.save(tmp_path / "a", checkpoint_args={"step_counter": 1})
    with pytest.raises(ValueError, match="infinite"):
        ds.repeat().save(tmp_path / "a")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a saved dataset"):
        ds.save(tmp_path / "mine")
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.partial").exists()
    with pytest.raises(ValueError, match="shard_func must return one int >= 0"):
        ds.save(tmp_path / "b", shard_func=lambda x: -1)
    with pytest.raises(
        ValueError, match=r"leaf .* is a float64 array .* earlier elements' are int64"
    ):
        ds.map(lambda x: x if x < 2 else np.float64(x)).save(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match="no saved dataset"):
        Dataset.load(tmp_path / "c")


def test_damage_is_an_error(tmp_path):
    path = tmp_path / "d"
    records().save(path)
    shard = path / "shard-00000.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataLossError, match="corrupted record"):
        list(Dataset.load(path))
    shard.write_bytes(bytes(data[:-10]))
    with pytest.raises(DataLossError, match="is damaged"):
        Dataset.load(path)


def test_the_shards_are_tfrecord_files(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="reads the shards with tf.data")
    records().save(tmp_path / "d")
    files = sorted(str(p) for p in (tmp_path / "d").glob("shard-*.tfrecord"))
    assert sum(1 for _ in tf.data.TFRecordDataset(files)) == 13
    assert sum(1 for _ in phalanx.data.TFRecordDataset(files)) == 13


_KILLED_SAVE = """
import os, sys
import numpy as np
from phalanx.data import Dataset

calls = []

def slow(x):
    if x == 37 and os.environ.get("KILL_AT_37"):
        os.kill(os.getpid(), 9)  # no cleanup, no exception handler: a kill
    calls.append(x)
    return {"x": np.full(3, x, np.int32), "y": np.float32(x) / 2}

Dataset.range(100).shuffle(100, seed=5).map(slow).save(
    sys.argv[1], checkpoint_args={"checkpoint_interval": 10}
)
print(len(calls))
"""


def test_a_killed_save_resumes_and_is_never_read_half_written(tmp_path):
    script = tmp_path / "save.py"
    script.write_text(textwrap.dedent(_KILLED_SAVE))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "JAX_PLATFORMS": "cpu"}
    path = tmp_path / "d"
    run = [sys.executable, str(script), str(path)]
    killed = subprocess.run(run, env={**env, "KILL_AT_37": "1"})
    assert killed.returncode == -9
    with pytest.raises(FileNotFoundError, match=r"unfinished save"):
        Dataset.load(path)
    done = subprocess.run(run, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    order = [int(x) for x in Dataset.range(100).shuffle(100, seed=5)]
    checkpointed = order.index(37) // 10 * 10  # the elements before the last checkpoint
    assert checkpointed > 0
    assert int(done.stdout.split()[-1]) == 100 - checkpointed  # only the rest is computed
    loaded = list(Dataset.load(path))
    assert [int(e["x"][0]) for e in loaded] == order
    assert [float(e["y"]) for e in loaded] == [x / 2 for x in order]
    assert not (tmp_path / "d.partial").exists()
