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
