"""Bad input fails when the dataset or batches are built, with a message that says why."""

from __future__ import annotations

import re

import numpy as np
import pytest

from phalanx.data import Dataset, as_batches


def x_y(n: int = 100, m: int = 100):
    return np.zeros((n, 3), np.float32), np.zeros(m, np.int32)


def test_mismatched_lengths_name_x_and_y():
    with pytest.raises(ValueError, match=r"^x has 100 rows but y has 99; .*same split"):
        as_batches(x_y(100, 99), batch_size=10)
    with pytest.raises(ValueError, match=r"^x has 100 rows but y has 99"):
        Dataset.from_tensor_slices(x_y(100, 99))


def test_mismatched_lengths_in_a_dict_name_the_keys():
    with pytest.raises(
        ValueError, match=re.escape("tensors['a'] has 4 rows but tensors['b'] has 5")
    ):
        Dataset.from_tensor_slices({"a": np.zeros(4), "b": np.zeros(5)})


def test_ragged_leaf():
    with pytest.raises(ValueError, match=r"x\['tokens'\] is ragged.*pad the rows"):
        as_batches({"tokens": [[1, 2, 3], [4]]}, batch_size=2)


def test_object_and_string_dtypes():
    # Legal on the host (tests/data/test_strings.py); refused where batches feed the devices.
    with pytest.raises(TypeError, match=r"^the input arrays: y holds .* str.*integer ids"):
        as_batches((np.zeros((3, 2)), np.array(["cat", "dog", "cow"])), batch_size=2)
    objects = np.empty(3, dtype=object)
    with pytest.raises(TypeError, match=r"x holds Python objects of type NoneType"):
        as_batches(objects, batch_size=2)


def test_numeric_and_bfloat16_dtypes_are_accepted():
    import ml_dtypes

    for dtype in (np.bool_, np.uint8, np.int64, np.float16, np.complex64, ml_dtypes.bfloat16):
        (batch,) = list(Dataset.from_tensor_slices(np.zeros(2, dtype)).batch(2))
        assert batch.dtype == dtype


def test_empty_dataset():
    with pytest.raises(ValueError, match=r"^the dataset is empty: x has 0 rows"):
        as_batches(x_y(0, 0), batch_size=4)
    with pytest.raises(ValueError, match="no arrays"):
        Dataset.from_tensor_slices({})


def test_scalar_leaf():
    with pytest.raises(ValueError, match=r"tensors is a scalar .*reshape\(1\)"):
        Dataset.from_tensor_slices(np.float32(3.0))


@pytest.mark.parametrize(
    ("batch_size", "error", "match"),
    [
        (0, ValueError, "batch_size must be a positive integer, got 0; e.g. batch_size=32"),
        (-8, ValueError, "got -8"),
        (2.5, TypeError, r"got 2\.5 \(float\)"),
        (True, TypeError, "got True"),
        ("32", TypeError, "got '32'"),
    ],
)
def test_bad_batch_sizes(batch_size, error, match):
    with pytest.raises(error, match=match):
        Dataset.from_tensor_slices(np.zeros(4)).batch(batch_size)
    with pytest.raises(error, match=match):
        as_batches(np.zeros(4), batch_size=batch_size)


def test_numpy_integer_batch_size_is_fine():
    assert Dataset.from_tensor_slices(np.zeros(4)).batch(np.int64(2)).batch_size == 2


def test_batches_that_would_not_exist():
    # tf.data's rule: a pipeline may yield nothing; a model's input may not.
    short = Dataset.from_tensor_slices(np.zeros(5)).batch(8, drop_remainder=True)
    assert list(short) == [] and short.cardinality == 0
    assert list(Dataset.from_tensor_slices(np.zeros(5)).take(0).batch(2)) == []
    with pytest.raises(ValueError, match=r"yields no batches.*batch\(8, drop_remainder=True\)"):
        as_batches(short)
    with pytest.raises(ValueError, match="elements of one shape"):
        list(Dataset.from_tensor_slices(np.zeros(5)).batch(2).batch(3))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda ds: ds.shuffle(0), "buffer_size must be a positive integer"),
        (lambda ds: ds.shuffle(4, seed=-1), "seed must be >= 0"),
        (lambda ds: ds.repeat(-2), "count must be None, -1 or >= 0"),
        (lambda ds: ds.shard(2, 2), r"index must be in \[0, 2\)"),
        (lambda ds: ds.shard(0, 0), "num_shards must be a positive integer"),
        (lambda ds: ds.take(-3), "count must be >= 0 or -1"),
        (lambda ds: ds.map(abs, num_parallel_calls=0), "num_parallel_calls must be a positive"),
        (lambda ds: ds.repeat().cache(), "cache.. needs a finite dataset"),
        (lambda ds: ds.prefetch(0), "buffer_size must be a positive integer"),
    ],
)
def test_bad_transformation_arguments(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build(Dataset.from_tensor_slices(np.zeros(4)))


def test_ragged_map_output_is_named():
    ds = Dataset.from_tensor_slices(np.arange(3)).batch(3).map(lambda v: {"rows": [[1], [2, 3]]})
    with pytest.raises(ValueError, match=r"map output\['rows'\] is ragged"):
        next(iter(ds))


def test_map_output_conversion_fast_and_full_paths_agree():
    """A tuple of numeric arrays passes through as it is; anything else in a tuple (a
    string, a list, a nested tuple, a Python number) still gets the full conversion."""
    from phalanx._src.data.validation import to_numpy_tree

    image, label = np.zeros((2, 2), np.uint8), np.array(3, np.int64)
    assert to_numpy_tree((image, label), "out") == (image, label)
    assert to_numpy_tree((image, label), "out")[0] is image
    assert to_numpy_tree(image, "out") is image
    text, nested = to_numpy_tree((np.array(["a", "b"]), ([1, 2], 3.5)), "out")
    assert text.dtype == object and text.tolist() == ["a", "b"]
    assert nested[0].tolist() == [1, 2] and nested[1] == np.float64(3.5)
    strings = Dataset.from_tensor_slices(np.arange(2)).map(lambda v: (np.array(b"x"), v))
    assert [s for s, _ in strings] == [b"x", b"x"]
    with pytest.raises(ValueError, match=r"map output\[0\] is ragged"):
        to_numpy_tree(([[1], [2, 3]], image), "map output")
