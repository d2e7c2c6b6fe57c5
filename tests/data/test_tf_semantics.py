"""tf.data's semantics where phalanx's used to differ (issue 46): empty batch streams, cache
after any op, no batched/unbatched state deciding what an op accepts, zip's end, and
padded_batch of ragged map outputs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx.data import Dataset


def _values(dataset):
    return [np.asarray(e).tolist() for e in dataset]


def test_batch_with_drop_remainder_over_fewer_elements_yields_nothing():
    short = Dataset.range(5).batch(8, drop_remainder=True)
    assert short.cardinality == 0 and _values(short) == []
    assert _values(Dataset.range(5).filter(lambda x: x > 1).batch(8, drop_remainder=True)) == []
    assert _values(Dataset.range(0).repeat()) == [] and Dataset.range(0).repeat().cardinality == 0
    assert _values(Dataset.from_tensor_slices(np.zeros((0, 3))).batch(2)) == []


def _model():
    with phalanx.Strategy().scope():
        model = phalanx.Model(nnx.Linear(1, 1, rngs=nnx.Rngs(0)))
        model.compile(optimizer="sgd", loss="mse")
    return model


def test_fit_and_evaluate_keep_a_clear_error_for_data_without_batches():
    x = np.linspace(-1, 1, 5, dtype=np.float32)[:, None]
    model = _model()
    known = Dataset.from_tensor_slices((x, 2 * x)).batch(8, drop_remainder=True)
    for call in (model.fit, model.evaluate, model.predict):
        with pytest.raises(ValueError, match=r"yields no batches.*batch\(8, drop_remainder=True\)"):
            call(known, verbose=0)
    # Known only by reading: evaluate refuses to report metrics of nothing.
    streamed = Dataset.from_tensor_slices((x, 2 * x)).filter(lambda a, b: a[0] > 5).batch(2)
    with pytest.raises(ValueError, match="evaluate got no batch"):
        model.evaluate(streamed, verbose=0)
    with pytest.raises(ValueError, match="validation got no batch"):
        model.fit(Dataset.from_tensor_slices((x, x)).batch(2), validation_data=streamed, verbose=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Dataset.range(10).filter(lambda x: x % 3 != 0),
        lambda: Dataset.range(4).flat_map(lambda x: Dataset.range(x)),
        lambda: Dataset.range(5).interleave(lambda x: Dataset.range(x), cycle_length=2),
        lambda: Dataset.range(10).batch(3).unbatch(),
    ],
    ids=["filter", "flat_map", "interleave", "unbatch"],
)
def test_cache_after_a_streaming_op_fills_on_the_first_full_pass(make):
    calls = []

    def counted(x):
        calls.append(int(x))
        return x * 2

    cached = make().map(counted, num_parallel_calls=None).cache()
    first = _values(cached)
    n = len(calls)
    assert first == [v * 2 for v in _values(make())]
    assert _values(cached) == first and _values(cached.repeat(2)) == first * 2
    assert len(calls) == n  # later passes read the cache
    # A pass cut short does not fill it: the next complete pass does.
    partial = make().map(counted).cache()
    it = iter(partial)
    next(it)
    before = len(calls)
    assert _values(partial) == first and len(calls) == before + len(first)
    assert _values(partial) == first and len(calls) == before + len(first)


def test_cache_to_a_file_is_written_once_complete_and_read_by_a_later_pipeline(tmp_path):
    path = str(tmp_path / "sub" / "decoded")
    calls = []

    def decode(x):
        calls.append(int(x))
        return np.full(int(x) % 3 + 1, x)  # ragged elements, kept as they are

    def make(source):
        return source.map(decode).cache(path)

    it = iter(make(Dataset.range(6).filter(lambda x: x != 4)))
    next(it)
    assert not os.path.exists(path + ".phalanx-cache")  # a partial pass never publishes
    first = _values(make(Dataset.range(6).filter(lambda x: x != 4)))
    assert os.path.exists(path + ".phalanx-cache")
    assert [f for f in os.listdir(tmp_path / "sub")] == ["decoded.phalanx-cache"]
    calls.clear()
    again = make(Dataset.range(6).filter(lambda x: x != 4))
    assert _values(again) == first and calls == []
    # A state saved while reading the file restores in a pipeline whose cache is empty.
    it = iter(again)
    next(it), next(it)
    state = json.loads(json.dumps(it.get_state()))
    os.remove(path + ".phalanx-cache")
    fresh = iter(make(Dataset.range(6).filter(lambda x: x != 4)))
    fresh.set_state(state)
    assert [np.asarray(e).tolist() for e in fresh] == first[2:]
    # Random access: filled by position, written once every element is held.
    indexed = str(tmp_path / "indexed")
    ds = Dataset.range(5).map(lambda x: x * 3).cache(indexed)
    assert sorted(_values(ds.shuffle(5, seed=0))) == [0, 3, 6, 9, 12]
    assert os.path.exists(indexed + ".phalanx-cache")
    assert _values(Dataset.range(5).map(lambda x: -x).cache(indexed)) == [0, 3, 6, 9, 12]
    with pytest.raises(ValueError, match="holds 5 elements but this dataset has 4"):
        list(Dataset.range(4).cache(indexed))


def test_a_cache_does_not_keep_a_pass_missing_an_element():
    calls = []

    def flaky(x):
        calls.append(int(x))
        if x == 2 and calls.count(2) == 1:
            raise ValueError("transient")
        return x

    cached = Dataset.range(4).filter(lambda x: True).map(flaky).cache()
    it = iter(cached)
    got = [next(it), next(it)]
    with pytest.raises(ValueError, match="transient"):
        next(it)
    got += list(it)
    assert [int(v) for v in got] == [0, 1, 3]
    assert _values(cached) == [0, 1, 2, 3]  # recomputed, then kept
    assert _values(cached) == [0, 1, 2, 3] and calls.count(2) == 2


def test_no_batched_state_decides_what_an_op_accepts():
    sums = Dataset.range(5).batch(2).map(np.sum)  # scalars again
    assert _values(sums.concatenate(Dataset.range(3))) == [1, 5, 4, 0, 1, 2]
    assert _values(Dataset.range(3).concatenate(sums)) == [0, 1, 2, 1, 5, 4]
    pairs = Dataset.zip(Dataset.range(3), Dataset.range(6).batch(2))
    assert [(int(a), b.tolist()) for a, b in pairs] == [(0, [0, 1]), (1, [2, 3]), (2, [4, 5])]
    assert _values(Dataset.from_tensor_slices(np.arange(6).reshape(3, 2)).unbatch()) == [
        0, 1, 2, 3, 4, 5,
    ]  # fmt: skip
    padded = Dataset.range(4).batch(2).map(lambda b: b[: int(b[0]) % 3 + 1]).padded_batch(2)
    assert [b.tolist() for b in padded] == [[[0, 0], [2, 3]]]
    # After batch(...).unbatch() the elements are rows: fit needs batch() again.
    assert Dataset.range(4).batch(2).unbatch().batch_size is None
    # A zip of batches is batched: each process reads its rows of every input's batch.
    batches = Dataset.range(10).batch(4)
    zipped = Dataset.zip(batches, batches.map(lambda b: b * 10))
    assert zipped.batch_size == 4
    assert [(a.tolist(), b.tolist()) for a, b in zipped.process_split(1, 2)] == [
        ([2, 3], [20, 30]),
        ([6, 7], [60, 70]),
        ([9], [90]),
    ]


def test_zip_of_an_interleave_ends_without_a_runtime_error():
    interleaved = (
        Dataset.range(7)
        .concatenate(Dataset.range(4))
        .interleave(lambda x: Dataset.range(x % 4), cycle_length=3, block_length=3)
    )
    zipped = Dataset.zip(interleaved, Dataset.range(100))
    # tf.data 2.21's elements for the same pipeline.
    assert [int(a) for a, _ in zipped] == [0, 0, 1, 0, 1, 2, 0, 0, 1, 0, 0, 1, 0, 1, 2]
    assert [int(b) for _, b in zipped] == list(range(15))


def test_padded_batch_pads_ragged_map_outputs():
    ragged = Dataset.range(7).map(lambda x: np.full([x % 4 + 1], x))
    batches = ragged.padded_batch(3, padded_shapes=[None], padding_values=-1)
    assert [b.tolist() for b in batches] == [
        [[0, -1, -1], [1, 1, -1], [2, 2, 2]],
        [[3, 3, 3, 3], [4, -1, -1, -1], [5, 5, -1, -1]],
        [[6, 6, 6]],
    ]
    # Ragged elements go through every index op; batch() says to pad them.
    shuffled = _values(ragged.cache().shuffle(7, seed=0).repeat(2).skip(1))
    assert len(shuffled) == 13 and sorted(shuffled[6:]) == sorted(_values(ragged))
    with pytest.raises(ValueError, match=r"different shapes \[\(1,\), \(2,\)\].*padded_batch"):
        list(ragged.batch(2))
    # Elements whose shapes happen to agree within a batch batch, as in tf.data.
    assert [b.shape for b in Dataset.range(8).map(lambda x: np.zeros(x // 4)).batch(4)] == [
        (4, 0),
        (4, 1),
    ]
