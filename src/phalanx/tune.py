"""Tuning helpers: `find_batch_size`, the largest per-replica batch that fits in memory."""

from __future__ import annotations

from phalanx._src.tune.batch_size import BatchSizeResult as BatchSizeResult
from phalanx._src.tune.batch_size import device_memory_bytes as device_memory_bytes
from phalanx._src.tune.batch_size import find_batch_size as find_batch_size

__all__ = [
    "BatchSizeResult",
    "device_memory_bytes",
    "find_batch_size",
]
