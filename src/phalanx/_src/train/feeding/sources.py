"""What the loops read: Keras's inputs as host batches, and the choice of device-resident data.

`host_data` turns `fit(x, y, ...)`'s arguments into an iterable of host batches;
`on_devices` keeps an in-memory phalanx Dataset's arrays on the devices when they fit
(`device_data`), so that only row numbers cross from the host.

Example:
  >>> host = host_data(x, y, None, batch_size=1024, shuffle=True, seed=0)
  >>> data, source = on_devices(strategy, host, "auto")   # source: a Source or None
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from phalanx._src.data.adapters import as_batches
from phalanx._src.data.dataset import Dataset
from phalanx._src.data.seeds import default_seed
from phalanx._src.strategy.strategy import Strategy
from phalanx._src.train.feeding import device_data


def host_data(
    x: Any, y: Any, sample_weight: Any, batch_size: int | None, shuffle: bool, seed: int | None
) -> Iterable[Any]:
    """Keras's inputs as an iterable of host batches: arrays (with y, sample_weight) or any
    source `phalanx.data.as_batches` accepts."""
    if x is None:
        raise ValueError("no data: pass x (arrays or a dataset), e.g. model.fit(x_train, y_train)")
    if y is None and sample_weight is not None:
        raise ValueError(
            "sample_weight was given without labels y: the weights would be read as the "
            f"labels (got sample_weight of shape {np.shape(sample_weight)}); pass both, e.g. "
            "model.fit(x, y, sample_weight=w), or a dataset of (x, y, sample_weight) batches"
        )
    data = x if y is None else tuple(v for v in (x, y, sample_weight) if v is not None)
    if shuffle and seed is None:
        seed = default_seed()
    batches = as_batches(data, batch_size, shuffle=shuffle, seed=seed)
    if jax.process_count() > 1 and isinstance(batches, Dataset) and batches.split is None:
        batches = batches.process_split()  # each process reads only its share of a batch
    return batches


def on_devices(strategy: Strategy, data: Iterable[Any], mode: bool | str) -> tuple[Iterable, Any]:
    """`(what to iterate, its `device_data.Source` or None)`; see `device_data`."""
    placed = device_data.prepare(data, strategy, mode)
    return (data, None) if placed is None else (placed.indices, placed.arrays)


def close(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def length(data: Any) -> int | None:
    try:
        n = len(data)
    except TypeError:
        return None
    return n if n < float("inf") else None
