"""Large streamed batches go into reused arrays, never into one somebody still holds."""

from __future__ import annotations

import numpy as np

from phalanx import data
from phalanx._src.data.recycle import MIN_BYTES, Recycler

ROW = (64, 64, 3)  # float32: 48 KiB a row; a batch of 96 is 4.5 MiB, over MIN_BYTES


def _stream(n=8 * 96, batch=96):
    # A generator streams: the batches are stacked by the streaming batch, as after
    # TFRecordDataset.
    def rows():
        for i in range(n):
            yield np.full(ROW, i, np.float32)

    return data.Dataset.from_generator(rows).batch(batch)


def _address(array):
    return array.__array_interface__["data"][0]


def test_large_batches_reuse_memory_once_released():
    assert 96 * np.prod(ROW) * 4 >= MIN_BYTES
    addresses = []
    for batch in _stream():
        addresses.append(_address(batch))
        del batch
    assert len(set(addresses)) < len(addresses)  # memory came back


def test_a_kept_batch_or_a_view_of_it_is_never_overwritten():
    kept = list(_stream())  # every batch held
    views = [b[10:20] for b in _stream()]  # only views held: their base stays referenced
    for i, (batch, view) in enumerate(zip(kept, views, strict=True)):
        first = i * 96
        np.testing.assert_array_equal(batch[:, 0, 0, 0], np.arange(first, first + 96))
        np.testing.assert_array_equal(view[:, 0, 0, 0], np.arange(first + 10, first + 20))
    assert len({_address(b) for b in kept}) == len(kept)


def test_small_or_mixed_values_are_not_recycled():
    recycler = Recycler()
    assert recycler.stack([np.zeros(4)] * 3) is None  # too small: malloc keeps it
    big = np.zeros(MIN_BYTES // 8, np.float64)
    assert recycler.stack([big, big.astype(np.float32)]) is None  # dtypes differ
    out = recycler.stack([big, big])
    assert out.shape == (2, *big.shape) and out.dtype == big.dtype


def test_one_native_copy_equals_numpys_stack_for_every_dtype():
    from phalanx._src.image import opencv

    rng = np.random.default_rng(0)
    for dtype in (np.uint8, np.int8, np.float16, np.float32, np.int64, np.float64, bool):
        for shape in [(7,), (5, 3), (9, 4, 3), (2, 3, 4, 5)]:
            values = [(rng.normal(size=shape) * 50).astype(dtype) for _ in range(6)]
            out = np.full((6, *shape), 7, dtype)
            assert opencv.stack_into(values, out) == (opencv.version() is not None)
            if opencv.version() is not None:
                np.testing.assert_array_equal(out, np.stack(values))


def test_a_strided_value_falls_back_to_numpy_with_the_same_rows():
    from phalanx._src.image import opencv

    big = np.arange(2 * MIN_BYTES // 4, dtype=np.float32).reshape(-1, 8)
    values = [big[:, ::2], big[:, 1::2]]  # not C-contiguous
    assert not opencv.stack_into(values, np.empty((2, *values[0].shape), np.float32))
    np.testing.assert_array_equal(Recycler().stack(values), np.stack(values))
