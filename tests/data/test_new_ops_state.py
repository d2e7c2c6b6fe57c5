"""Every op issue 46 added keeps phalanx's guarantees: an iterator restored from the JSON of
`get_state()` at any element yields exactly the rest, an epoch is the same every time, and
`cardinality` is the element count wherever it is known."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from restore_checks import assert_restores_exactly

from phalanx.data import Dataset, DroppedElementsWarning, experimental

X = np.arange(12, dtype=np.int64)


def _fails_on_3(x):
    if x % 5 == 3:
        raise ValueError(f"bad element {x}")
    return x * 10


PIPELINES = {
    "window": lambda: (
        Dataset.from_tensor_slices(X)
        .shuffle(12, seed=1)
        .window(3, 2, 2)
        .flat_map(lambda w: w.batch(3))
    ),
    "window_tuples": lambda: (
        Dataset.from_tensor_slices(X)
        .enumerate()
        .window(4, 3, drop_remainder=True)
        .flat_map(lambda i, v: Dataset.zip(i, v).batch(4))
    ),
    "scan": lambda: Dataset.from_tensor_slices(X).scan(
        (np.float32(0.5), np.int64(0)), lambda s, x: ((s[0] * 1.5, s[1] + x), s[0] + x)
    ),
    "take_while": lambda: Dataset.from_tensor_slices(X).take_while(lambda x: x < 8).batch(3),
    "unique": lambda: Dataset.from_tensor_slices(X % 5).filter(lambda x: x != 2).unique(),
    "rebatch": lambda: Dataset.from_tensor_slices(X).batch(5).rebatch([2, 3]),
    "group_by_window": lambda: Dataset.from_tensor_slices(X).group_by_window(
        lambda x: x % 3, lambda key, w: w.batch(2).map(lambda b: b + 100 * key), window_size=3
    ),
    "bucket_by_sequence_length": lambda: (
        Dataset.from_tensor_slices(X)
        .map(lambda x: np.full(x % 5 + 1, x))
        .bucket_by_sequence_length(len, [2, 4], [2, 3, 2], padding_values=-1)
    ),
    "choose_from_datasets": lambda: Dataset.choose_from_datasets(
        [Dataset.from_tensor_slices(X), Dataset.range(100, 104)],
        Dataset.from_tensor_slices(np.array([0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1])),
        stop_on_empty_dataset=False,
    ),
    "sample_from_datasets": lambda: Dataset.sample_from_datasets(
        [Dataset.from_tensor_slices(X), Dataset.range(100, 106).filter(lambda x: x % 2 == 0)],
        weights=[0.3, 0.7],
        seed=4,
    ),
    "random": lambda: Dataset.random(seed=3, rerandomize_each_iteration=True).take(9),
    "counter": lambda: Dataset.zip(Dataset.counter(5, 3), Dataset.from_tensor_slices(X)),
    "ignore_errors": lambda: Dataset.from_tensor_slices(X).map(_fails_on_3).ignore_errors(),
    "ignore_errors_threads": lambda: (
        Dataset.from_tensor_slices(X)
        .map(_fails_on_3, num_parallel_calls=2)
        .ignore_errors()
        .batch(2)
    ),
    "assert_cardinality": lambda: (
        Dataset.from_tensor_slices(X)
        .filter(lambda x: x % 2 == 0)
        .apply(experimental.assert_cardinality(6))
    ),
    "cache_after_filter": lambda: (
        Dataset.from_tensor_slices(X).filter(lambda x: x % 3 != 0).cache().repeat(2)
    ),
    "cache_after_interleave": lambda: (
        Dataset.from_tensor_slices(X[:5])
        .interleave(lambda x: Dataset.range(x), cycle_length=2)
        .cache()
        .batch(3)
    ),
    "ragged_map_padded": lambda: (
        Dataset.from_tensor_slices(X)
        .map(lambda x: np.full([x % 4 + 1], x))
        .padded_batch(3, padded_shapes=[None], padding_values=-1)
    ),
}


@pytest.fixture(autouse=True)
def _drops_are_expected():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DroppedElementsWarning)
        yield


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_each_new_op_restores_exactly_mid_epoch(name):
    assert_restores_exactly(PIPELINES[name], first=0)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_known_cardinality_is_the_element_count(name):
    dataset = PIPELINES[name]()
    count = len(list(dataset))
    if dataset.cardinality != -2:
        assert dataset.cardinality == count
        assert len(dataset) == count


def test_cardinality_is_known_where_tf_data_knows_it():
    ds = Dataset.range(10)
    assert ds.window(3, 2).cardinality == 5
    assert ds.window(3, 2, 2, drop_remainder=True).cardinality == 3
    assert ds.window(4, 1, 3, drop_remainder=True).cardinality == 1
    assert ds.repeat().window(2).cardinality == math.inf
    assert ds.scan(np.int64(0), lambda s, x: (s, x)).cardinality == 10
    assert ds.batch(3, drop_remainder=True).unbatch().cardinality == 9
    assert ds.batch(3).unbatch().cardinality == -2  # the last batch's rows are not known
    assert Dataset.counter().take(5).cardinality == 5
    assert Dataset.random(seed=0).cardinality == math.inf
    for unknown in (
        ds.take_while(lambda x: x < 3),
        ds.unique(),
        ds.batch(4).rebatch(3),
        ds.map(_fails_on_3).ignore_errors(),
        Dataset.sample_from_datasets([ds, ds], seed=0),
        ds.group_by_window(lambda x: x % 2, lambda k, w: w, window_size=2),
    ):
        assert unknown.cardinality == -2
    mixed = Dataset.sample_from_datasets([ds.repeat(), ds.repeat()], seed=0)
    assert mixed.cardinality == math.inf
    # A streaming op keeps a count its input states.
    stated = ds.filter(lambda x: x > 3).apply(experimental.assert_cardinality(6))
    assert stated.map(lambda x: x, num_parallel_calls=2).batch(4).cardinality == 2
    assert len(stated.enumerate()) == 6
