"""Mistakes with `phalanx.data`: building datasets, the arguments of their ops, and the order
of the ops."""

from __future__ import annotations

import numpy as np
import pytest
from mistakes import Case, assert_documented, expect, ids

import phalanx

Dataset = phalanx.data.Dataset


def ds(s):
    """The scene's (x, y) as an unbatched dataset of 16 elements."""
    return Dataset.from_tensor_slices((s.x, s.y))


def first(dataset):
    return next(iter(dataset))


def ragged():
    yield np.zeros(2, np.float32)
    yield np.zeros(3, np.float32)


CASES = [
    Case(
        "`from_tensor_slices((x, y))` with 16 rows of x and 15 of y",
        ValueError,
        ("has 16 rows", "has 15"),
        lambda s: Dataset.from_tensor_slices((s.x, s.y[:15])),
    ),
    Case(
        "`from_tensor_slices(3.0)`: a scalar",
        ValueError,
        ("is a scalar (shape ())",),
        lambda s: Dataset.from_tensor_slices(np.float32(3.0)),
    ),
    Case(
        "`from_tensor_slices` of an empty array",
        ValueError,
        ("the dataset is empty", "0 rows"),
        lambda s: Dataset.from_tensor_slices(np.zeros((0, 4), np.float32)),
    ),
    Case(
        "a batch of strings reaching the devices (`experimental_distribute_dataset`)",
        TypeError,
        ("element holds Python objects of type str", "StringLookup or a vocabulary"),
        lambda s: first(
            phalanx.Strategy().experimental_distribute_dataset(
                Dataset.from_tensor_slices(np.array(["apple", "pear"])).batch(2)
            )
        ),
    ),
    Case(
        "`from_tensor_slices` of ragged lists",
        ValueError,
        ("is ragged", "numpy.pad"),
        lambda s: Dataset.from_tensor_slices([[1.0, 2.0], [3.0]]),
    ),
    Case(
        "`from_tensor_slices(())`: nothing",
        ValueError,
        ("the data holds no arrays",),
        lambda s: Dataset.from_tensor_slices(()),
    ),
    Case(
        "`from_generator(gen())`: a generator object",
        TypeError,
        ("generator object", "pass the generator function itself"),
        lambda s: Dataset.from_generator(ragged()),
    ),
    Case(
        "`shuffle(0)`",
        ValueError,
        ("buffer_size must be a positive integer, got 0",),
        lambda s: ds(s).shuffle(0),
    ),
    Case(
        "`shuffle(1024, seed=-1)`",
        ValueError,
        ("seed must be >= 0, got -1",),
        lambda s: ds(s).shuffle(1024, seed=-1),
    ),
    Case(
        "`shuffle` after `filter`",
        ValueError,
        ("shuffle() needs random access", "before it"),
        lambda s: ds(s).filter(lambda x, y: y > 0).shuffle(16),
    ),
    Case(
        "`cache` after `repeat()`",
        ValueError,
        ("cache() needs a finite dataset",),
        lambda s: ds(s).repeat().cache(),
    ),
    Case(
        "`repeat(-2)`",
        ValueError,
        ("count must be None, -1 or >= 0, got -2",),
        lambda s: ds(s).repeat(-2),
    ),
    Case("`repeat('2')`", ValueError, ("got '2'",), lambda s: ds(s).repeat("2")),
    Case(
        "`repeat()` of an empty dataset",
        ValueError,
        ("repeat() of an empty dataset",),
        lambda s: ds(s).take(0).repeat(),
    ),
    Case(
        "`batch(0)`",
        ValueError,
        ("batch_size must be a positive integer, got 0",),
        lambda s: ds(s).batch(0),
    ),
    Case(
        "`batch(12.5)`",
        TypeError,
        ("batch_size must be a positive integer, got 12.5",),
        lambda s: ds(s).batch(12.5),
    ),
    Case(
        "`batch` of batches with a short last one",
        ValueError,
        ("inner batches of one shape", "drop_remainder=True on the inner batch()"),
        lambda s: list(ds(s).batch(5).batch(2)),
    ),
    Case(
        "`batch(100, drop_remainder=True)` of 16 elements",
        ValueError,
        ("batch(100, drop_remainder=True) of a dataset with 16 elements", "batch_size <= 16"),
        lambda s: ds(s).batch(100, drop_remainder=True),
    ),
    Case(
        "`map(f, num_parallel_calls=0)`",
        ValueError,
        ("num_parallel_calls must be a positive integer, got 0",),
        lambda s: ds(s).map(lambda x, y: (x, y), num_parallel_calls=0),
    ),
    Case(
        "`prefetch(0)`",
        ValueError,
        ("buffer_size must be a positive integer, got 0",),
        lambda s: ds(s).prefetch(0),
    ),
    Case(
        "`shard(2, 2)`: index past the last shard",
        ValueError,
        ("index must be in [0, 2), got 2",),
        lambda s: ds(s).shard(2, 2),
    ),
    Case(
        "`shard(0, 0)`",
        ValueError,
        ("num_shards must be a positive integer, got 0",),
        lambda s: ds(s).shard(0, 0),
    ),
    Case("`take(-2)`", ValueError, ("count must be >= 0 or -1, got -2",), lambda s: ds(s).take(-2)),
    Case(
        "`skip(-2)`", ValueError, ("count must be an int >= 0, got -2",), lambda s: ds(s).skip(-2)
    ),
    Case(
        "`filter(True)`: not a function",
        TypeError,
        ("filter() needs a function", "got True"),
        lambda s: ds(s).filter(True),
    ),
    Case(
        "a `filter` predicate that returns an array",
        ValueError,
        ("must return a scalar bool", "shape (4,)"),
        lambda s: first(ds(s).filter(lambda x, y: x > 0)),
    ),
    Case(
        "`flat_map(ds)`: a dataset, not a function",
        TypeError,
        ("flat_map() needs a function",),
        lambda s: ds(s).flat_map(ds(s)),
    ),
    Case(
        "a `flat_map` function that returns a list",
        TypeError,
        ("must return a phalanx.data.Dataset, got list", "from_tensor_slices"),
        lambda s: first(ds(s).flat_map(lambda x, y: [x])),
    ),
    Case(
        "`interleave(ds)`: a dataset, not a function",
        TypeError,
        ("interleave() needs a function",),
        lambda s: ds(s).interleave(ds(s)),
    ),
    Case(
        "`Dataset.zip(a, x)`: an array among datasets",
        TypeError,
        ("zip() takes phalanx.data.Dataset objects",),
        lambda s: Dataset.zip(ds(s), s.x),
    ),
    Case(
        "`Dataset.zip` of a batched and an unbatched dataset",
        ValueError,
        ("all batched or all unbatched",),
        lambda s: Dataset.zip(ds(s).batch(4), ds(s)),
    ),
    Case(
        "`concatenate(x)`: an array",
        TypeError,
        ("concatenate() takes a phalanx.data.Dataset",),
        lambda s: ds(s).concatenate(s.x),
    ),
    Case(
        "`concatenate` of a batched and an unbatched dataset",
        ValueError,
        ("two batched or two unbatched",),
        lambda s: ds(s).batch(4).concatenate(ds(s)),
    ),
    Case(
        "`concatenate` after `repeat()`",
        ValueError,
        ("after an infinite dataset",),
        lambda s: ds(s).repeat().concatenate(ds(s)),
    ),
    Case(
        "`unbatch()` of an unbatched dataset",
        ValueError,
        ("unbatch() needs a batched dataset",),
        lambda s: ds(s).unbatch(),
    ),
    Case(
        "`batch` of elements of different shapes",
        ValueError,
        ("different shapes", "padded_batch()"),
        lambda s: first(Dataset.from_generator(ragged).batch(2)),
    ),
    Case(
        "`padded_batch` with `padded_shapes` smaller than an element",
        ValueError,
        ("larger than the padded shape",),
        lambda s: first(Dataset.from_generator(ragged).padded_batch(2, padded_shapes=(2,))),
    ),
    Case(
        "`padded_batch` after `batch`",
        ValueError,
        ("already batched",),
        lambda s: ds(s).batch(4).padded_batch(4),
    ),
    Case(
        "`len()` of a repeated dataset",
        TypeError,
        ("the dataset is infinite", ".cardinality"),
        lambda s: len(ds(s).repeat()),
    ),
    Case(
        "`len()` of a filtered dataset",
        TypeError,
        ("length is unknown",),
        lambda s: len(ds(s).filter(lambda x, y: y > 0)),
    ),
    Case(
        "`process_split` before `batch`",
        ValueError,
        ("call batch() first",),
        lambda s: ds(s).process_split(0, 2),
    ),
    Case(
        "`process_split(2, 2)`",
        ValueError,
        ("index must be in [0, 2), got 2",),
        lambda s: ds(s).batch(4).process_split(2, 2),
    ),
    Case(
        "`iterator.set_state` with a state from elsewhere",
        ValueError,
        ("expected a state from DatasetIterator.get_state()", "{'step': 3}"),
        lambda s: iter(ds(s).batch(4)).set_state({"step": 3}),
    ),
    Case(
        "`as_batches('train.npz')`: a file name",
        TypeError,
        ("cannot read batches from a str",),
        lambda s: phalanx.data.as_batches("train.npz"),
    ),
    Case(
        "`InputWaitMeter(threshold=10)`: a percentage",
        ValueError,
        ("threshold must be in (0, 1), got 10",),
        lambda s: phalanx.data.InputWaitMeter(threshold=10),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_the_mistake_gets_a_clear_error(case, make_scene):
    expect(case, make_scene(case.checkpoint))


def test_every_case_is_in_the_docs():
    assert_documented(CASES)
