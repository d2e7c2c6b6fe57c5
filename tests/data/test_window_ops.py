"""window, group_by_window, bucket_by_sequence_length and rebatch: tf.data's values (checked
against tf.data 2.21 when these tests were written) and their errors."""

from __future__ import annotations

import numpy as np
import pytest

from phalanx.data import Dataset


def _lists(dataset):
    return [np.asarray(e).tolist() for e in dataset]


def test_window_yields_datasets_with_tf_datas_elements():
    windows = list(Dataset.range(7).window(3, shift=2, stride=2))
    assert [_lists(w) for w in windows] == [[0, 2, 4], [2, 4, 6], [4, 6], [6]]
    dropped = Dataset.range(7).window(3, 2, 2, drop_remainder=True)
    assert [_lists(w) for w in dropped] == [[0, 2, 4], [2, 4, 6]]
    # shift larger than the window: the elements between windows are passed over
    assert [_lists(w) for w in Dataset.range(7).window(2, 4)] == [[0, 1], [4, 5]]
    # A tuple element gives a tuple of datasets, one per component.
    index, value = next(iter(Dataset.range(10, 14).enumerate().window(2)))
    assert (_lists(index), _lists(value)) == ([0, 1], [10, 11])
    pairs = Dataset.range(4).window(2, 1, drop_remainder=True).flat_map(lambda w: w.batch(2))
    assert _lists(pairs) == [[0, 1], [1, 2], [2, 3]]


def test_window_of_ragged_elements_keeps_them():
    ragged = Dataset.range(4).map(lambda x: np.arange(x + 1))
    (window,) = list(ragged.window(4))
    assert _lists(window) == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]
    assert [b.tolist() for b in window.padded_batch(4)] == [
        [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 2, 0], [0, 1, 2, 3]]
    ]


def test_window_errors():
    with pytest.raises(ValueError, match="size must be a positive integer, got 0"):
        Dataset.range(3).window(0)
    with pytest.raises(ValueError, match="shift must be a positive integer"):
        Dataset.range(3).window(2, 0)
    with pytest.raises(TypeError, match=r"batch\(\) got datasets.*flat_map them first"):
        list(Dataset.range(4).window(2).batch(2))


def test_group_by_window_reduces_full_groups_then_the_rest_by_key():
    grouped = Dataset.range(10).group_by_window(
        lambda x: x % 3, lambda key, w: w.batch(4), window_size=4
    )
    assert _lists(grouped) == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    # The groups left at the end come in increasing key order (tf.data's), not arrival.
    late = Dataset.from_tensor_slices(np.array([5, 1, 2, 7, 3, 9, 4]))
    out = late.group_by_window(lambda x: x % 3, lambda key, w: w.batch(10), window_size=10)
    assert _lists(out) == [[3, 9], [1, 7, 4], [5, 2]]
    sized = Dataset.range(10).group_by_window(
        lambda x: x % 2, lambda key, w: w.batch(5), window_size_func=lambda key: key + 2
    )
    assert _lists(sized) == [[0, 2], [1, 3, 5], [4, 6], [8], [7, 9]]
    keyed = Dataset.range(6).group_by_window(
        lambda x: x % 2, lambda key, w: w.map(lambda v: v * 10 + key), window_size=3
    )
    assert _lists(keyed) == [0, 20, 40, 11, 31, 51]


def test_group_by_window_errors():
    ds = Dataset.range(6)
    with pytest.raises(ValueError, match="exactly one of window_size and window_size_func"):
        ds.group_by_window(lambda x: x, lambda k, w: w)
    with pytest.raises(ValueError, match=r"key_func must return a scalar integer, got 0\.5"):
        list(ds.group_by_window(lambda x: 0.5, lambda k, w: w, window_size=2))
    with pytest.raises(ValueError, match="window size for key 0 must be a positive integer"):
        list(ds.group_by_window(lambda x: 0, lambda k, w: w, window_size_func=lambda k: 0))
    with pytest.raises(TypeError, match=r"must return a phalanx\.data\.Dataset"):
        list(ds.group_by_window(lambda x: 0, lambda k, w: [1], window_size=2))


def _sequences():
    return Dataset.range(1, 6).map(lambda x: np.full([x % 4 + 1], x))  # lengths 2 3 4 1 2


def test_bucket_by_sequence_length_matches_tf_data():
    buckets = _sequences().bucket_by_sequence_length(len, [2, 4], [2, 2, 2])
    assert _lists(buckets) == [[[1, 1, 0], [2, 2, 2]], [[4]], [[5, 5]], [[3, 3, 3, 3]]]
    padded = _sequences().bucket_by_sequence_length(
        len, [3, 6], [2, 2, 2], pad_to_bucket_boundary=True, padding_values=-1
    )
    assert _lists(padded) == [
        [[2, 2, 2, -1, -1], [3, 3, 3, 3, -1]],
        [[1, 1], [4, -1]],
        [[5, 5]],
    ]
    same = Dataset.range(6).map(lambda x: np.full(2, x))
    assert _lists(same.bucket_by_sequence_length(len, [3], [4, 4], no_padding=True)) == [
        [[0, 0], [1, 1], [2, 2], [3, 3]],
        [[4, 4], [5, 5]],
    ]
    assert _lists(
        same.bucket_by_sequence_length(len, [3], [4, 4], no_padding=True, drop_remainder=True)
    ) == [[[0, 0], [1, 1], [2, 2], [3, 3]]]


def test_bucket_by_sequence_length_errors():
    with pytest.raises(ValueError, match=r"len\(bucket_boundaries\) \+ 1 = 3 sizes, got 2"):
        _sequences().bucket_by_sequence_length(len, [2, 4], [2, 2])
    with pytest.raises(ValueError, match="bucket_boundaries must increase"):
        _sequences().bucket_by_sequence_length(len, [4, 2], [2, 2, 2])
    with pytest.raises(ValueError, match=r"shorter than max\(bucket_boundaries\) = 3"):
        list(_sequences().bucket_by_sequence_length(len, [3], [2, 2], pad_to_bucket_boundary=True))


def test_rebatch_matches_tf_data():
    assert _lists(Dataset.range(10).batch(4).rebatch([2, 3])) == [
        [0, 1], [2, 3, 4], [5, 6], [7, 8, 9],
    ]  # fmt: skip
    assert _lists(Dataset.range(10).batch(4).rebatch(3, drop_remainder=True)) == [
        [0, 1, 2], [3, 4, 5], [6, 7, 8],
    ]  # fmt: skip
    rows = Dataset.from_tensor_slices({"a": np.arange(10), "b": np.arange(10) * 2}).batch(3)
    first = next(iter(rows.rebatch(4)))
    assert first["a"].tolist() == [0, 1, 2, 3] and first["b"].tolist() == [0, 2, 4, 6]
    rebatched = Dataset.range(12).batch(5).rebatch(4)
    assert rebatched.batch_size == 4
    parts = [next(iter(rebatched.process_split(i, 2))).tolist() for i in range(2)]
    assert parts == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        Dataset.range(4).batch(2).rebatch([2, 0])
    with pytest.raises(ValueError, match=r"rebatch\(\) splits every leaf"):
        list(Dataset.range(4).rebatch(2))
