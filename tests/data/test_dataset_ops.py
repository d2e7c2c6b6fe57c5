"""Dataset: structure, batching, shuffling, repeat, shard, take, map, cache, prefetch."""

from __future__ import annotations

import collections
import math
import threading
import time

import numpy as np
import pytest

from phalanx.data import AUTOTUNE, Dataset

Pair = collections.namedtuple("Pair", ["image", "label"])


def rows(n: int = 10) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def labels(ds) -> list[list[int]]:
    """The batches of one epoch as lists (the element is the array itself)."""
    return [np.asarray(b).tolist() for b in ds]


def test_structure_is_preserved():
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.arange(6, dtype=np.int32)
    tup = next(iter(Dataset.from_tensor_slices((x, y)).batch(4)))
    assert type(tup) is tuple and tup[0].shape == (4, 2) and tup[1].dtype == np.int32
    dic = next(iter(Dataset.from_tensor_slices({"a": x, "b": {"c": y}}).batch(4)))
    assert set(dic) == {"a", "b"} and dic["b"]["c"].tolist() == [0, 1, 2, 3]
    pair = next(iter(Dataset.from_tensor_slices(Pair(x, y)).batch(4)))
    assert isinstance(pair, Pair) and pair.label.tolist() == [0, 1, 2, 3]
    single = next(iter(Dataset.from_tensor_slices(x).batch(4)))
    assert isinstance(single, np.ndarray) and single.dtype == np.float32
    # A list is an array, as in tf.data.
    assert labels(Dataset.from_tensor_slices([[1, 2], [3, 4]]).batch(2)) == [[[1, 2], [3, 4]]]


def test_unbatched_iteration_yields_rows():
    x = np.arange(6).reshape(3, 2)
    out = list(Dataset.from_tensor_slices((x, rows(3))))
    assert [(a.tolist(), int(b)) for a, b in out] == [([0, 1], 0), ([2, 3], 1), ([4, 5], 2)]


@pytest.mark.parametrize(
    ("n", "size", "drop", "golden"),
    [
        (10, 4, False, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]),
        (10, 4, True, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (8, 4, False, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (3, 5, False, [[0, 1, 2]]),
    ],
)
def test_batch_golden(n, size, drop, golden):
    ds = Dataset.from_tensor_slices(rows(n)).batch(size, drop_remainder=drop)
    assert labels(ds) == golden
    assert len(ds) == ds.cardinality == len(golden)
    assert ds.batch_size == size and ds.drop_remainder is drop


def test_same_seed_same_batches_across_datasets():
    make = lambda: Dataset.from_tensor_slices(rows(50)).shuffle(50, seed=7).batch(8)  # noqa: E731
    a, b = make(), make()
    assert [labels(a) for _ in range(3)] == [labels(b) for _ in range(3)]
    other = Dataset.from_tensor_slices(rows(50)).shuffle(50, seed=8).batch(8)
    assert labels(other) != labels(make())


def test_shuffle_is_a_permutation_that_changes_every_epoch():
    ds = Dataset.from_tensor_slices(rows(40)).shuffle(40, seed=0).batch(40)
    epochs = [labels(ds)[0] for _ in range(3)]
    for order in epochs:
        assert sorted(order) == list(range(40))
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]


def test_shuffle_without_reshuffle_repeats_the_order():
    ds = Dataset.from_tensor_slices(rows(40)).shuffle(40, seed=3, reshuffle_each_iteration=False)
    batched = ds.batch(40)
    first, second = labels(batched), labels(batched)
    assert first == second and first[0] != list(range(40))
    repeated = labels(ds.repeat(2).batch(40))
    assert repeated[0] == repeated[1]


def test_repeat_reshuffles_and_batches_straddle_epochs():
    ds = Dataset.from_tensor_slices(rows(6)).shuffle(6, seed=1).repeat(2).batch(4)
    out = labels(ds)
    assert [len(b) for b in out] == [4, 4, 4]
    flat = [v for batch in out for v in batch]
    assert sorted(flat[:6]) == sorted(flat[6:]) == list(range(6))
    assert flat[:6] != flat[6:]


def test_batch_then_repeat_keeps_epochs_apart():
    ds = Dataset.from_tensor_slices(rows(5)).batch(2).repeat(2)
    assert labels(ds) == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4]]
    assert len(ds) == 6


def test_infinite_repeat_cardinality_and_take():
    ds = Dataset.from_tensor_slices(rows(3)).repeat().batch(2)
    assert ds.cardinality == math.inf
    with pytest.raises(TypeError, match="infinite"):
        len(ds)
    it = iter(ds)
    assert [next(it).tolist() for _ in range(4)] == [[0, 1], [2, 0], [1, 2], [0, 1]]
    assert labels(ds.take(2)) == [[0, 1], [2, 0]]


def test_shuffle_after_infinite_repeat_permutes_blocks():
    ds = Dataset.from_tensor_slices(rows(4)).repeat().shuffle(8, seed=0).batch(8)
    it = iter(ds)
    first, second = next(it).tolist(), next(it).tolist()
    assert sorted(first) == sorted(second) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert first != [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.parametrize(
    ("n", "shards", "index", "golden"),
    [(10, 3, 0, [0, 3, 6, 9]), (10, 3, 1, [1, 4, 7]), (10, 3, 2, [2, 5, 8]), (2, 3, 2, [])],
)
def test_shard_golden(n, shards, index, golden):
    ds = Dataset.from_tensor_slices(rows(n)).shard(shards, index)
    assert [int(v) for v in ds] == golden
    assert len(ds) == len(golden)


def test_take():
    ds = Dataset.from_tensor_slices(rows(10)).take(3)
    assert [int(v) for v in ds] == [0, 1, 2]
    assert Dataset.from_tensor_slices(rows(10)).take(-1).cardinality == 10


def test_map_per_row_unpacks_tuples():
    x, y = np.arange(6, dtype=np.float32).reshape(3, 2), rows(3)
    ds = Dataset.from_tensor_slices((x, y)).map(lambda a, b: {"s": a.sum(), "y": b * 10})
    out = next(iter(ds.batch(3)))
    assert out["s"].tolist() == [1.0, 5.0, 9.0] and out["y"].tolist() == [0, 10, 20]


def test_map_after_batch_runs_once_per_batch():
    calls = []

    def double(x):
        calls.append(len(x))
        return x * 2

    ds = Dataset.from_tensor_slices(rows(5)).batch(2).map(double)
    assert labels(ds) == [[0, 2], [4, 6], [8]]
    assert calls == [2, 2, 1]


@pytest.mark.parametrize("workers", [1, 2, AUTOTUNE])
def test_map_workers_give_the_same_batches(workers):
    base = Dataset.from_tensor_slices(rows(37)).shuffle(37, seed=2).batch(5)
    serial = base.map(lambda v: v + 1)
    parallel = base.map(lambda v: v + 1, num_parallel_calls=workers)
    assert parallel.num_workers >= 1
    assert [labels(serial) for _ in range(2)] == [labels(parallel) for _ in range(2)]


def test_map_workers_run_concurrently():
    # Each call waits until another call is running too: it only passes with 2+ workers.
    barrier = threading.Barrier(2, timeout=10)

    def meet(v):
        barrier.wait()
        return v

    ds = Dataset.from_tensor_slices(rows(8)).batch(2).map(meet, num_parallel_calls=2)
    assert labels(ds) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_map_threads_stop_after_the_epoch():
    def running():
        return [t for t in threading.enumerate() if t.name.startswith("phalanx-map")]

    ds = Dataset.from_tensor_slices(rows(8)).batch(2).map(lambda v: v, num_parallel_calls=2)
    labels(ds)
    assert not running()
    it = iter(ds)
    next(it)
    assert running()
    it.close()
    for _ in range(50):
        if not running():
            break
        time.sleep(0.02)
    assert not running()


def test_cache_computes_each_element_once():
    seen = collections.Counter()

    def record(v):
        seen[int(v)] += 1
        return v * 3

    ds = Dataset.from_tensor_slices(rows(6)).map(record).cache().shuffle(6, seed=0).batch(4)
    epochs = [sorted(v for batch in labels(ds) for v in batch) for _ in range(3)]
    assert epochs == [[0, 3, 6, 9, 12, 15]] * 3
    assert set(seen.values()) == {1}


def test_cache_of_batches():
    calls = []
    ds = Dataset.from_tensor_slices(rows(5)).batch(2).map(lambda b: calls.append(1) or b).cache()
    assert labels(ds) == labels(ds) == [[0, 1], [2, 3], [4]]
    assert len(calls) == 3


def test_prefetch_gives_the_same_batches():
    base = Dataset.from_tensor_slices(rows(20)).shuffle(20, seed=5).batch(3)
    assert labels(base) == labels(base.prefetch(4)) == labels(base.prefetch(AUTOTUNE))


def test_dtypes_are_preserved():
    x = np.ones((4, 2), np.float16)
    y = np.zeros(4, np.uint8)
    xb, yb = next(iter(Dataset.from_tensor_slices((x, y)).shuffle(4, seed=0).batch(4)))
    assert xb.dtype == np.float16 and yb.dtype == np.uint8


def test_shuffle_order_is_pinned():
    # Golden orders: a change here breaks resuming from checkpoints written by older versions.
    ds = Dataset.from_tensor_slices(rows(10)).shuffle(10, seed=0).batch(10)
    assert labels(ds) == [[9, 1, 3, 8, 7, 6, 0, 4, 2, 5]]
    assert labels(ds) == [[2, 7, 0, 4, 1, 6, 8, 9, 3, 5]]
