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


def _written_cache(s):
    """A cache file of the scene's 16 elements (`cache(filename)` after one full pass)."""
    path = str(s.tmp / "cache")
    list(ds(s).cache(path))
    return path


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
        "`fit` of a dataset with no batch (`batch(100, drop_remainder=True)` of 16 elements)",
        ValueError,
        ("yields no batches", "batch(100, drop_remainder=True)"),
        lambda s: s.model.fit(ds(s).batch(100, drop_remainder=True), verbose=0),
    ),
    Case(
        "`evaluate` of a dataset whose filter keeps nothing",
        ValueError,
        ("evaluate got no batch",),
        lambda s: s.model.evaluate(ds(s).filter(lambda x, y: y > 99).batch(4), verbose=0),
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
        ("elements of one shape", "drop_remainder=True on an inner batch()"),
        lambda s: list(ds(s).batch(5).batch(2)),
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
        "`concatenate(x)`: an array",
        TypeError,
        ("concatenate() takes a phalanx.data.Dataset",),
        lambda s: ds(s).concatenate(s.x),
    ),
    Case(
        "`concatenate` of elements of different structures",
        ValueError,
        ("elements of different structures", "PyTreeDef((*, *))", "PyTreeDef(*)"),
        lambda s: first(ds(s).concatenate(Dataset.range(3)).batch(20)),
    ),
    Case(
        "`unbatch()` of scalars",
        ValueError,
        ("unbatch() splits every leaf", "got leaf shapes [()]"),
        lambda s: first(Dataset.range(3).unbatch()),
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
        "`window(0)`",
        ValueError,
        ("size must be a positive integer, got 0",),
        lambda s: ds(s).window(0),
    ),
    Case(
        "`batch` of `window`'s windows",
        TypeError,
        ("batch() got datasets", "flat_map(lambda w: w.batch(3))"),
        lambda s: first(ds(s).window(3).batch(2)),
    ),
    Case(
        "`group_by_window` with both `window_size` and `window_size_func`",
        ValueError,
        ("exactly one of window_size and window_size_func",),
        lambda s: ds(s).group_by_window(lambda x, y: y, lambda k, w: w, 4, lambda k: 4),
    ),
    Case(
        "a `group_by_window` key that is not an integer",
        ValueError,
        ("key_func must return a scalar integer", "key_func=lambda x: x % 2"),
        lambda s: first(ds(s).group_by_window(lambda x, y: x, lambda k, w: w, 4)),
    ),
    Case(
        "`bucket_by_sequence_length` with one batch size per boundary",
        ValueError,
        ("len(bucket_boundaries) + 1 = 3 sizes, got 2",),
        lambda s: ds(s).bucket_by_sequence_length(len, [8, 16], [32, 32]),
    ),
    Case(
        "a `scan` function that returns the state only",
        ValueError,
        ("must return a pair (new_state, output_element)",),
        lambda s: first(Dataset.range(3).scan(0, lambda state, x: state + x)),
    ),
    Case(
        "`unique()` of vectors",
        TypeError,
        ("unique() takes scalar integers, strings or bytes",),
        lambda s: first(ds(s).map(lambda x, y: x).unique()),
    ),
    Case(
        "`get_single_element()` of several elements",
        ValueError,
        ("holds more than one element", "take(1)"),
        lambda s: ds(s).get_single_element(),
    ),
    Case(
        "`sample_from_datasets` with one weight for two datasets",
        ValueError,
        ("one weight >= 0 per dataset (2)", "got [1.0]"),
        lambda s: Dataset.sample_from_datasets([ds(s), ds(s)], weights=[1.0]),
    ),
    Case(
        "a `choose_from_datasets` choice out of range",
        ValueError,
        ("the choice dataset yielded 2", "in [0, 2)"),
        lambda s: first(Dataset.choose_from_datasets([ds(s), ds(s)], Dataset.range(2, 3))),
    ),
    Case(
        "`assert_cardinality` that the data contradicts",
        ValueError,
        ("expected to hold 20 elements but held only 16",),
        lambda s: list(
            ds(s).filter(lambda x, y: True).apply(phalanx.data.experimental.assert_cardinality(20))
        ),
    ),
    Case(
        "`cache(filename)` of a file another pipeline wrote",
        ValueError,
        ("holds 16 elements but this dataset has 8", "another pipeline"),
        lambda s: list(ds(s).take(8).cache(_written_cache(s))),
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
