"""Distributed values: `PerReplica` results and batches that carry their padding mask.

A distributed batch keeps the container the dataset yielded (a tuple stays a tuple, a dict a
dict, a namedtuple the same namedtuple) but is an instance of a thin subclass whose pytree
children include the validity mask. The mask therefore follows the batch through `jax.jit`
and into `strategy.run`, where it becomes the replica context's mask, so
`compute_average_loss`, `strategy.reduce` and metrics leave padded rows out by themselves.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import jax
import numpy as np


class PerReplica:
    """One value per replica, as returned by `strategy.run` for values that differ by replica.

    The values are stacked along a leading replica axis in one global `jax.Array`
    (`stacked[r]` is replica r's value) sharded over the strategy's data axis. `mask`, when
    present, marks the real rows of a per-example value (padded rows of a partial batch are
    False). The container is the same for 1 replica and for 8.

    Example:
      >>> per_replica = strategy.run(lambda: phalanx.get_replica_context().replica_id_in_sync_group)
      >>> strategy.experimental_local_results(per_replica)  # (0, 1, ..., N-1) as arrays
    """

    __slots__ = ("mask", "stacked")

    def __init__(self, stacked: jax.Array, mask: jax.Array | None = None) -> None:
        self.stacked = stacked
        self.mask = mask

    @property
    def values(self) -> tuple[jax.Array, ...]:
        """The per-replica values, in replica order (tf.distribute's `PerReplica.values`)."""
        return tuple(self.stacked[r] for r in range(self.stacked.shape[0]))

    def local_values(self, first: int, count: int) -> tuple[jax.Array, ...]:
        """Replicas `first .. first + count - 1`'s values, as `experimental_local_results`
        gives them: a per-example value keeps only its real rows, so a replica past the end
        of a partial batch gives an empty (0-row) value, as TF's does."""
        parts = self.values[first : first + count]
        if self.mask is None:
            return parts
        if isinstance(self.mask, jax.core.Tracer):
            raise TypeError(
                "experimental_local_results inside a compiled function (phalanx.function or "
                "jax.jit) cannot drop a partial batch's padded rows: the row counts are only "
                "known when it runs. Return the PerReplica value from the compiled function "
                "and call strategy.experimental_local_results on it outside"
            )
        out = []
        for replica, part in enumerate(parts, start=first):
            keep = np.flatnonzero(_host_row(self.mask, replica))
            out.append(part if keep.size == part.shape[0] else part[keep])
        return tuple(out)

    def __repr__(self) -> str:
        return f"PerReplica(shape={tuple(self.stacked.shape)}, dtype={self.stacked.dtype})"


def _host_row(x: jax.Array, row: int) -> np.ndarray:
    """Row `row` of `x` on the host, read from this process's own shard when `x` spans
    processes (only rows of local replicas are asked for)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x[row])
    for shard in x.addressable_shards:
        rows = shard.index[0] if shard.index else slice(None)
        start = rows.start or 0
        stop = x.shape[0] if rows.stop is None else rows.stop
        if start <= row < stop:
            return np.asarray(shard.data)[row - start]
    raise ValueError(f"row {row} of the mask is not on this process")


jax.tree_util.register_pytree_node(
    PerReplica,
    lambda v: ((v.stacked, v.mask), None),
    lambda _, children: PerReplica(*children),
)


class MaskedBatch:
    """Mixin for containers that carry a padding mask beside their items."""

    _phalanx_mask: Any = None


class MaskedTuple(tuple, MaskedBatch):
    """A tuple batch with its mask."""


class MaskedList(list, MaskedBatch):
    """A list batch with its mask."""


class MaskedDict(dict, MaskedBatch):
    """A dict batch with its mask."""


def _with_mask(container: Any, mask: Any) -> Any:
    container._phalanx_mask = mask
    return container


jax.tree_util.register_pytree_node(
    MaskedTuple,
    lambda t: ((*t, t._phalanx_mask), None),
    lambda _, c: _with_mask(MaskedTuple(c[:-1]), c[-1]),
)
jax.tree_util.register_pytree_node(
    MaskedList,
    lambda t: ((*t, t._phalanx_mask), None),
    lambda _, c: _with_mask(MaskedList(c[:-1]), c[-1]),
)
jax.tree_util.register_pytree_node(
    MaskedDict,
    lambda d: ((*(d[k] for k in sorted(d)), d._phalanx_mask), tuple(sorted(d))),
    lambda keys, c: _with_mask(MaskedDict(zip(keys, c[:-1], strict=True)), c[-1]),
)


@functools.cache
def _masked_namedtuple(cls: type) -> type:
    masked = type(cls.__name__, (cls, MaskedBatch), {"__slots__": ()})
    masked.__qualname__ = cls.__qualname__
    jax.tree_util.register_pytree_node(
        masked,
        lambda t: ((*t, t._phalanx_mask), None),
        lambda _, c: _with_mask(masked(*c[:-1]), c[-1]),
    )
    return masked


def attach_mask(batch: Any, mask: jax.Array) -> Any:
    """Returns `batch` in a same-typed container that carries `mask`.

    A bare array cannot carry anything, so its mask is remembered by identity instead (that
    reaches `strategy.run` and `strategy.reduce` called eagerly, not under your own jax.jit:
    yield a tuple or dict from the dataset when you trace the loop yourself).
    """
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return _with_mask(_masked_namedtuple(type(batch))(*batch), mask)
    if isinstance(batch, tuple):
        return _with_mask(MaskedTuple(batch), mask)
    if isinstance(batch, list):
        return _with_mask(MaskedList(batch), mask)
    if isinstance(batch, dict):
        return _with_mask(MaskedDict(batch), mask)
    return batch


def unmask(batch: Any) -> Any:
    """The plain container of a masked batch (what the user's replica function receives)."""
    if not isinstance(batch, MaskedBatch):
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch).__mro__[1](*batch)
    for plain in (tuple, list, dict):
        if isinstance(batch, plain):
            return plain(batch)
    raise TypeError(f"unexpected masked container {type(batch)}")


class _ArrayTags:
    """Remembers, by identity, what an array is to the strategy (an array cannot carry tags).

    `DISTRIBUTED` maps distributed batch leaves to their masks; `MIRRORED` marks the results
    of `strategy.run` that are identical on every replica, which `reduce` sums once per
    replica as tf.distribute sums a mirrored value's copies.
    """

    def __init__(self) -> None:
        self._tags: dict[int, Any] = {}

    def register(self, array: Any, tag: Any = True) -> None:
        key = id(array)
        self._tags[key] = tag
        # Forget the tag when the array dies, before its id can be reused by another.
        weakref.finalize(array, self._tags.pop, key, None)

    def get(self, array: Any) -> Any:
        return self._tags.get(id(array))

    def mask_of(self, array: Any) -> jax.Array | None:
        return self._tags.get(id(array)) if isinstance(array, jax.Array) else None


DISTRIBUTED = _ArrayTags()
MIRRORED = _ArrayTags()


def find_mask(tree: Any) -> jax.Array | None:
    """The mask of the first distributed batch found in `tree`, or None."""
    found: list[Any] = []

    def visit(node: Any) -> bool:
        if isinstance(node, MaskedBatch):
            found.append(node._phalanx_mask)
            return True
        if not found and (mask := DISTRIBUTED.mask_of(node)) is not None:
            found.append(mask)
        return False

    jax.tree.leaves(tree, is_leaf=visit)
    return found[0] if found else None


def get_batch_mask(batch: Any) -> jax.Array | None:
    """The validity mask of a distributed batch (True for real rows), or None.

    Example:
      >>> batch = next(iter(strategy.experimental_distribute_dataset(ds)))
      >>> phalanx.get_batch_mask(batch)        # all True except padded rows
    """
    return find_mask(batch)


def _distributed_as_per_replica(value: Any, num_replicas: int) -> Any:
    """A distributed batch's leaves as `PerReplica` values (replica r's rows at index r)."""

    def split(leaf: Any, mask: Any) -> Any:
        if not isinstance(leaf, jax.Array) or leaf.ndim == 0:
            return leaf
        stacked = leaf.reshape(num_replicas, leaf.shape[0] // num_replicas, *leaf.shape[1:])
        return PerReplica(stacked, None if mask is None else mask.reshape(num_replicas, -1))

    def visit(node: Any) -> Any:
        if isinstance(node, PerReplica):
            return node
        if isinstance(node, MaskedBatch):
            mask = node._phalanx_mask
            return jax.tree.map(lambda leaf: split(leaf, mask), unmask(node))
        mask = DISTRIBUTED.mask_of(node)
        return split(node, mask) if mask is not None else node

    return jax.tree.map(visit, value, is_leaf=lambda x: isinstance(x, PerReplica | MaskedBatch))


def local_results(value: Any, num_replicas: int, first: int, count: int) -> tuple[Any, ...]:
    """`experimental_local_results`: replicas `first .. first + count - 1`'s parts of `value`
    (`PerReplica` results and distributed batches), one item per replica."""
    value = _distributed_as_per_replica(value, num_replicas)
    is_per_replica = lambda x: isinstance(x, PerReplica)  # noqa: E731
    leaves, treedef = jax.tree.flatten(value, is_leaf=is_per_replica)
    if not any(is_per_replica(x) for x in leaves):
        return (value,)
    per_leaf = [x.local_values(first, count) if is_per_replica(x) else (x,) * count for x in leaves]
    return tuple(jax.tree.unflatten(treedef, parts) for parts in zip(*per_leaf, strict=True))
