"""Random image ops inside Dataset.map: the same batches whatever computes them, and on resume."""

from __future__ import annotations

import json

import numpy as np

from phalanx import image
from phalanx.data import AUTOTUNE, Dataset

N = 24


def augment(pixels, label):
    """Unseeded and seeded random ops, as a TF augmentation function (module-level: picklable)."""
    pixels = image.random_flip_left_right(pixels)
    pixels = image.random_crop(pixels, (4, 4, 3))
    pixels = image.random_brightness(pixels, 0.3, seed=7)
    return pixels, label


def pipeline(seed=3, **map_kwargs):
    pixels = np.arange(N * 6 * 6 * 3, dtype=np.uint8).reshape(N, 6, 6, 3)
    labels = np.arange(N, dtype=np.int32)
    ds = Dataset.from_tensor_slices((pixels, labels)).shuffle(N, seed=seed)
    return ds.map(augment, **map_kwargs).batch(4)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


def test_same_batches_inline_threads_autotune_and_processes():
    reference = list(pipeline())
    for kwargs in (
        {"num_parallel_calls": 1},
        {"num_parallel_calls": 2},
        {"num_parallel_calls": AUTOTUNE},
        {"num_parallel_calls": 2, "workers": "process"},
    ):
        _same(reference, list(pipeline(**kwargs)))
    # The draws do depend on the element: not every image got the same crop and flip.
    crops = {batch[0][i].tobytes() for batch in reference for i in range(4)}
    assert len(crops) == N
    # A different shuffle seed is a different dataset: other draws.
    other = list(pipeline(seed=4))
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(reference, other, strict=True))


def test_a_restored_iterator_continues_bitwise():
    it = iter(pipeline(num_parallel_calls=2))
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    restored = iter(pipeline(num_parallel_calls=AUTOTUNE))
    restored.set_state(state)
    _same(rest, list(restored))
    assert len(head) + len(rest) == N // 4


def test_two_maps_draw_different_numbers():
    pixels = np.zeros((8, 1, 64, 1), np.uint8)
    pixels[:, :, :32] = 1
    ds = Dataset.from_tensor_slices(pixels)
    once = list(ds.map(image.random_flip_left_right))
    twice = list(ds.map(image.random_flip_left_right).map(image.random_flip_left_right))
    flips_once = [bool(x[0, 0, 0] == 0) for x in once]
    flips_twice = [bool(x[0, 0, 0] == 0) for x in twice]
    # Were the second map's draws the first's, every image would be flipped back.
    assert any(flips_twice) and flips_once != [False] * 8


def _streaming(**map_kwargs):
    pixels = np.arange(N * 6 * 6 * 3, dtype=np.uint8).reshape(N, 6, 6, 3)
    labels = np.arange(N, dtype=np.int32)
    ds = Dataset.from_tensor_slices((pixels, labels)).shuffle(N, seed=3)
    ds = ds.filter(lambda p, label: label % 3 != 0)  # a streaming op: no random access after it
    return ds.map(augment, **map_kwargs).batch(4)


def test_a_streaming_map_in_threads_gives_the_same_batches_and_resumes():
    reference = list(_streaming())
    assert len(reference) == 4
    for kwargs in ({"num_parallel_calls": 2}, {"num_parallel_calls": AUTOTUNE}):
        _same(reference, list(_streaming(**kwargs)))
    it = iter(_streaming(num_parallel_calls=2))
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    restored = iter(_streaming(num_parallel_calls=2))
    restored.set_state(state)
    _same(rest, list(restored))
    _same(reference[1:], rest)


def _stops(value):
    raise StopIteration  # a bug in a map (e.g. next() on an empty iterator)


def test_a_map_raising_stop_iteration_fails_instead_of_ending_the_epoch():
    import pytest

    ds = Dataset.from_tensor_slices(np.arange(8))
    for mapped in (ds.map(_stops), ds.filter(lambda v: v >= 0).map(_stops, num_parallel_calls=2)):
        with pytest.raises(RuntimeError, match="raised StopIteration"):
            list(mapped)
