"""`Dataset`: the tf.data-style builder over the random-access plan in `plan.py`."""

from __future__ import annotations

import itertools
import math
import secrets
from typing import Any

import numpy as np

from phalanx._src.data import (
    combine_ops,
    element_ops,
    executors,
    index_ops,
    plan,
    stream,
    stream_combine,
    validation,
)
from phalanx._src.data.dataset_batches import DatasetBatches
from phalanx._src.data.dataset_map import DatasetMap
from phalanx._src.data.dataset_mix import DatasetMix
from phalanx._src.data.dataset_ops import UNKNOWN_CARDINALITY, DatasetOps
from phalanx._src.data.dataset_sequence import DatasetSequence
from phalanx._src.data.dataset_tf import DatasetTF
from phalanx._src.data.dataset_windows import DatasetWindows
from phalanx._src.data.iterator import DatasetIterator
from phalanx._src.data.options import Options
from phalanx._src.data.saved.dataset_io import DatasetIO
from phalanx._src.data.stream_nested import StreamBatch
from phalanx._src.strategy import device_batch
from phalanx._src.strategy.keras_input import KerasInput

_INDEX_VIEW_NODES = (
    plan.Source,
    index_ops.Shuffle,
    index_ops.Repeat,
    index_ops.Shard,
    index_ops.Take,
    index_ops.Batch,
    combine_ops.Skip,
)
AUTOTUNE = executors.AUTOTUNE  # as tf.data.AUTOTUNE: measured, see `autotune`


class Dataset(
    DatasetOps,
    DatasetBatches,
    DatasetSequence,
    DatasetWindows,
    DatasetMix,
    DatasetTF,
    DatasetMap,
    DatasetIO,
    KerasInput,  # plain Keras's x
):
    """An input pipeline a tf.data user recognizes, yielding NumPy pytrees.

    Build one with `Dataset.from_tensor_slices`, chain transformations (each returns a new
    Dataset), and iterate: every `iter(ds)` is a new epoch, reshuffled when `shuffle` asks.
    Most operations are index arithmetic on in-memory arrays, so a batch is gathered with one
    indexing operation per array, an iterator's position (`get_state`) is a few integers,
    and `process_split` reads only this process's rows of each global batch. The ops that
    cannot be index arithmetic (`filter`, `from_generator`, `flat_map`, `interleave`,
    `unbatch`, `padded_batch`, `window`, `scan`, `ignore_errors`, ...) stream: they read in
    order, and the position adds their counters (see `dataset_ops`; docs/migration.md
    lists every tf.data op and how phalanx computes it).

    Differences from tf.data, all deliberate: `shuffle` draws a uniform permutation of the
    whole (finite) dataset rather than sampling from a buffer; `map` functions must be pure
    (they may run more than once for one element, in any thread or worker process);
    `num_parallel_calls` computes whole elements (batches, after `batch`) in threads or
    processes, and AUTOTUNE measures whether that pays (see `map`).

    Example:
      >>> ds = Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=0).batch(256)
      >>> for xb, yb in ds:  # NumPy arrays of 256 rows, then the remainder
      ...     ...
    """

    def __init__(self, node: plan.Node, prefetch: int = 0, options: Options | None = None):
        self._node = node
        self._prefetch = prefetch
        self._options = options
        self._tuner = None  # AUTOTUNE's measurements and choice (`autotune.Tuner`)
        self._epochs = itertools.count()
        self._owner: Dataset | None = None  # set on a row_indices() view

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_tensor_slices(cls, tensors: Any) -> Dataset:
        """A dataset whose elements are the rows of `tensors` (an array, tuple or dict).

        The element structure is kept exactly: a tuple stays a tuple, a dict a dict, a
        namedtuple that namedtuple. Lists are read as arrays, as tf.data does.

        Strings and bytes are welcome on the host (a list of str or bytes, a NumPy `U`,
        `S` or object array): an element's string leaf is a Python `str` or `bytes` (the
        type given: where tf.data's `as_numpy_iterator()` yields bytes for both, phalanx
        keeps str as str), and a batch of them is a NumPy object array, as tf.data gives
        a string tensor. `map` them to numbers (a `StringLookup`, a vocabulary) before
        the data goes to the devices, where a string leaf raises an error naming it.

        Args:
          tensors: a pytree of array-likes (NumPy, JAX, nested lists) with equal first dims.

        Returns:
          An unbatched Dataset; call `.batch(n)` before feeding a model.

        Raises:
          ValueError: ragged leaves, first dimensions that disagree, a scalar. No rows is
            an empty dataset, as in tf.data (`fit` refuses it).

        Example:
          >>> ds = Dataset.from_tensor_slices({"image": x, "label": y})
          >>> words = Dataset.from_tensor_slices(["the", "cat"])   # yields "the", "cat"
        """
        xy = type(tensors) is tuple and 2 <= len(tensors) <= 3  # Named x, y, sample_weight.
        return cls._from_arrays(tensors, "x" if xy else "tensors", allow_empty=True)

    @classmethod
    def from_tensors(cls, tensors: Any) -> Dataset:
        """A dataset of one element, `tensors` itself, as tf.data's `from_tensors`.

        Example:
          >>> Dataset.from_tensors([[1.0]]).repeat().batch(8)  # batches of shape (8, 1, 1)
        """
        named, treedef = device_batch.named_leaves(tensors, "tensors")
        rows = [validation.to_numpy(name, leaf)[None] for name, leaf in named]
        return cls(plan.Source(rows, treedef))

    @classmethod
    def _from_arrays(cls, tensors: Any, root: str, allow_empty: bool = False) -> Dataset:
        named, treedef = device_batch.named_leaves(tensors, root)
        arrays = [(name, validation.to_numpy(name, leaf)) for name, leaf in named]
        validation.check_rows(arrays, allow_empty)
        return cls(plan.Source([a for _, a in arrays], treedef))

    def _then(self, node: plan.Node) -> Dataset:
        return Dataset(node, self._prefetch, self._options)

    def _needs_random_access(self, op: str) -> None:
        if self._streaming:
            raise ValueError(
                f"{op} needs random access to the elements, which a streaming op (filter, "
                "from_generator, flat_map, interleave, unbatch, padded_batch, window, ...) "
                f"does not give; call {op} before it"
            )

    # -- transformations --------------------------------------------------------------------

    def shuffle(
        self, buffer_size: int, seed: int | None = None, reshuffle_each_iteration: bool = True
    ) -> Dataset:
        """Shuffles the elements: a uniform permutation per epoch, reproducible from `seed`.

        Args:
          buffer_size: kept for tf.data compatibility; a finite dataset is always fully
            permuted. After `repeat()` (infinite), elements are permuted within blocks of
            `buffer_size`.
          seed: the shuffle seed; None draws one now (and `get_state` records it, so a
            restored iterator still replays the same order).
          reshuffle_each_iteration: a new order every epoch (True) or the same one (False).
        """
        size = validation.check_positive(buffer_size, "buffer_size", "shuffle(1024)")
        # A streaming source may give random access on request (TFRecord files, by an
        # index of their records: records/indexed.py).
        hook = getattr(self._node, "random_access", None)
        indexed = None if hook is None else hook()
        if indexed is not None:
            return self._then(indexed).shuffle(size, seed, reshuffle_each_iteration)
        self._needs_random_access("shuffle()")
        if seed is None:
            seed = secrets.randbits(63)
        seed = int(seed)
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}; e.g. shuffle(1024, seed=0).")
        return self._then(index_ops.Shuffle(self._node, seed, size, bool(reshuffle_each_iteration)))

    def repeat(self, count: int | None = None) -> Dataset:
        """Repeats the dataset `count` times (forever when None or -1), reshuffling each time.

        After `repeat()` the cardinality is infinite and batches may straddle epochs, as in
        tf.data; use `batch(...).repeat()` to keep epochs apart. An empty dataset repeated
        is empty, as in tf.data.
        """
        if count is None or count == -1:
            if self._streaming:
                return self._then(stream_combine.StreamRepeat(self._node, None))
            return self._then(index_ops.Repeat(self._node, None))
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
            raise ValueError(f"count must be None, -1 or >= 0, got {count!r}; e.g. repeat(2).")
        if self._streaming:
            return self._then(stream_combine.StreamRepeat(self._node, int(count)))
        return self._then(index_ops.Repeat(self._node, int(count)))

    def batch(
        self,
        batch_size: int,
        drop_remainder: bool = False,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> Dataset:
        """Groups consecutive elements into batches of `batch_size` rows.

        Args:
          batch_size: rows per batch (the global batch, when distributed).
          drop_remainder: drop a last, shorter batch instead of yielding it.
          num_parallel_calls, deterministic: accepted for tf.data's sake; a batch is one
            gather per array (or, after a streaming op, a stack), made in order.

        Batching a batched dataset nests, as in tf.data: `batch(2).batch(3)` yields arrays of
        shape (3, 2, ...); every inner batch of an outer one must then be full (use
        `drop_remainder=True` on the inner batch when the row count is not a multiple).
        Fewer elements than `batch_size` with `drop_remainder=True` yield no batch, as in
        tf.data (`fit` and `evaluate` refuse a dataset with no batch, with a clear error).

        Raises:
          ValueError: batch_size <= 0.
        """
        del num_parallel_calls, deterministic
        size = validation.check_batch_size(batch_size)
        if self._streaming:
            return self._then(StreamBatch(self._node, size, bool(drop_remainder)))
        return self._then(index_ops.Batch(self._node, size, bool(drop_remainder)))

    def shard(self, num_shards: int, index: int) -> Dataset:
        """Every `num_shards`-th element starting at `index`, as tf.data's shard.

        Sharding before `batch` changes what each global batch holds when the shard count
        changes; to split global batches across processes use `process_split` instead.
        """
        num_shards = validation.check_positive(num_shards, "num_shards", "shard(2, 0)")
        if not 0 <= index < num_shards:
            raise ValueError(
                f"index must be in [0, {num_shards}), got {index}; e.g. shard({num_shards}, 0)."
            )
        if self._streaming:
            return self._then(stream.StreamShard(self._node, num_shards, int(index)))
        return self._then(index_ops.Shard(self._node, num_shards, int(index)))

    def take(self, count: int) -> Dataset:
        """The first `count` elements of each epoch (all of them when -1)."""
        if count == -1:
            return self
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
            raise ValueError(f"count must be >= 0 or -1, got {count!r}; e.g. take(10).")
        if self._streaming:
            return self._then(stream.StreamTake(self._node, int(count)))
        return self._then(index_ops.Take(self._node, int(count)))

    # -- properties -------------------------------------------------------------------------

    @property
    def cardinality(self) -> float:
        """Elements (batches, once batched) per epoch; `math.inf` after `repeat()`.

        Where only iterating tells (after filter, from_generator, flat_map, ...) it is
        tf.data's UNKNOWN_CARDINALITY, -2; streaming ops that keep or compute their input's
        count (map, batch, take, window, ...) keep it known, with tf.data's rules, and
        `experimental.assert_cardinality` states it.
        """
        n = self._node.cardinality
        return UNKNOWN_CARDINALITY if n is None else n

    def __len__(self) -> int:
        n = self._node.cardinality
        if n is None:
            raise TypeError("the dataset's length is unknown (filter, from_generator, ...).")
        if n == math.inf:
            raise TypeError("the dataset is infinite (repeat()); use .cardinality instead.")
        return int(n)

    @property
    def num_workers(self) -> int:
        """The most workers any map asked for (AUTOTUNE: the most it may try)."""
        counts = [n.workers for n in plan.chain(self._node) if isinstance(n, element_ops.Map)]
        return max((executors.cpu_count() if c == AUTOTUNE else c for c in counts), default=0)

    def __repr__(self) -> str:
        ops = " -> ".join(type(n).__name__ for n in plan.chain(self._node))
        return f"Dataset({ops}, cardinality={self.cardinality})"

    def row_indices(self) -> tuple[Dataset, Any] | None:
        """This pipeline over row numbers, and its source arrays; None if it computes rows.

        When every operation is index arithmetic (shuffle, repeat, shard, take, batch,
        process_split: no `map` or `cache`), element i of the view holds the *numbers* of
        the source rows that element i of this dataset holds (int32), so a training loop
        can keep the arrays on the devices and gather there, sending only indices per
        step. The view shares this dataset's epochs and seeds: iterating either advances
        both, and their iterator states are interchangeable.

        Returns:
          `(view, arrays)`: the index dataset and the source arrays in the element structure
          (e.g. `(x, y)`), or None.

        Example:
          >>> view, (x_all, y_all) = ds.row_indices()
          >>> idx = next(iter(view))           # e.g. 1024 row numbers
          >>> x_all[idx]                       # == the first batch of iter(ds)
        """
        source = self._index_source()
        if source is None:
            return None  # a node computes elements (map, cache, enumerate, zip, filter, ...)
        rows = np.arange(source.length, dtype=np.int32)
        index_source = plan.Source([rows], plan.Source.single_leaf())

        def change(node: plan.Node) -> plan.Node:
            return index_source if isinstance(node, plan.Source) else node

        # No threads: computing row numbers costs less than handing them over.
        view = Dataset(plan.rebuild(self._node, change), 0, self._options)
        view._owner = self
        return view, source.treedef.unflatten(source.leaves)

    def _index_source(self) -> plan.Source | None:
        """The in-memory source when every op is index arithmetic (see `row_indices`)."""
        nodes = plan.chain(self._node)
        if not all(isinstance(n, _INDEX_VIEW_NODES) for n in nodes):
            return None
        return nodes[0]

    def _check_device_ready(self, where: str) -> None:
        """Refuses now, before anything is traced, an index pipeline over arrays that hold
        strings or objects (`device_batch.check_device_batch`); a pipeline that computes its
        elements (map, ...) is checked batch by batch where its batches reach the devices."""
        source = self._index_source()
        if source is not None:
            device_batch.check_device_batch(source.treedef.unflatten(source.leaves), where)

    # -- iteration --------------------------------------------------------------------------

    def __iter__(self) -> DatasetIterator:
        if self._owner is not None:
            return DatasetIterator(self, next(self._owner._epochs))
        return DatasetIterator(self, next(self._epochs))

    def _continue_after(self, epoch: int) -> None:
        """Makes the next `iter(self)` walk epoch `epoch + 1` (used when restoring a state)."""
        self._epochs = itertools.count(epoch + 1)
        if self._owner is not None:
            self._owner._continue_after(epoch)

    def _reseed(self, new_seeds: list[int]) -> None:
        if new_seeds != index_ops.seeds(self._node):
            self._node = index_ops.with_seeds(self._node, new_seeds)
        if self._owner is not None:
            self._owner._reseed(new_seeds)
