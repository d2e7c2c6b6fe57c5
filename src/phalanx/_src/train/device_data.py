"""In-memory datasets kept on the devices: only row numbers cross from host to device.

For a phalanx Dataset that only rearranges in-memory rows (shuffle, batch, repeat...), the
loop puts the source arrays on every device once and iterates the same pipeline over row
*numbers* (`Dataset.row_indices`); each compiled step gathers its batch on the devices. The
host sends the numbers of many steps in one copy (`execution.Table`) instead of the
batches, and the device never waits for host copies. The batches, their order, the padding
and the iterator state are exactly those of the host pipeline.

Used when the arrays fit: `device_data='auto'` caches up to a quarter of a device's memory
(512 MiB where the memory size is unknown, as on CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from phalanx._src.data.dataset import Dataset
from phalanx._src.strategy.strategy import Strategy

UNKNOWN_MEMORY_BUDGET = 512 * 2**20


@dataclasses.dataclass(frozen=True)
class DeviceData:
    """Source arrays replicated on the devices, and the index pipeline that addresses them."""

    indices: Dataset
    arrays: Any  # the element structure (e.g. (x, y)) of replicated global arrays

    def gather(self, arrays: Any, rows: jax.Array) -> Any:
        """The batch of rows `rows` (any shape), gathered on the devices (inside jit)."""
        return jax.tree.map(lambda a: a[rows], arrays)


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
    placed = jax.tree.map(
        lambda a: jax.make_array_from_process_local_data(strategy.replicated_sharding, a),
        arrays,
    )
    return DeviceData(indices, placed)
