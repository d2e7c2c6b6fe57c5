"""In-memory datasets kept on the devices: only row numbers cross from host to device.

For a phalanx Dataset that only rearranges in-memory rows (shuffle, batch, repeat...), the
loop iterates the same pipeline over row *numbers* (`Dataset.row_indices`) and the rows
reach the devices once, in one of two layouts:

- `Blocks`: batches read in order (no shuffle) are whole blocks of rows, each put on the
  devices as a data-sharded array of its own, as a hand-written loop places its batches:
  one copy of the data over all devices, and no gather in the step;
- `Source`: any other batch gathers its rows on the devices from the source arrays,
  replicated on every device. They are placed the first time a call needs them, so data
  read only as blocks never has a second copy on the devices.

Measured on 8 XLA:CPU devices (the 784-128-10 MLP, 1,024 rows a step, 51,200 rows): blocks
hold 155 MiB; the replicated source 1,236 MiB (8 copies), its step 1.2x as long; a source
sharded over the devices (163 MiB) makes XLA all-gather in each step's gather, 2x the
step (`benchmarks/bench_fit.py --layouts`; docs/architecture.md, "A batch's way").

The host sends the numbers of many steps in one copy (`execution.Table`) instead of the
batches, and the device never waits for host copies. The batches, their order, the padding
and the iterator state are exactly those of the host pipeline.

Used when the arrays fit: `device_data='auto'` caches up to a quarter of a device's memory
(512 MiB where the memory size is unknown, as on CPU).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from phalanx._src.data.dataset import Dataset
from phalanx._src.strategy.strategy import Strategy

UNKNOWN_MEMORY_BUDGET = 512 * 2**20


class Source:
    """The in-memory arrays that row-number batches index into: on the host until a
    compiled call first gathers from them (`arrays`), then replicated on every device and
    no longer referenced on the host.

    Example:
      >>> source = Source((x, y), strategy)
      >>> source.spec                  # shapes and dtypes, for a trace
      >>> source.arrays()              # (x, y) on every device, placed once
    """

    def __init__(self, host: Any, strategy: Strategy) -> None:
        self.host: Any = host  # None once placed
        self.spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), host)
        self._strategy = strategy
        self._placed: Any = None

    @property
    def placed(self) -> bool:
        """Whether the arrays are on the devices."""
        return self._placed is not None

    def arrays(self) -> Any:
        """The arrays, replicated on every device (placed on the first call)."""
        if self._placed is None:
            repl = self._strategy.replicated_sharding
            self._placed = jax.tree.map(
                lambda a: jax.make_array_from_process_local_data(repl, a), self.host
            )
            self.host = None
        return self._placed


@dataclasses.dataclass(frozen=True)
class DeviceData:
    """The source arrays (placed on first use), and the index pipeline that addresses them."""

    indices: Dataset
    arrays: Source


def _budget(strategy: Strategy) -> int:
    me = jax.process_index()  # only this process's devices can report their memory
    device = next((d for d in strategy.devices if d.process_index == me), jax.local_devices()[0])
    stats = getattr(device, "memory_stats", lambda: None)()
    limit = (stats or {}).get("bytes_limit")
    return int(limit) // 4 if limit else UNKNOWN_MEMORY_BUDGET


def prepare(data: Any, strategy: Strategy, mode: bool | str = "auto") -> DeviceData | None:
    """A `DeviceData` for `data` when it qualifies (and `mode` allows), else None.

    Args:
      data: the host pipeline.
      strategy: whose devices receive the arrays.
      mode: 'auto' (when the arrays fit the budget), True (whenever possible), False.
    """
    if mode is False or not isinstance(data, Dataset):
        return None
    view = data.row_indices()
    if view is None:
        return None
    indices, arrays = view
    size = sum(np.asarray(a).nbytes for a in jax.tree.leaves(arrays))
    if mode == "auto" and size > _budget(strategy):
        return None
    return DeviceData(indices, Source(arrays, strategy))


class Blocks:
    """The source arrays cut into whole batches in order, each a data-sharded array of its own.

    Data batched in order without a shuffle reads rows `[j*B, (j+1)*B)` as batch j. Such a
    batch goes to the training step as a block of its own, as a hand-written loop passes its
    batch i, instead of being gathered from the replicated source by its row numbers: the
    gather copies every batch once more on each step (4-5 % of the MLP's step on XLA:CPU,
    issue 9). K consecutive batches of a scanned call make one `(K, B, ...)` block. A block is
    cut on the devices the first time it is read and kept while the `Blocks` lives (one
    `fit`); the blocks never take more device memory than the source itself (past that,
    batches are gathered as before). One process only (`BatchDistributor.is_full` is False
    otherwise).

    A block is put on the devices from the host arrays (cut from the placed source once the
    source is on the devices), so data read only as blocks is on the devices once.

    Example:
      >>> blocks = Blocks(source, strategy)
      >>> blocks.lookup([np.arange(1024, 2048)], rows=1024)  # [block 1's (x, y)]
    """

    def __init__(self, source: Source, strategy: Strategy) -> None:
        self._source = source
        leaves = jax.tree.leaves(source.spec)
        self._length = int(leaves[0].shape[0])
        self._bytes_per_row = sum(a.dtype.itemsize * a.size for a in leaves) // max(self._length, 1)
        self._budget = self._bytes_per_row * self._length  # one more copy of the source at most
        self._made: dict[tuple[int, int, int | None], Any] = {}
        self._data = strategy.data_sharding  # a block's rows split over the replicas

    def lookup(self, batches: list[Any], rows: int, k: int | None = None) -> list[Any] | None:
        """The blocks of `batches` (row numbers, in order), when each is a whole block.

        `k=None`: one `(rows, ...)` block per batch. `k`: one `(k, rows, ...)` block per k
        consecutive batches, which must then be consecutive blocks. None when any batch is
        not a whole block of `rows` rows, or the blocks would outgrow the budget.
        """
        n = len(batches)
        if not n or rows <= 0 or (k is not None and n % k):
            return None
        table = np.stack([np.asarray(b) for b in batches])
        if table.ndim != 2 or table.shape[1] != rows:
            return None
        starts = table[:, 0].astype(np.int64)
        if (starts % rows).any() or starts.max() + rows > self._length:
            return None
        if not np.array_equal(table, starts[:, None] + np.arange(rows, dtype=table.dtype)):
            return None
        if k is not None:
            starts = starts.reshape(-1, k)
            if (np.diff(starts, axis=1) != rows).any():
                return None
            starts = starts[:, 0]
        blocks = [self._block(int(start), rows, k) for start in starts]
        return None if any(b is None for b in blocks) else blocks

    def _block(self, start: int, rows: int, k: int | None) -> Any:
        key = (start, rows, k)
        block = self._made.get(key)
        if block is None:
            size = rows * (k or 1) * self._bytes_per_row
            if size > self._budget:
                return None
            self._budget -= size
            block = self._made[key] = self._cut(start, rows, k)
        return block

    def _cut(self, start: int, rows: int, k: int | None) -> Any:
        host = self._source.host
        if host is None:  # the source is on the devices: cut there
            return _cut(self._data, k)(self._source.arrays(), np.int32(start), rows)
        data = self._data
        sharding = data if k is None else NamedSharding(data.mesh, PartitionSpec(None, *data.spec))

        def put(a: Any) -> jax.Array:
            block = np.asarray(a)[start : start + rows * (k or 1)]
            return jax.device_put(
                block if k is None else block.reshape(k, rows, *block.shape[1:]), sharding
            )

        return jax.tree.map(put, host)


@functools.cache
def _cut(data: NamedSharding, k: int | None) -> Any:
    """`(arrays, start, rows) -> block`: the compiled cut of `Blocks`, one per sharding and
    K for the process (so a later `fit` call does not trace and compile it again)."""
    spec = data.spec if k is None else PartitionSpec(None, *data.spec)

    def take(arrays: Any, start: jax.Array, rows: int) -> Any:
        def one(a: jax.Array) -> jax.Array:
            block = jax.lax.dynamic_slice_in_dim(a, start, rows * (k or 1))
            return block if k is None else block.reshape(k, rows, *a.shape[1:])

        return jax.tree.map(one, arrays)

    return jax.jit(take, static_argnums=2, out_shardings=NamedSharding(data.mesh, spec))
