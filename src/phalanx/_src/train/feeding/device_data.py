"""In-memory datasets kept on the devices: only row numbers cross from host to device.

For a phalanx Dataset that only rearranges in-memory rows (shuffle, batch, repeat...), the
loop iterates the same pipeline over row *numbers* (`Dataset.row_indices`) and the rows
reach the devices once, in one of two layouts:

- `blocks.Blocks`: batches read in order (no shuffle) are consecutive rows: the data goes
  to the devices once per `fit` as the fastest hand-written loop places it (split over
  the replicas, every batch in one array for a scan), and each call reads its batches
  inside the compiled program at a cursor kept on the devices, in every epoch;
- `Source`: any other batch gathers its rows on the devices from the source arrays,
  replicated on every device (and windows across the data's end, read in order). They
  are placed the first time a call needs them (assembled from the blocks on the devices
  when those are there), so data read only as blocks never has a second copy there.

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

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from phalanx._src.data.dataset import Dataset
from phalanx._src.strategy.strategy import Strategy
from phalanx._src.train.engine.transfers import Door

UNKNOWN_MEMORY_BUDGET = 512 * 2**20


class Source:
    """The in-memory arrays that row-number batches index into: on the host until a
    compiled call first gathers from them (`arrays`), then replicated on every device and
    no longer referenced on the host (`Blocks` then cuts its blocks from them there).

    When `Blocks` already holds every row on the devices, it sets `assemble`: the
    replicated arrays are then made there from its blocks, and nothing crosses again.

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
        self.assemble: Callable[[], Any] | None = None  # set by `Blocks`, see above

    @property
    def placed(self) -> bool:
        """Whether the arrays are on the devices."""
        return self._placed is not None

    def arrays(self, record: Door | None = None) -> Any:
        """The arrays, replicated on every device (placed on the first call, through
        `record`, the ledger's door)."""
        if self._placed is None and self.assemble is not None:
            self._placed = self.assemble()  # from the devices: nothing crosses
            self.host = None
        if self._placed is None:
            repl = self._strategy.replicated_sharding
            with record or contextlib.nullcontext():
                self._placed = jax.tree.map(
                    lambda a: jax.make_array_from_process_local_data(repl, a), self.host
                )
            self.host = None  # not held on to: blocks are then cut from the placed arrays
            if record is not None:
                record(self._placed)
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
