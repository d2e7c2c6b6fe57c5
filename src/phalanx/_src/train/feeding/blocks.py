"""`Blocks`: in-order batches of device-resident data, placed once and taken whole.

Data batched in order without a shuffle reads rows `[j*B, (j+1)*B)` as batch j. Such
batches go to the training step as blocks of their own, as a hand-written loop passes its
batch i, instead of being gathered from a replicated source by row number (the gather
copies every batch once more in each step, 4-5 % of the MLP's step on XLA:CPU, issue 9).

The data crosses to the devices once per `fit` (issue 35). On the first lookup, the
source arrays go over as a hand-written loop places them: one data-sharded array per
batch, or per K consecutive batches from the first when the calls scan K steps (a
`(K, B, ...)` block the scan takes as its `xs`), each a view of the caller's rows (no host
copy); and the partial last batch, if any, as one `(B, ...)` block padded as the host
pipeline pads it, with its mask. Calls that read those blocks take them as they are: one
copy of the data on the devices, as the loop's. Any other in-order call (K batches across
the data's end, when an epoch of `steps_per_epoch` batches starts mid-data, or single
batches of a K-block) is cut on the devices from the whole data, which is assembled there
from the placed blocks the first time one is needed (and replaces them): nothing crosses
from the host again. Cut blocks are kept while they take no more device memory than one
more copy of the source, and cut again each time after that: at most twice the data on
the devices, as the replicated source and the blocks of the layout before took on one.

One process only (`BatchDistributor.is_full` is False otherwise), and only when a full
batch fills every slot (the global batch splits evenly over the replicas).

Example:
  >>> blocks = Blocks(source, strategy)
  >>> blocks.lookup([np.arange(1024, 2048)], rows=1024)  # [(block 1's (x, y), None)]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from phalanx._src.strategy import layout
from phalanx._src.strategy.strategy import Strategy

Record = Callable[[Any], Any]


class _Layout:
    """The source on the devices for batches of `rows` rows: `placed` (blocks put from the
    host, by key: `(-1, j)` batch j, `(j, ..., j+K-1)` K of them), the padded last batch
    `tail` with its `mask` (None when S*B == length), and `body()`, every whole batch as
    one `(S, B, ...)` array, assembled on the devices when first needed."""

    def __init__(self, host: Any, rows: int, length: int, k: int | None, strategy: Strategy):
        data = strategy.data_sharding
        self._stacked = NamedSharding(data.mesh, PartitionSpec(None, *data.spec))
        self.rows = rows
        self.whole = length // rows  # S
        groups = self.whole // k if k else 0

        # From the host arrays (views: no host copy), or cut on the devices from the
        # source already placed there (shuffled epochs before): nothing crosses then.
        self.from_host = not isinstance(jax.tree.leaves(host)[0], jax.Array)

        def put(first: int, count: int, sharding: NamedSharding, stack: bool) -> Any:
            def one(a: Any) -> jax.Array:
                view = a[first * rows : (first + count) * rows]
                if stack:
                    view = view.reshape(count, rows, *view.shape[1:])
                return jax.device_put(view, sharding)

            return jax.tree.map(one, host)

        self.placed: dict[tuple[int, ...], Any] = {}
        for g in range(groups):
            key = tuple(range(g * k, (g + 1) * k))
            self.placed[key] = put(g * k, k, self._stacked, True)
        for j in range(groups * k if k else 0, self.whole):
            self.placed[(-1, j)] = put(j, 1, data, False)
        self.tail = self.mask = None
        cut = self.whole * rows
        if length > cut:
            # The host pipeline's padding (a pad repeats a real row), so the numbers match.
            index, mask = layout.padded_index(length - cut, 1, rows)
            take = np.take if self.from_host else jnp.take
            self.tail = jax.tree.map(
                lambda a: jax.device_put(take(a[cut:], index, axis=0), data), host
            )
            self.mask = jax.device_put(mask, data)
        self._body: Any = None
        self._masks: dict[tuple[int, int], jax.Array] = {}

    def crossed(self) -> list[Any]:
        """What was put from the host (for the ledger)."""
        blocks = [*self.placed.values(), self.tail] if self.from_host else []
        return [t for t in (*blocks, self.mask) if t is not None]

    def body(self) -> Any:
        """The whole batches as one `(S, B, ...)` array per leaf, assembled on the devices
        from the placed blocks (in batch order) the first time it is asked for."""
        if self._body is None:
            keys = sorted(self.placed, key=lambda key: key[-1])
            grouped = tuple(key[0] != -1 for key in keys)
            self._body = _assemble(self._stacked, grouped)([self.placed[key] for key in keys])
            # The body holds the same rows: the placed blocks go (their calls cut them from
            # it like any other), so the data is on the devices once, plus the cut blocks.
            self.placed.clear()
        return self._body

    def group_mask(self, k: int, at: int, record: Record | None) -> jax.Array:
        """The `(k, rows)` mask of a group whose batch `at` is the partial last one."""
        key = (k, at)
        mask = self._masks.get(key)
        if mask is None:
            host = np.ones((k, self.rows), dtype=bool)
            host[at] = np.asarray(self.mask)  # (one small read of the placed mask)
            mask = self._masks[key] = jax.device_put(host, self._stacked)
            if record is not None:
                record(mask)
        return mask


class Blocks:
    """The source's in-order batches as device blocks; see the module docstring.

    Args:
      source: the `device_data.Source` whose host arrays the blocks hold.
      strategy: whose devices hold them.
    """

    def __init__(self, source: Any, strategy: Strategy) -> None:
        self._source = source
        leaves = jax.tree.leaves(source.spec)
        self._length = int(leaves[0].shape[0])
        self._bytes_per_row = sum(a.dtype.itemsize * a.size for a in leaves) // max(self._length, 1)
        self._budget = self._bytes_per_row * self._length  # one more copy of the source at most
        self._made: dict[tuple[int, ...], Any] = {}
        self._strategy = strategy
        self._layout: _Layout | None = None

    @property
    def rows(self) -> int | None:
        """The rows of a batch, once the data is placed (None before)."""
        return None if self._layout is None else self._layout.rows

    def _index(self, batch: Any, rows: int) -> int | None:
        """Batch j when `batch` holds rows `[j*rows, (j+1)*rows)`, or the partial last
        batch's rows; else None."""
        batch = np.asarray(batch)
        if batch.ndim != 1 or not batch.size:
            return None
        start, size = int(batch[0]), int(batch.size)
        if start % rows or start + size > self._length:
            return None
        if size != rows and (size > rows or start + size != self._length):
            return None
        if int(batch[-1]) != start + size - 1 or not np.array_equal(
            batch, np.arange(start, start + size, dtype=batch.dtype)
        ):
            return None
        return start // rows

    def lookup(
        self, batches: list[Any], rows: int, k: int | None = None, record: Record | None = None
    ) -> list[tuple[Any, jax.Array | None]] | None:
        """The calls' `(block, mask)` inputs for `batches` (row numbers), or None when any
        batch is not a block in order.

        `k=None`: one `(rows, ...)` block per batch. `k`: one `(k, rows, ...)` block per k
        consecutive batches. The mask is None, or the partial last batch's. `record` (the
        ledger's) is given what crosses from the host: the layout, on the first call.
        """
        n = len(batches)
        if not n or rows <= 0 or (k is not None and n % k):
            return None
        index = [self._index(b, rows) for b in batches]
        if any(j is None for j in index):
            return None
        placed = self._placed(rows, k, record)
        if placed is None:
            return None
        if k is None:
            return [(self._block((j,)), placed.mask if j == placed.whole else None) for j in index]
        out = []
        for at in range(0, n, k):
            group = tuple(index[at : at + k])
            tail = [i for i, j in enumerate(group) if j == placed.whole]
            mask = placed.group_mask(k, tail[0], record) if tail else None
            out.append((self._block(group, k), mask))
        return out

    def _placed(self, rows: int, k: int | None, record: Record | None) -> _Layout | None:
        made = self._layout
        if made is None or made.rows != rows:  # (another call's batch size: a new layout)
            if self._length < rows:  # no whole batch: the gather serves it
                return None
            self._layout = self._made = None  # (their device memory first)
            host = self._source.host
            if host is None:  # placed for a gather: cut on the devices from there
                host = self._source.arrays()
            made = self._layout = _Layout(host, rows, self._length, k, self._strategy)
            self._made = {}
            self._budget = self._bytes_per_row * self._length
            if record is not None:
                record(made.crossed())
        return made

    def _block(self, group: tuple[int, ...], k: int | None = None) -> Any:
        key = group if k is not None else (-1, *group)
        made = self._layout
        block = made.placed.get(key, self._made.get(key))
        if block is not None:
            return block
        if k is None and group[0] == made.whole:
            return made.tail
        block = _cut(self._strategy.data_sharding, k)(made.body(), made.tail, np.asarray(group))
        size = made.rows * (k or 1) * self._bytes_per_row
        if size <= self._budget:
            self._budget -= size
            self._made[key] = block
        return block


@functools.cache
def _assemble(stacked: NamedSharding, grouped: tuple[bool, ...]) -> Callable:
    """`[block, ...] -> (S, B, ...)`: blocks in batch order, each one batch `(B, ...)` or
    (`grouped`) K of them `(K, B, ...)`, as one array per leaf (compiled once per
    sharding and structure)."""

    def assemble(blocks: list) -> Any:
        def join(*leaves: jax.Array) -> jax.Array:
            parts = [a if g else a[None] for a, g in zip(leaves, grouped, strict=True)]
            return jnp.concatenate(parts, axis=0)

        return jax.tree.map(join, *blocks)

    return jax.jit(assemble, out_shardings=stacked)


@functools.cache
def _cut(data: NamedSharding, k: int | None) -> Callable:
    """`(body, tail, batch numbers) -> block`: the compiled cut, one per sharding and K for
    the process (a later `fit` call does not trace and compile it again). Batch number S
    (one past `body`) is the padded last batch, `tail`."""
    spec = data.spec if k is None else PartitionSpec(None, *data.spec)

    def take(body: Any, tail: Any, group: jax.Array) -> Any:
        def one(b: jax.Array, t: jax.Array | None) -> jax.Array:
            whole = b.shape[0]
            picked = jnp.take(b, jnp.minimum(group, whole - 1), axis=0)
            if t is not None:
                is_tail = (group == whole).reshape(-1, *([1] * (picked.ndim - 1)))
                picked = jnp.where(is_tail, t[None], picked)
            return picked[0] if k is None else picked

        if tail is None:
            return jax.tree.map(lambda b: one(b, None), body)
        return jax.tree.map(one, body, tail)

    return jax.jit(take, out_shardings=NamedSharding(data.mesh, spec))
