"""`Dataset`'s global batch: `process_split`, and the `batch_size`, `drop_remainder` and
`split` that `fit` and the distribution read from the batch that made the elements.

Mixed into `Dataset`.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from phalanx._src.data import (
    index_ops,
    mix_ops,
    plan,
    stream_nested,
    stream_scan,
    validation,
    window_ops,
)
from phalanx._src.data.stream_nested import StreamBatch

# Ops whose elements are made anew from their input's: a batch below them made no element.
_NEW_ELEMENTS = (
    stream_nested.Unbatch,
    stream_nested.FlatMap,
    stream_nested.Interleave,
    window_ops.Window,
    window_ops.GroupByWindow,
    stream_scan.Scan,
)


def _global_batches(node: plan.Node) -> list[Any]:
    """The batches that made `node`'s elements: the first batch down the chain (the
    outermost of a nested `batch().batch()`), in every input of a zip, a concatenate or a
    mix, unless an op that makes new elements out of its input's (unbatch, flat_map,
    window, ...) comes first."""
    if isinstance(node, index_ops.Batch | StreamBatch):
        return [node]
    if isinstance(node, _NEW_ELEMENTS):
        return []
    inputs = plan.parents(node)
    if isinstance(node, mix_ops.Choose):
        inputs = inputs[1:]  # the first is the choice of input
    return [batch for parent in inputs for batch in _global_batches(parent)]


class DatasetBatches:
    """Mixed into `Dataset`; see the module docstring."""

    _node: plan.Node
    _options: Any

    def _then(self, node: plan.Node) -> Any:
        raise NotImplementedError

    def process_split(self, index: int | None = None, count: int | None = None) -> Any:
        """Yields only this process's part of every global batch, reading only those rows.

        Part `index` of `count` is the slice `ceil_split(len(global_batch), count)[index]`
        (tf.distribute's rule: ceil(n / count) rows each, the last parts short or empty), so
        what each global batch holds never depends on the number of processes, and every
        process yields the same number of (possibly empty) batches. A `map` after `batch`
        sees only this process's rows (possibly none), so it must work row by row (casts,
        scaling), not across the batch, for that independence to hold.

        A pipeline over TFRecord files is sharded at the files instead, as tf.data's
        auto-sharding (`Options().experimental_distribute.auto_shard_policy`): each process
        reads its files (or its records) and yields batches of global / count rows.

        Args:
          index: this process's part; defaults to `jax.process_index()`.
          count: the number of parts; defaults to `jax.process_count()`.

        Raises:
          ValueError: the dataset is not batched, or index/count are out of range.
        """
        if index is None or count is None:
            import jax  # Only here: reading the process needs the backend.

            index = jax.process_index() if index is None else index
            count = jax.process_count() if count is None else count
        count = validation.check_positive(count, "count", "process_split(0, 2)")
        if not 0 <= index < count:
            raise ValueError(f"index must be in [0, {count}), got {index}.")
        batches = _global_batches(self._node)
        if not batches:
            raise ValueError("process_split() splits global batches; call batch() first.")
        # A source may split the pipeline itself: record files are sharded at the files,
        # as tf.data's auto-sharding does (records/record_files.py).
        for node in plan.chain(self._node):
            hook = getattr(node, "split_processes", None)
            split = None if hook is None else hook(self._node, self._options, index, count)
            if split is not None:
                return self._then(split)
        # `rebuild` shows the nodes in `chain` order: the global batches are at these places.
        chain = plan.chain(self._node)
        places = {i for i, node in enumerate(chain) if any(node is b for b in batches)}
        seen = itertools.count()

        def change(node: plan.Node) -> plan.Node:
            if next(seen) not in places:
                return node
            if isinstance(node, index_ops.Batch):
                return index_ops.Batch(node.parent, node.size, node.drop_remainder, (index, count))
            return dataclasses.replace(node, split=(index, count))

        return self._then(plan.rebuild(self._node, change))

    def _batch_node(self) -> index_ops.Batch | StreamBatch | None:
        """The batch that made this dataset's elements (the outermost of a nested
        `batch().batch()`; the first input's, in a zip): see `_global_batches`."""
        found = _global_batches(self._node)
        return found[0] if found else None

    @property
    def batch_size(self) -> int | None:
        """Rows per global batch, or None before `batch`."""
        node = self._batch_node()
        return None if node is None else node.size

    @property
    def drop_remainder(self) -> bool:
        """Whether a short last batch is dropped (False before `batch`)."""
        node = self._batch_node()
        return False if node is None else node.drop_remainder

    @property
    def split(self) -> tuple[int, int] | None:
        """(index, count) set by `process_split`, or None."""
        node = self._batch_node()
        return None if node is None else node.split
