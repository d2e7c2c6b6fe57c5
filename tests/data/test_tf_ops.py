"""tf.data's remaining ops on phalanx.data.Dataset: values, and exact mid-epoch restore."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from restore_checks import assert_restores_exactly

import phalanx
from phalanx.data import Dataset

X = np.arange(10, dtype=np.int32)


def _gen(n, start=0):
    for i in range(start, n):
        yield {"v": np.arange(i % 3 + 1, dtype=np.float32) + i, "i": np.int32(i)}


def _plain_gen(n):
    for i in range(n):
        yield np.int32(i)


PIPELINES = {
    "skip": lambda: Dataset.from_tensor_slices(X).shuffle(10, seed=1).skip(3).batch(2),
    "enumerate": lambda: Dataset.from_tensor_slices(X).enumerate(start=5).batch(3),
    "zip": lambda: Dataset.zip(
        Dataset.from_tensor_slices(X).shuffle(10, seed=2), Dataset.from_tensor_slices(X * 10)
    ).batch(4),
    "concatenate": lambda: (
        Dataset.from_tensor_slices(X[:4])
        .concatenate(Dataset.from_tensor_slices(X[4:] * 100))
        .shuffle(10, seed=3)
        .batch(3)
    ),
    "filter": lambda: (
        Dataset.from_tensor_slices(X).shuffle(10, seed=4).filter(lambda x: x % 3 != 0).batch(2)
    ),
    "from_generator": lambda: Dataset.from_generator(_gen, args=(7,)).padded_batch(3),
    "from_generator_replay": lambda: Dataset.from_generator(_plain_gen, args=(9,)).batch(2),
    "flat_map": lambda: Dataset.from_tensor_slices(X[:4]).flat_map(
        lambda x: Dataset.from_tensor_slices(np.full(int(x) + 1, x))
    ),
    "interleave": lambda: Dataset.from_tensor_slices(X[:5]).interleave(
        lambda x: Dataset.from_tensor_slices(np.full(int(x) + 1, x)), cycle_length=2, block_length=2
    ),
    "unbatch": lambda: Dataset.from_tensor_slices(X).shuffle(10, seed=5).batch(4).unbatch(),
    "padded_batch": lambda: (
        Dataset.from_tensor_slices(X[:7])
        .map(lambda x: x)
        .flat_map(lambda x: Dataset.from_tensors(np.arange(int(x) % 4, dtype=np.int32)))
        .padded_batch(3, padding_values=-1)
    ),
    "stream_then_index_ops": lambda: (
        Dataset.from_tensor_slices(X)
        .filter(lambda x: x != 4)
        .map(lambda x: x * 2)
        .skip(1)
        .take(6)
        .enumerate()
        .repeat(2)
    ),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_each_op_restores_exactly_mid_epoch(name):
    assert_restores_exactly(PIPELINES[name], first=1)


def test_values_match_tf_data():
    assert [int(b) for b in Dataset.from_tensor_slices(X).skip(7)] == [7, 8, 9]
    assert [(int(i), int(v)) for i, v in Dataset.from_tensor_slices(X[:3]).enumerate(2)] == [
        (2, 0),
        (3, 1),
        (4, 2),
    ]
    zipped = Dataset.zip((Dataset.from_tensor_slices(X[:3]), Dataset.from_tensor_slices(X)))
    assert [(int(a), int(b)) for a, b in zipped] == [(0, 0), (1, 1), (2, 2)]
    joined = Dataset.from_tensor_slices(X[:2]).concatenate(Dataset.from_tensor_slices(X[5:7]))
    assert [int(v) for v in joined] == [0, 1, 5, 6]
    assert [int(v) for v in Dataset.from_tensor_slices(X).filter(lambda x: x > 6)] == [7, 8, 9]
    assert [int(v) for v in PIPELINES["flat_map"]()] == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    # tf.data's interleave order for cycle_length=2, block_length=2 on these inputs.
    assert [int(v) for v in PIPELINES["interleave"]()] == [
        0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4, 4,
    ]  # fmt: skip
    assert [int(v) for v in Dataset.from_tensor_slices(X[:5]).batch(2).unbatch()] == [0, 1, 2, 3, 4]
    first = next(iter(PIPELINES["padded_batch"]()))
    np.testing.assert_array_equal(first, [[-1, -1], [0, -1], [0, 1]])
    shaped = Dataset.from_generator(_gen, args=(3,)).padded_batch(
        3, padded_shapes={"v": [4], "i": []}
    )
    batch = next(iter(shaped))
    np.testing.assert_array_equal(batch["v"], [[0, 0, 0, 0], [1, 2, 0, 0], [2, 3, 4, 0]])
    np.testing.assert_array_equal(batch["i"], [0, 1, 2])


def test_cardinality_and_row_indices():
    ds = Dataset.from_tensor_slices(X)
    assert ds.skip(3).cardinality == 7 and ds.enumerate().cardinality == 10
    assert Dataset.zip(ds, ds.take(4)).cardinality == 4
    assert ds.concatenate(ds).cardinality == 20
    assert ds.filter(lambda x: x > 2).cardinality == -2  # tf.data.UNKNOWN_CARDINALITY
    with pytest.raises(TypeError, match="length is unknown"):
        len(ds.filter(lambda x: x > 2))
    view, arrays = ds.shuffle(10, seed=0).skip(2).batch(4).row_indices()
    rows = next(iter(view))
    np.testing.assert_array_equal(arrays[rows], next(iter(ds.shuffle(10, seed=0).skip(2).batch(4))))
    for other in (
        ds.enumerate(),
        ds.zip(ds),
        ds.concatenate(ds),
        ds.filter(bool),
        ds.batch(2).unbatch(),
    ):
        assert other.batch(2).row_indices() is None


def test_generator_with_start_is_called_at_the_restored_position():
    calls = []

    def counted(n, start=0):
        calls.append(start)
        yield from range(start, n)

    it = iter(Dataset.from_generator(counted, args=(6,)))
    for _ in range(4):
        next(it)
    state = it.get_state()
    restored = iter(Dataset.from_generator(counted, args=(6,)))
    restored.set_state(state)
    assert [int(v) for v in restored] == [4, 5]
    assert calls[-1] == 4


def test_streaming_errors_are_clear():
    ds = Dataset.from_tensor_slices(X).filter(lambda x: x > 2)
    with pytest.raises(
        ValueError, match=r"shuffle\(\) needs random access.*call shuffle\(\) before"
    ):
        ds.shuffle(10)
    with pytest.raises(ValueError, match="scalar bool"):
        list(Dataset.from_tensor_slices(np.zeros((3, 2))).filter(lambda x: x > 0))
    with pytest.raises(ValueError, match="padded_batch"):
        list(Dataset.from_generator(_gen, args=(7,)).batch(3))
    with pytest.raises(TypeError, match=r"must return a phalanx\.data\.Dataset"):
        list(Dataset.from_tensor_slices(X).flat_map(lambda x: [x]))
    with pytest.raises(TypeError, match="not a generator object"):
        Dataset.from_generator(_plain_gen(3))
    with pytest.raises(ValueError, match=r"unbatch\(\) splits every leaf.*shapes \[\(\)\]"):
        list(Dataset.from_tensor_slices(X).unbatch())


def test_stream_batches_split_over_processes():
    ds = Dataset.from_tensor_slices(X).filter(lambda x: x < 8).batch(4)
    assert ds.batch_size == 4
    parts = [next(iter(ds.process_split(i, 2))) for i in range(2)]
    np.testing.assert_array_equal(np.concatenate(parts), [0, 1, 2, 3])


def test_fit_and_evaluate_read_a_streaming_dataset_to_its_end():
    x = np.linspace(-1, 1, 40, dtype=np.float32)[:, None]
    y = 2 * x
    kept = x[:, 0] > -0.5
    ds = Dataset.from_tensor_slices((x, y)).filter(lambda a, b: a[0] > -0.5).batch(8)
    with phalanx.Strategy().scope():
        model = phalanx.Model(nnx.Linear(1, 1, rngs=nnx.Rngs(0)))
        model.compile(optimizer="sgd", loss="mse")
    history = model.fit(ds, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    # Every kept row counted once, the last partial batch included: the same loss as arrays.
    expected = model.evaluate(x[kept], y[kept], batch_size=8, verbose=0)
    assert model.evaluate(ds, verbose=0) == pytest.approx(expected, rel=1e-6)
