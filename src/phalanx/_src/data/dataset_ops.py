"""tf.data's remaining ops on `Dataset`: skip, enumerate, zip, concatenate (index arithmetic
while their inputs are), and filter, from_generator, flat_map, interleave, unbatch and
padded_batch (streaming: see `stream`).

Every op is deterministic, and an iterator's `get_state()` restores it exactly mid-epoch:
for index arithmetic the state is the usual (epoch, step, seeds); once a pipeline streams it
adds a "cursor" entry holding each streaming op's counters (elements seen, kept, produced,
the row inside a batch being unbatched, ...) plus the state of what feeds it. A streaming
pipeline computes its elements in order in the consuming thread: `map(num_parallel_calls=)`
and `prefetch` after a streaming op add no worker threads (fit's device prefetcher still
reads ahead).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx._src.data import (
    combine_ops,
    executors,
    plan,
    stream,
    stream_combine,
    stream_nested,
    validation,
)

UNKNOWN_CARDINALITY = -2  # as tf.data.UNKNOWN_CARDINALITY: a streaming op's length


def _count(value: Any, name: str, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}; e.g. {example}.")
    return int(value)


class _either_way:
    """A function callable on the class (`Dataset.zip(a, b)`) or an instance (`a.zip(b)`)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., Any]:
        return self.fn if obj is None else functools.partial(self.fn, obj)


class DatasetOps:
    """Mixed into `Dataset`; see the module docstring."""

    _node: plan.Node

    @property
    def _streaming(self) -> bool:
        return isinstance(self._node, stream.Stream)

    def _then(self, node: plan.Node) -> Any:
        raise NotImplementedError

    @classmethod
    def from_generator(
        cls,
        generator: Callable[..., Any],
        output_types: Any = None,
        output_shapes: Any = None,
        args: tuple = (),
        output_signature: Any = None,
    ) -> Any:
        """A dataset of the elements `generator(*args)` yields (called anew every epoch).

        The iterator state counts the elements produced. A generator cannot be restored
        exactly unless it accepts a start position: if it has a `start` parameter, a
        restored iterator calls `generator(*args, start=n)` and it must yield from its n-th
        element on; otherwise the restore calls `generator(*args)` again and skips n
        elements, which is exact only when the generator yields the same sequence each time.

        Args:
          generator: a callable returning an iterable of numeric pytrees (NumPy arrays,
            numbers, tuples, dicts).
          output_types: tf.data's older form of `output_signature`: the dtypes (with
            `output_shapes`, the shapes; None: any).
          output_shapes: see `output_types`.
          args: positional arguments for `generator`.
          output_signature: a structure of `phalanx.data.TensorSpec`: every element is
            cast to its dtypes and checked against its shapes (a ValueError names the
            mismatch), and `element_spec` returns it without running the generator.

        Example:
          >>> def rows(n, start=0):
          ...     for i in range(start, n):
          ...         yield np.float32(i), np.int32(i % 2)
          >>> ds = Dataset.from_generator(rows, args=(10,)).batch(4)
        """
        if not callable(generator):
            raise TypeError(
                f"from_generator needs a callable that returns an iterator, got {generator!r}; "
                "pass the generator function itself, not a generator object"
            )
        if output_signature is None and output_types is not None:
            output_signature = _signature(output_types, output_shapes)
        return cls(stream.FromGenerator(generator, tuple(args), output_signature))

    @_either_way
    def zip(*datasets: Any) -> Any:
        """A dataset of tuples of the datasets' elements, as long as the shortest.

        Called as `Dataset.zip(a, b)`, `Dataset.zip((a, b))` or `a.zip(b)`.

        Example:
          >>> Dataset.zip(images, labels).batch(32)
        """
        if len(datasets) == 1 and isinstance(datasets[0], tuple | list):
            datasets = tuple(datasets[0])
        if len(datasets) < 1 or not all(isinstance(d, DatasetOps) for d in datasets):
            raise TypeError(f"zip() takes phalanx.data.Dataset objects, got {datasets!r}")
        nodes = tuple(d._node for d in datasets)
        if any(d._streaming for d in datasets):
            return datasets[0]._then(stream_combine.StreamZip(nodes))
        return datasets[0]._then(combine_ops.Zip(plan.same_level(nodes)))

    def concatenate(self, dataset: Any) -> Any:
        """This dataset's elements, then `dataset`'s (their elements of one structure).

        After an infinite dataset (`repeat()`), `dataset` is never reached, as in tf.data.
        """
        if not isinstance(dataset, DatasetOps):
            raise TypeError(f"concatenate() takes a phalanx.data.Dataset, got {dataset!r}")
        nodes = (self._node, dataset._node)
        if self._streaming or dataset._streaming:
            return self._then(stream_combine.StreamConcatenate(nodes))
        if self._node.length is None:
            return self
        return self._then(combine_ops.Concatenate(plan.same_level(nodes)))

    def skip(self, count: int) -> Any:
        """Every element after the first `count` of each epoch (`-1` skips them all)."""
        if count == -1:
            return self.take(0)  # type: ignore[attr-defined]
        count = _count(count, "count", "skip(10)")
        if self._streaming:
            return self._then(stream.StreamSkip(self._node, count))
        return self._then(combine_ops.Skip(self._node, count))

    def enumerate(self, start: int = 0) -> Any:
        """Pairs `(index, element)`, the index an int64 counting from `start` each epoch."""
        start = int(start)
        if self._streaming:
            return self._then(stream.StreamEnumerate(self._node, start))
        return self._then(combine_ops.Enumerate(self._node, start))

    def filter(self, predicate: Callable[..., Any]) -> Any:
        """The elements for which `predicate(element)` is True (a tuple is unpacked).

        Streaming: its state is the elements seen and kept plus the upstream state, and
        the ops after it stream too (`shuffle` and `cache` must come before it).

        Example:
          >>> evens = Dataset.from_tensor_slices(np.arange(10)).filter(lambda x: x % 2 == 0)
        """
        if not callable(predicate):
            raise TypeError(f"filter() needs a function element -> bool, got {predicate!r}")
        return self._then(stream.Filter(self._node, predicate))

    def flat_map(self, map_func: Callable[..., Any]) -> Any:
        """The elements of the dataset `map_func(element)` returns, element after element.

        `map_func` must return a `phalanx.data.Dataset` and be deterministic: a restored
        iterator calls it again on the element it was inside.

        Example:
          >>> ds.flat_map(lambda x: Dataset.from_tensor_slices(x))  # like unbatch()
        """
        if not callable(map_func):
            raise TypeError(f"flat_map() needs a function element -> Dataset, got {map_func!r}")
        return self._then(stream_nested.FlatMap(self._node, map_func))

    def interleave(
        self,
        map_func: Callable[..., Any],
        cycle_length: int | None = None,
        block_length: int = 1,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> Any:
        """tf.data's interleave: `block_length` elements from each of `cycle_length` datasets.

        `map_func(element)` returns a `phalanx.data.Dataset`. The order is tf.data's
        deterministic order; `num_parallel_calls` and `deterministic` are accepted for
        compatibility and computation stays sequential. `cycle_length=None` (or AUTOTUNE)
        is the number of CPUs this process may use, as in tf.data; the order follows it, and
        an iterator state saved with it restores at the saved cycle length on any machine.

        Example:
          >>> files.interleave(lambda i: make_shard(i), cycle_length=4, block_length=16)
        """
        del num_parallel_calls, deterministic
        if not callable(map_func):
            raise TypeError(f"interleave() needs a function element -> Dataset, got {map_func!r}")
        auto = cycle_length is None or cycle_length == -1
        if auto:  # the CPUs this process may use; a restore takes the saved cycle_length
            cycle_length = executors.cpu_count()
        cycle = validation.check_positive(cycle_length, "cycle_length", "interleave(f, 4)")
        block = validation.check_positive(block_length, "block_length", "interleave(f, 4, 1)")
        return self._then(stream_nested.Interleave(self._node, map_func, cycle, block, auto))

    def unbatch(self) -> Any:
        """Splits every element along its first axis into rows (the state: the element and
        the row in it). Every leaf needs that axis, of one length per element.
        """
        return self._then(stream_nested.Unbatch(self._node))

    def padded_batch(
        self,
        batch_size: int,
        padded_shapes: Any = None,
        padding_values: Any = None,
        drop_remainder: bool = False,
    ) -> Any:
        """Batches elements of different shapes, padding each leaf to a common shape.

        Args:
          batch_size: elements per batch.
          padded_shapes: the element structure of shapes; None (anywhere, or a None/-1
            dimension) pads to the longest in the batch.
          padding_values: a scalar for every leaf, or the element structure of scalars
            (default 0).
          drop_remainder: drop a last, shorter batch.

        Example:
          >>> ds.padded_batch(32, padded_shapes=([None], []))   # pad token sequences
        """
        size = validation.check_batch_size(batch_size)
        return self._then(
            stream_nested.StreamBatch(
                self._node, size, bool(drop_remainder), True, padded_shapes, padding_values
            )
        )


def _signature(types: Any, shapes: Any) -> Any:
    """tf.data's `output_types` / `output_shapes` pair as TensorSpecs."""
    import jax

    from phalanx._src.data.options import TensorSpec

    leaves, treedef = jax.tree.flatten(types)
    shapes = [None] * len(leaves) if shapes is None else treedef.flatten_up_to(shapes)
    return treedef.unflatten(
        [
            TensorSpec(None if s is None else tuple(s), t)
            for t, s in zip(leaves, shapes, strict=True)
        ]
    )
