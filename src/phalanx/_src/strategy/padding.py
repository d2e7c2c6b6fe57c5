"""Saying so when a custom-loop step runs on a padded global batch and reads no mask.

When the last global batch does not fill every replica, the short replicas get copies of
a real row so that one compiled shape serves every step, and the batch's mask marks them.
`phalanx.compute_average_loss`, phalanx's and Keras's metrics and phalanx's losses leave
them out by themselves; a step that sums its rows itself counts them (one run reduced
-3.58 where the data sums to -8.36). So the first time a step function runs on a padded
batch without reading the mask in any of those ways, phalanx warns once for that function.
A step that returns only per-row values (a prediction) is silent too: those keep the mask
(`PerReplica`), and `strategy.reduce` / `experimental_local_results` leave the rows out.

The padded row count is noted on the host when the batch is distributed (`note`), so the
check costs nothing on full batches and never waits for the device.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


class PaddedBatchWarning(UserWarning):
    """A custom-loop step ran on a padded global batch without reading its mask.

    Example:
      >>> warnings.simplefilter("error", phalanx.PaddedBatchWarning)  # make it fatal
    """


_PADDED: dict[int, tuple[int, int]] = {}  # id(global mask) -> (padded rows, rows)
_WARNED: set[Any] = set()
_TRACE = threading.local()  # the steps a phalanx.function trace runs without the mask


def note(mask: Any, local: np.ndarray) -> None:
    """Remembers that the global `mask` (of host rows `local`) marks padded rows."""
    padded = int(local.size - np.count_nonzero(local))
    if padded:
        key = id(mask)
        _PADDED[key] = (padded, int(local.size))
        weakref.finalize(mask, _PADDED.pop, key, None)


def padded_rows(mask: Any) -> tuple[int, int] | None:
    """(padded rows, rows) of a distributed batch's mask, or None for a full batch."""
    return None if mask is None else _PADDED.get(id(mask))


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def step_ignores_mask(fn: Callable, mask: Any) -> None:
    """Called by `strategy.run` for a step that read no mask on a masked batch: warns now
    when the batch is concrete and padded, or, while a `phalanx.function` is traced,
    remembers the step for that function to check at each call (`warn_for`)."""
    pending = getattr(_TRACE, "steps", None)
    if pending is not None:
        pending.append(fn)
    warn_for([fn], [mask])


def warn_for(steps: list[Callable], masks: list[Any]) -> None:
    """Warns once per step function of `steps` if any of `masks` marks padded rows."""
    found = next((rows for rows in map(padded_rows, masks) if rows is not None), None)
    if found is None:
        return
    padded, rows = found
    for fn in steps:
        key = getattr(fn, "__code__", fn)
        if key in _WARNED:
            continue
        _WARNED.add(key)
        warnings.warn(
            f"strategy.run({_name(fn)}): {padded} of the {rows} rows of this global batch "
            "are padding (a partial last batch: replicas past the end of the data get "
            "copies of a real row, so that one compiled shape serves every step), and the "
            "step reads no mask, so a sum it makes over its rows counts them. "
            "phalanx.compute_average_loss and metrics (phalanx's and Keras's) leave padded "
            "rows out by themselves; weigh any other per-row value with the mask, "
            "phalanx.get_replica_context().mask (True for real rows), or batch with "
            "drop_remainder=True. (Warned once per step function.)",
            PaddedBatchWarning,
            stacklevel=4,
        )


@contextlib.contextmanager
def collecting() -> Iterator[list[Callable]]:
    """Collects the steps that ignore the mask while a `phalanx.function` is traced."""
    previous = getattr(_TRACE, "steps", None)
    steps: list[Callable] = []
    _TRACE.steps = steps
    try:
        yield steps
    finally:
        _TRACE.steps = previous
