"""Turning process-local host batches into global, padded, masked `jax.Array` batches."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from phalanx._src.strategy import layout, padding
from phalanx._src.strategy.values import DISTRIBUTED, attach_mask

if TYPE_CHECKING:
    from phalanx._src.strategy.base import StrategyLike


class ValueContext:
    """What `experimental_distribute_values_from_function`'s `value_fn` is given, as TF's
    `tf.distribute.experimental.ValueContext`: the replica's index and the replica count."""

    def __init__(self, replica_id: int, num_replicas: int) -> None:
        self.replica_id_in_sync_group = replica_id
        self.num_replicas_in_sync = num_replicas


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What an input function needs to know to build its process's pipeline.

    Passed to the function given to `strategy.distribute_datasets_from_function`, as
    tf.distribute.InputContext is, with TF's numbers: one input pipeline per process, and
    `num_replicas_in_sync` counts the replicas of every process (2 processes x 4 devices:
    2 pipelines, ids 0 and 1, and `get_per_replica_batch_size(64) == 8`).

    Example:
      >>> def dataset_fn(ctx: phalanx.InputContext):
      ...     ds = phalanx.data.Dataset.from_tensor_slices((x, y))
      ...     ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
      ...     return ds.batch(ctx.get_per_replica_batch_size(1024))  # per-replica batches
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def __post_init__(self) -> None:
        if self.num_input_pipelines < 1 or not 0 <= self.input_pipeline_id < (
            self.num_input_pipelines
        ):
            raise ValueError(
                f"input_pipeline_id {self.input_pipeline_id} is not in [0, "
                f"{self.num_input_pipelines}); pipeline ids count from 0"
            )
        if self.num_replicas_in_sync < 1:
            raise ValueError(f"num_replicas_in_sync must be >= 1, got {self.num_replicas_in_sync}")

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """`global_batch_size // num_replicas_in_sync`; raises if it does not divide."""
        if global_batch_size % self.num_replicas_in_sync:
            lower = global_batch_size - global_batch_size % self.num_replicas_in_sync
            raise ValueError(
                f"global batch size {global_batch_size} does not split over "
                f"{self.num_replicas_in_sync} replicas; use a multiple of "
                f"{self.num_replicas_in_sync} (e.g. {lower or self.num_replicas_in_sync} or "
                f"{lower + self.num_replicas_in_sync})"
            )
        return global_batch_size // self.num_replicas_in_sync


def check_batch(batch: Any) -> tuple[list[np.ndarray], Any, int]:
    """Flattens a host batch and checks that it is distributable.

    Returns:
      `(leaves, treedef, rows)`.

    Raises:
      ValueError: for an empty structure, a rank-0 leaf, or leaves whose leading dimensions
        (the batch dimension) disagree.
    """
    leaves, treedef = jax.tree.flatten(batch)
    if not leaves:
        raise ValueError(f"a batch must hold at least one array; got {batch!r}")
    arrays = [np.asarray(leaf) if not isinstance(leaf, jax.Array) else leaf for leaf in leaves]
    if all(a.ndim > 0 for a in arrays) and len({a.shape[0] for a in arrays}) == 1:
        return arrays, treedef, arrays[0].shape[0]  # the per-batch path: no key formatting
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(batch)[0]]
    for path, array in zip(paths, arrays, strict=True):
        if array.ndim == 0:
            raise ValueError(
                f"batch leaf {path or '<root>'} is a scalar ({array!r}); every leaf needs a "
                "leading batch dimension: batch the dataset (dataset.batch(n)) before "
                "distributing it"
            )
    rows = {path: array.shape[0] for path, array in zip(paths, arrays, strict=True)}
    raise ValueError(
        f"batch leaves disagree on the batch dimension: {rows}; every leaf must have the "
        "same number of rows"
    )


def check_dataset(dataset: Any, method: str) -> None:
    """Refuses arrays given where an iterable of batches is expected, as tf.distribute does.

    Iterating a tuple `(x, y)` yields all of x, then all of y; a dict yields its keys; an
    array yields its rows one by one. Each would be distributed as if it were batches.

    Raises:
      ValueError: naming what was received and how to batch it.
    """
    array = np.ndarray | jax.Array
    if isinstance(dataset, array):
        received = f"an array of shape {tuple(np.shape(dataset))} (it would yield one row a step)"
    elif isinstance(dataset, dict):
        received = f"a dict with keys {sorted(map(str, dataset))} (it would yield its keys)"
    elif isinstance(dataset, tuple) and any(isinstance(v, array) for v in dataset):
        shapes = [tuple(np.shape(v)) if isinstance(v, array) else type(v).__name__ for v in dataset]
        received = (
            f"a tuple of {len(dataset)} values {shapes} (it would yield all of the first, "
            "then all of the second, as batches)"
        )
    else:
        return
    raise ValueError(
        f"{method} needs an iterable of batches (a phalanx.data.Dataset, a tf.data or Grain "
        f"dataset, a DataLoader, a list of batches), but got {received}. Batch the arrays "
        "first, e.g. phalanx.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size) "
        "(or tf.data.Dataset.from_tensor_slices((x, y)).batch(...))"
    )


_BARE = jax.tree.structure(0)  # a batch that is one bare array


def _pad(array: Any, index: np.ndarray | None, slots: int) -> Any:
    if index is None:
        return array
    host = np.asarray(array)
    if host.shape[0] == 0:
        return np.zeros((slots, *host.shape[1:]), host.dtype)
    return np.take(host, index, axis=0)


class BatchDistributor:
    """Makes global, data-sharded arrays of process-local batches, padding partial ones.

    The first batch fixes the compiled rows per replica (`ceil(rows / local replicas)`, the
    largest over the processes, or the declared global batch size); later batches may be
    smaller (they are padded and masked) but not larger.

    A partial batch is spread over the replicas as tf.distribute spreads it (each replica
    gets ceil(rows / replicas) rows, in order), which is what `strategy.run` shows each
    replica. With `pad_at_end=True` (the global-view steps of fit / evaluate / predict) the
    real rows come first and the padding after them, whatever the replica count.
    """

    def __init__(
        self,
        strategy: StrategyLike,
        *,
        global_batch_size: int | None = None,
        drop_remainder: bool = False,
        pad_at_end: bool = False,
    ) -> None:
        self.strategy = strategy
        # fit/evaluate/predict see the global batch, never a replica's share: with the real
        # rows first, every row sits where one device would put it, whatever the replica
        # count, so per-row randomness (dropout masks) is the one-device randomness.
        self.pad_at_end = pad_at_end
        self.per_replica: int | None = None
        self._full_mask: jax.Array | None = None  # reused: most batches are full
        self._full: np.ndarray | None = None  # its local rows: all True
        self._slots: int | None = None  # this process's rows per batch; 0: several processes
        if global_batch_size is not None:
            replicas = strategy.num_replicas_in_sync
            if drop_remainder and global_batch_size % replicas:
                lower = global_batch_size - global_batch_size % replicas
                raise ValueError(
                    f"global batch {global_batch_size} does not split over {replicas} replicas "
                    f"and drop_remainder=True asks for exact splits; use a multiple of "
                    f"{replicas} (e.g. {global_batch_size} -> {lower + replicas}) or batch with "
                    "drop_remainder=False to pad"
                )
            self.per_replica = layout.rows_per_replica(global_batch_size, replicas)

    def _local(self, batch: Any) -> tuple[list[Any], np.ndarray, Any]:
        """This process's padded rows of `batch`: (leaves, mask, treedef)."""
        full = self._full
        if isinstance(batch, np.ndarray) and full is not None and batch.shape[:1] == full.shape:
            return [batch], full, _BARE  # a full batch of one array (row numbers): no padding
        leaves, treedef, rows = check_batch(batch)
        local = self.strategy.num_local_replicas
        if self.per_replica is None:
            self.per_replica = self._agree(layout.rows_per_replica(rows, local))
        slots = local * self.per_replica
        if self._full is None:
            self._full = np.ones(slots, dtype=bool)
        if rows == slots:
            return leaves, self._full, treedef
        if self.pad_at_end:
            index, mask = layout.padded_index(rows, 1, slots)
        else:
            index, mask = layout.padded_index(rows, local, self.per_replica)
        return [_pad(leaf, index, slots) for leaf in leaves], mask, treedef

    def fix_rows(self, batch: Any) -> None:
        """Fixes the compiled rows per replica from `batch`, the first one, if not yet fixed."""
        if self.per_replica is None:
            self._local(batch)

    def is_full(self, batch: Any) -> bool:
        """Whether `batch` fills every slot (fixed by the first batch, see `fix_rows`): in one
        process, a step can then be compiled without its mask (every process must agree on
        that, and only one process knows it has no padding)."""
        if self.per_replica is None:
            return False
        if self._slots is None:  # asked once per batch: the count walks the devices
            several = jax.process_count() > 1
            self._slots = 0 if several else self.strategy.num_local_replicas * self.per_replica
        leaf = batch if isinstance(batch, np.ndarray) else jax.tree.leaves(batch)[0]
        return bool(self._slots) and int(np.shape(leaf)[0]) == self._slots

    def _agree(self, per_replica: int) -> int:
        """The largest of every process's `per_replica`, so all build the same global shape.

        Processes may see first batches of different sizes (a dataset smaller than one global
        batch, split 3 | 2); without agreeing, each would compile its own global shape and the
        first collective that depends on it would fail. One small all-reduce, first batch only.
        """
        strategy = self.strategy
        if len({d.process_index for d in strategy.devices}) == 1:
            return per_replica
        mine = np.full(strategy.num_local_replicas, per_replica, dtype=np.int32)
        votes = jax.make_array_from_process_local_data(
            strategy.data_sharding, mine, (strategy.num_replicas_in_sync,)
        )
        return int(jax.jit(jnp.max, out_shardings=strategy.replicated_sharding)(votes))

    def _global(self, local: Any, sharding: Any, leading: tuple[int, ...]) -> jax.Array:
        rows = self.strategy.num_replicas_in_sync * self.per_replica
        shape = (*leading, rows, *np.shape(local)[len(leading) + 1 :])
        if jax.process_count() == 1 and np.shape(local) == shape:
            # The same array, at half the host cost on 8 devices (issue 9: once per step).
            return jax.device_put(local, sharding)
        return jax.make_array_from_process_local_data(sharding, local, shape)

    def arrays(self, batch: Any) -> tuple[Any, jax.Array]:
        """Distributes one process-local host batch: `(global batch, global mask)`."""
        leaves, mask, treedef = self._local(batch)
        sharding = self.strategy.data_sharding
        arrays = [self._global(leaf, sharding, ()) for leaf in leaves]
        return jax.tree.unflatten(treedef, arrays), self._mask(mask, sharding)

    def _mask(self, mask: np.ndarray, sharding: Any) -> jax.Array:
        if not mask.all():
            padded = self._global(mask, sharding, ())
            padding.note(padded, mask)  # for the custom loop's warning (padding.py)
            return padded
        if self._full_mask is None:
            self._full_mask = self._global(mask, sharding, ())
        return self._full_mask

    def __call__(self, batch: Any) -> Any:
        """Distributes one process-local host batch; returns the masked global batch."""
        arrays, mask = self.arrays(batch)
        for array in jax.tree.leaves(arrays):
            DISTRIBUTED.register(array, mask)
        return attach_mask(arrays, mask)

    def stacked(self, batches: list[Any], k: int) -> tuple[Any, jax.Array]:
        """Distributes up to `k` host batches as one `(k, rows, ...)` batch for a scan.

        Missing batches (fewer than `k` left in an epoch) are all padding: the step sees an
        all-False mask and changes nothing.

        Returns:
          `(batch, mask)`: the batch structure of `(k, rows, ...)` global arrays sharded on
          axis 1, and the `(k, rows)` mask.
        """
        if not 1 <= len(batches) <= k:
            raise ValueError(f"stacked() takes 1 to {k} batches, got {len(batches)}")
        leaves, mask, treedef = self._stack_local(batches, k)
        return self._global_tree(leaves, mask, treedef, (k,))

    def table(self, entries: list[list[Any]], k: int | None, length: int) -> tuple[Any, jax.Array]:
        """The inputs of `length` calls as one array per leaf, sent to the devices at once.

        Entry i holds call i's host batches: one batch (`k=None`: a `(rows, ...)` input) or
        up to `k` (a `(k, rows, ...)` input, as `stacked`). Calls past `len(entries)` are all
        padding, so tables of fewer calls keep the shape and nothing recompiles.

        Example:
          >>> batch, mask = distributor.table([[rows0], [rows1]], None, 4)  # (4, rows)

        Returns:
          `(batch, mask)` with a leading `(length,)` axis, sharded on the rows axis.
        """
        if not 1 <= len(entries) <= length:
            raise ValueError(f"table() takes 1 to {length} calls, got {len(entries)}")
        if k is None:
            locals_ = [self._local(entry[0]) for entry in entries]
        else:
            locals_ = [self._stack_local(entry, k) for entry in entries]
        leaves0, _, treedef = locals_[0]
        leaves = [
            _stack_padded([local[0][i] for local in locals_], length) for i in range(len(leaves0))
        ]
        mask = _stack_padded([local[1] for local in locals_], length, fill=False)
        return self._global_tree(leaves, mask, treedef, (length,) if k is None else (length, k))

    def _stack_local(self, batches: list[Any], k: int) -> tuple[list[np.ndarray], np.ndarray, Any]:
        """This process's `(k, slots, ...)` leaves, `(k, slots)` mask and treedef of up to
        `k` batches; missing ones are all padding."""
        locals_ = [self._local(batch) for batch in batches]
        leaves0, _, treedef = locals_[0]
        empty = [np.zeros((0, *np.shape(x)[1:]), np.asarray(x).dtype) for x in leaves0]
        locals_ += [self._local(jax.tree.unflatten(treedef, empty))] * (k - len(batches))
        leaves = [
            np.stack([np.asarray(local[0][i]) for local in locals_]) for i in range(len(leaves0))
        ]
        return leaves, np.stack([local[1] for local in locals_]), treedef

    def _global_tree(
        self, leaves: list[np.ndarray], mask: np.ndarray, treedef: Any, leading: tuple[int, ...]
    ) -> tuple[Any, jax.Array]:
        """Global arrays of local `(*leading, slots, ...)` leaves, sharded on the rows axis."""
        axes = (*([None] * len(leading)), self.strategy.axis_name)
        sharding = NamedSharding(self.strategy.mesh, P(*axes))
        arrays = [self._global(leaf, sharding, leading) for leaf in leaves]
        return jax.tree.unflatten(treedef, arrays), self._global(mask, sharding, leading)


def _stack_padded(parts: list[Any], length: int, fill: Any = 0) -> np.ndarray:
    """`parts` stacked on a new first axis, with `length - len(parts)` filler entries."""
    first = np.asarray(parts[0])
    out = np.full((length, *first.shape), fill, dtype=first.dtype)
    out[: len(parts)] = parts
    return out
