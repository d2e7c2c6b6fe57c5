"""Batch arrays reused once nobody holds them, so large batches cost no page faults.

Why: a batch of 64 float32 images of 224x224x3 is 38.5 MB. glibc serves an allocation that
large with a fresh `mmap` and returns it to the kernel when it is freed, so every batch
first-touches ~9,400 new pages, which the kernel zeroes: 20-28 page faults and 60-150 us of
kernel time per image, in the thread that batches (for a streaming pipeline, the consumer).
That serial cost held the TF ResNet port at 1.3-1.5x from 1 to 2 workers where tf.data,
which batches into memory its allocator keeps, makes 1.8x.

A `Recycler` keeps the last few arrays it made for each shape and dtype and hands one out
again only when nothing else refers to it: no batch the user kept, no view of it (a NumPy
view refers to its base), no JAX array made from it without a copy. That is read from the
array's reference count, so a held batch is never overwritten. Only arrays of at least
`MIN_BYTES` are kept (smaller ones come from malloc's arenas without faults), at most
`KEEP` per shape, and they go with the iterator that owns the recycler.

Example:
  >>> recycler = Recycler()
  >>> batch = recycler.stack([image] * 64)     # a new array
  >>> del batch
  >>> again = recycler.stack([image] * 64)     # the same memory, refilled
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from phalanx._src.image import opencv

MIN_BYTES = 1 << 22  # 4 MiB: below glibc's mmap threshold's range, malloc keeps the memory
KEEP = 4  # arrays kept per shape and dtype: a batch in use, prefetched ones, the next


class Recycler:
    """Arrays for stacked batches, reused once unreferenced (see the module doc)."""

    def __init__(self) -> None:
        self._kept: dict[tuple, list[np.ndarray]] = {}

    def stack(self, values: list[Any] | tuple[Any, ...]) -> np.ndarray | None:
        """`np.stack(values)` into a kept array, or None where that does not apply
        (values that are not arrays of one shape and dtype, or a small result)."""
        first = values[0]
        if not isinstance(first, np.ndarray) or first.dtype.kind in "OUS":
            return None
        shape, dtype = first.shape, first.dtype
        if first.nbytes * len(values) < MIN_BYTES or any(
            type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype for v in values
        ):
            return None
        out = self._empty((len(values), *shape), dtype)
        # One GIL release for the whole batch where OpenCV is installed (opencv.stack_into
        # says why), else NumPy's, one per value.
        return out if opencv.stack_into(values, out) else np.stack(values, out=out)

    def _empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        kept = self._kept.setdefault((shape, dtype.str), [])
        for i in range(len(kept)):
            # 2: the list's reference and getrefcount's argument; any other is a user's.
            if sys.getrefcount(kept[i]) == 2:
                return kept[i]
        out = np.empty(shape, dtype)
        kept.append(out)
        if len(kept) > KEEP:
            kept.pop(0)  # still held by its user: it is only forgotten here
        return out
