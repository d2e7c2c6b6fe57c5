"""`Dataset`'s grouping ops: window, group_by_window, bucket_by_sequence_length, rebatch.

Mixed into `Dataset`. They stream (`window_ops`, `stream_nested.Rebatch`): their state is
a few counters plus the parent's, and `window`'s cardinality is known when its parent's is.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from phalanx._src.data import plan, stream_nested, validation, window_ops


class DatasetWindows:
    """Mixed into `Dataset`; see the module docstring."""

    _node: plan.Node

    def _then(self, node: plan.Node) -> Any:
        raise NotImplementedError

    def _make(self) -> Callable[[plan.Node], Any]:
        """The builder of a dataset over an in-memory node (a window's, a group's)."""
        kind = type(self)
        return lambda node: kind(node)  # type: ignore[call-arg]

    def window(
        self, size: int, shift: int | None = None, stride: int = 1, drop_remainder: bool = False
    ) -> Any:
        """Windows of `size` elements, every `shift` elements, as tf.data's `window`.

        Window k holds elements `k*shift + i*stride` for `i < size` (fewer at the end
        unless `drop_remainder`). Each window is a structure of datasets, one per leaf of
        the element (a dataset for a plain element, a tuple of datasets for a tuple), so
        `flat_map` turns windows back into elements.

        Args:
          size: elements per window.
          shift: elements between the starts of two windows (default `size`).
          stride: elements between two picked elements of a window.
          drop_remainder: drop the windows at the end that hold fewer than `size`.

        Returns:
          A streaming Dataset of windows; its cardinality is known when the parent's is.

        Example:
          >>> pairs = Dataset.range(5).window(2, shift=1, drop_remainder=True)
          >>> pairs.flat_map(lambda w: w.batch(2))   # [0, 1], [1, 2], [2, 3], [3, 4]
        """
        size = validation.check_positive(size, "size", "window(3)")
        shift = size if shift is None else validation.check_positive(shift, "shift", "window(3, 1)")
        stride = validation.check_positive(stride, "stride", "window(3, 1, 2)")
        return self._then(
            window_ops.Window(self._node, size, shift, stride, bool(drop_remainder), self._make())
        )

    def group_by_window(
        self,
        key_func: Callable[..., Any],
        reduce_func: Callable[[Any, Any], Any],
        window_size: int | None = None,
        window_size_func: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Groups elements by key and hands each group to `reduce_func`, as tf.data does.

        Elements go to the group of `key_func(element)` (a scalar integer). When a group
        holds its window size, `reduce_func(key, window)` is called with the key (int64)
        and a dataset of the group's elements, and must return a dataset, whose elements
        are yielded. At the end of the input the groups left are reduced in increasing key
        order. A restored iterator reads the epoch's elements again up to its position, to
        rebuild the groups being filled.

        Args:
          key_func: element -> scalar integer key (a tuple element is unpacked).
          reduce_func: (key, window dataset) -> dataset.
          window_size: elements per group; or
          window_size_func: key -> elements per group for that key.

        Raises:
          ValueError: both or neither of `window_size` and `window_size_func`.

        Example:
          >>> ds.group_by_window(lambda x: x % 2, lambda key, w: w.batch(4), window_size=4)
        """
        if (window_size is None) == (window_size_func is None):
            raise ValueError(
                "group_by_window needs exactly one of window_size and window_size_func; "
                "e.g. group_by_window(key_func, reduce_func, window_size=32)"
            )
        if window_size is not None:
            size = validation.check_positive(window_size, "window_size", "window_size=32")
            window_size_func = lambda key: size  # noqa: E731
        for name, fn in (("key_func", key_func), ("reduce_func", reduce_func)):
            if not callable(fn):
                raise TypeError(f"group_by_window's {name} must be a function, got {fn!r}")
        node = window_ops.GroupByWindow(
            self._node, key_func, reduce_func, window_size_func, self._make()
        )
        return self._then(node)

    def bucket_by_sequence_length(
        self,
        element_length_func: Callable[..., Any],
        bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int],
        padded_shapes: Any = None,
        padding_values: Any = None,
        pad_to_bucket_boundary: bool = False,
        no_padding: bool = False,
        drop_remainder: bool = False,
    ) -> Any:
        """Batches elements of similar length together, as tf.data's (by `group_by_window`).

        An element of length `L = element_length_func(element)` goes to bucket
        `i = bisect_right(bucket_boundaries, L)` and leaves it in a (padded) batch of
        `bucket_batch_sizes[i]` elements.

        Args:
          element_length_func: element -> its length (a tuple element is unpacked).
          bucket_boundaries: increasing upper length boundaries of the buckets.
          bucket_batch_sizes: batch size per bucket, `len(bucket_boundaries) + 1` of them.
          padded_shapes, padding_values: as `padded_batch` (default: pad to the longest).
          pad_to_bucket_boundary: pad to the bucket's boundary - 1 instead of the longest:
            the None dimensions of `padded_shapes`, or (where tf.data reads the static
            shapes phalanx does not have) the first dimension of every non-scalar leaf.
            Elements must then be shorter than the largest boundary.
          no_padding: `batch` instead of `padded_batch` (elements of one shape per batch).
          drop_remainder: drop each bucket's last, shorter batch.

        Raises:
          ValueError: `len(bucket_batch_sizes) != len(bucket_boundaries) + 1`, or
            boundaries that do not increase.

        Example:
          >>> tokens.bucket_by_sequence_length(len, [16, 32], [64, 32, 16])
        """
        bounds = [int(b) for b in bucket_boundaries]
        sizes = [validation.check_batch_size(b) for b in bucket_batch_sizes]
        if len(sizes) != len(bounds) + 1:
            raise ValueError(
                f"bucket_batch_sizes must hold len(bucket_boundaries) + 1 = {len(bounds) + 1} "
                f"sizes, got {len(sizes)}: one batch size per bucket, the last for lengths >= "
                f"{bounds[-1] if bounds else 0}"
            )
        if any(b >= c for b, c in itertools.pairwise(bounds)):
            raise ValueError(f"bucket_boundaries must increase, got {bounds}")

        def bucket(*element: Any) -> int:
            return bisect.bisect_right(bounds, int(np.asarray(element_length_func(*element))))

        def batching(bucket_id: Any, window: Any) -> Any:
            size = sizes[int(bucket_id)]
            if no_padding:
                return window.batch(size, drop_remainder=drop_remainder)
            shapes = padded_shapes
            if pad_to_bucket_boundary:
                if bucket_id == len(bounds):
                    raise ValueError(
                        "with pad_to_bucket_boundary=True, elements must be shorter than "
                        f"max(bucket_boundaries) = {bounds[-1]}"
                    )
                shapes = _boundary_shapes(next(iter(window)), shapes, bounds[bucket_id] - 1)
            return window.padded_batch(size, shapes, padding_values, drop_remainder)

        return self.group_by_window(bucket, batching, window_size_func=lambda i: sizes[int(i)])

    def rebatch(self, batch_size: int | Sequence[int], drop_remainder: bool = False) -> Any:
        """The rows of the batches regrouped into batches of `batch_size`, as tf.data's.

        `rebatch(n)` yields what `unbatch().batch(n)` does, slicing the batches instead of
        reading one row at a time. A list of sizes is cycled through.

        Example:
          >>> Dataset.range(10).batch(4).rebatch(3)   # [0 1 2], [3 4 5], [6 7 8], [9]
        """
        sizes = [batch_size] if isinstance(batch_size, int | np.integer) else list(batch_size)
        if not sizes:
            raise ValueError("rebatch needs a batch size, or a list of them; e.g. rebatch(32)")
        sizes = tuple(validation.check_batch_size(s) for s in sizes)
        node = stream_nested.Rebatch(self._node, sizes[0], bool(drop_remainder), sizes=sizes)
        return self._then(node)


def _boundary_shapes(first: Any, padded_shapes: Any, filler: int) -> Any:
    """`padded_shapes` with its None (-1) dimensions set to `filler`; without them, the
    first dimension of every non-scalar leaf of `first` (see bucket_by_sequence_length)."""
    leaves, treedef = jax.tree.flatten(first)
    if padded_shapes is None:
        ranks = [np.ndim(leaf) for leaf in leaves]
        shapes = [[filler] + [None] * (rank - 1) if rank else [] for rank in ranks]
    else:
        shapes = [
            [filler if d is None or d == -1 else d for d in shape]
            for shape in treedef.flatten_up_to(padded_shapes)
        ]
    return treedef.unflatten(shapes)
