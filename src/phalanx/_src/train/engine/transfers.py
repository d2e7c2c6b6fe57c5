"""The ledger of transfers: the bytes and arrays phalanx moves between host and devices.

On an accelerator a host-to-device copy of the data is a PCIe (or DCN) transfer on the
critical path; on XLA:CPU a device array may share host memory, so timing never shows it
(issue 35). So phalanx counts instead: every place that puts host data on the devices
(device-resident data, the streamed and prefetched batches, their masks and row-number
tables, the metric sums' zeros) and every place that reads results back (logs, predict's
outputs) records what crossed, here.

- Host to device: for each array placed, the bytes of every copy on this process's
  devices (an array replicated on 8 devices crosses 8 times; one sharded over them once).
- Device to host: for each array read, the bytes of one copy of what this process reads.

`fit` reports each epoch's counts in its logs (`History`): `host_to_device_mib`,
`host_to_device_arrays`, `device_to_host_mib` and `device_to_host_arrays`. `Engine`
keeps one `Transfers` for the model's life (`engine.transfers.total`).

phalanx makes its copies to the devices through a `Door` (`ledger.door()`): made inside
`with door:` and recorded by `door(tree)`. Inside it they pass a user's
`jax.transfer_guard_host_to_device` (JAX's guards are per thread), so a guard set around
`fit` raises on any other copy, and only on those: the ledger's record is complete when a
guarded run goes through (issue 43, `tests/train/test_transfers.py`).

Example:
  >>> ledger = Transfers()
  >>> epoch = ledger.begin()                 # later records go to `epoch` and the total
  >>> ledger.placed(jax.device_put(np.zeros(1024, np.float32)))
  >>> epoch.logs()["host_to_device_mib"]
  0.00390625
  >>> with ledger.door() as door:          # a copy that passes a transfer guard, recorded
  ...     door(jax.device_put(np.zeros(4, np.float32)))
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Iterator
from typing import Any

import jax

MIB = 2**20
LOG_NAMES = (
    "host_to_device_mib",
    "host_to_device_arrays",
    "device_to_host_mib",
    "device_to_host_arrays",
)


@dataclasses.dataclass
class Counts:
    """What crossed in one window (an epoch, or the engine's life)."""

    host_to_device_bytes: int = 0
    host_to_device_arrays: int = 0
    device_to_host_bytes: int = 0
    device_to_host_arrays: int = 0

    def logs(self) -> dict[str, float]:
        """The counts under their log names (bytes as MiB)."""
        return {
            "host_to_device_mib": self.host_to_device_bytes / MIB,
            "host_to_device_arrays": float(self.host_to_device_arrays),
            "device_to_host_mib": self.device_to_host_bytes / MIB,
            "device_to_host_arrays": float(self.device_to_host_arrays),
        }


def placed_bytes(array: jax.Array) -> int:
    """Bytes copied from the host to put `array` on this process's devices: one shard's
    bytes per addressable device (so a replicated array counts once per device)."""
    sharding = array.sharding
    shard = sharding.shard_shape(array.shape)
    devices = len(sharding.addressable_devices)
    return math.prod(shard) * array.dtype.itemsize * devices


def read_bytes(array: jax.Array) -> int:
    """Bytes one read of `array` copies to this process: its distinct addressable shards."""
    if array.is_fully_addressable:
        return int(array.nbytes)
    seen = {
        (tuple((s.start, s.stop) for s in shard.index))
        for shard in array.addressable_shards
        if shard.replica_id == 0
    }
    shard = array.sharding.shard_shape(array.shape)
    return len(seen) * math.prod(shard) * array.dtype.itemsize


class Transfers:
    """The ledger: a running total and the current window (see the module docstring).

    Records may come from a prefetch thread: a lock keeps the sums exact. A record may name
    its window (`into`), so a thread's placements count for the epoch that made them even
    when the loop has moved on.
    """

    def __init__(self) -> None:
        self.total = Counts()
        self.current = self.total
        self._lock = threading.Lock()

    def begin(self) -> Counts:
        """Starts a new window; later records without `into` go to it (and the total)."""
        self.current = Counts()
        return self.current

    def end(self) -> None:
        """Ends the window: later records go to the total only."""
        self.current = self.total

    @contextlib.contextmanager
    def charging(self, window: Counts) -> Iterator[Counts]:
        """Records made inside the block without `into` go to `window`."""
        before, self.current = self.current, window
        try:
            yield window
        finally:
            self.current = before

    def _add(self, into: Counts | None, h2d: int, h2d_n: int, d2h: int, d2h_n: int) -> None:
        window = self.current if into is None else into
        with self._lock:
            for counts in (self.total, window) if window is not self.total else (window,):
                counts.host_to_device_bytes += h2d
                counts.host_to_device_arrays += h2d_n
                counts.device_to_host_bytes += d2h
                counts.device_to_host_arrays += d2h_n

    def door(self, into: Counts | None = None) -> Door:
        """phalanx's way to the devices: see `Door`."""
        return Door(self, into)

    def placed(self, tree: Any, into: Counts | None = None) -> Any:
        """Records the `jax.Array` leaves of `tree` as just placed from the host; returns
        `tree`."""
        arrays = [a for a in jax.tree.leaves(tree) if isinstance(a, jax.Array)]
        if arrays:
            self._add(into, sum(placed_bytes(a) for a in arrays), len(arrays), 0, 0)
        return tree

    def placed_pair(
        self, pair: tuple[Any, Any], seen: dict[int, Any], into: Counts | None = None
    ) -> tuple[Any, Any]:
        """Records a `(batch, mask)` just placed by a `BatchDistributor`, whose mask may be
        one it placed before and reuses (all rows real): `seen` (the caller's, by id)
        holds the masks already recorded, so a reused one counts once. Returns `pair`."""
        batch, mask = pair
        self.placed(batch, into)
        if seen.get(id(mask)) is not mask:
            self.placed(mask, into)
            if len(seen) >= 16:  # (held, so their ids stay theirs; only a few are reused)
                seen.clear()
            seen[id(mask)] = mask
        return pair

    def read(self, tree: Any, into: Counts | None = None) -> Any:
        """Records the `jax.Array` leaves of `tree` as read back to the host; returns
        `tree`."""
        arrays = [a for a in jax.tree.leaves(tree) if isinstance(a, jax.Array)]
        if arrays:
            self._add(into, 0, 0, sum(read_bytes(a) for a in arrays), len(arrays))
        return tree


class Door:
    """Where phalanx's own copies from the host cross: made inside `with door:`, they pass a
    user's `jax.transfer_guard_host_to_device` (this thread's), and `door(tree)` records
    them in the ledger (`into` a window, or the current one).

    Example:
      >>> with engine.transfers.door() as door:
      ...     batch = door(jax.device_put(host_batch, sharding))
    """

    def __init__(self, ledger: Transfers, into: Counts | None = None) -> None:
        self._ledger = ledger
        self._into = into
        self._guards: list = []

    def __enter__(self) -> Door:
        guard = jax.transfer_guard_host_to_device("allow")
        guard.__enter__()
        self._guards.append(guard)
        return self

    def __exit__(self, *exc: object) -> None:
        self._guards.pop().__exit__(*exc)

    def __call__(self, tree: Any) -> Any:
        """Records `tree`'s arrays as placed from the host; returns `tree`."""
        return self._ledger.placed(tree, self._into)

    def pair(self, pair: tuple[Any, Any], seen: dict[int, Any]) -> tuple[Any, Any]:
        """`Transfers.placed_pair` into this door's window."""
        return self._ledger.placed_pair(pair, seen, self._into)
