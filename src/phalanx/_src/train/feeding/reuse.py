"""One placement of device-resident data for several `fit` and `evaluate` calls, when safe.

A call reuses the last call's placement (the replicated `Source`, the `Blocks` layout)
only when its source arrays are the very same NumPy objects and none of them can be
written: its `writeable` flag is off, and so is that of every array it views, down to
memory nothing writes (a buffer that is itself read-only, or memory the array owns). Any
other array may have changed in place since (`x[0] = 1`), and telling would cost a pass
over the data, so it is placed again: a copy costs less than a wrong number. To keep data
on the devices from one call to the next, mark it read-only and keep it so:

    x.flags.writeable = False
    y.flags.writeable = False
    model.fit(x, y, epochs=1)      # places x and y
    model.fit(x, y, epochs=1)      # reuses them
    model.evaluate(x, y)           # and so does evaluate (the gather's copies)

The placement lives until the next call with other data, or `compile`.

Example:
  >>> source, blocks = kept(engine, source)   # the last call's, or fresh ones
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from phalanx._src.train.feeding.blocks import Blocks

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine
    from phalanx._src.train.feeding.device_data import Source


def frozen(array: Any) -> bool:
    """Whether nothing can write `array`'s memory through NumPy without first turning a
    `writeable` flag back on: the array and every array it views are read-only, and the
    memory at the bottom is the array's own or a read-only buffer."""
    at = array
    while isinstance(at, np.ndarray):
        if at.flags.writeable:
            return False
        at = at.base
    if at is None:
        return True
    try:
        return memoryview(at).readonly
    except TypeError:  # not a buffer: nothing tells whether it can change
        return False


def kept(engine: Engine, source: Source | None) -> tuple[Source | None, Blocks | None]:
    """`(source, blocks)` for a call on `source`: the last call's placement when `source`
    holds the same frozen arrays (see the module docstring), else `source` and new blocks
    (kept for the next call when its arrays are frozen)."""
    if source is None:
        return None, None
    leaves = jax.tree.leaves(source.host)
    last = engine.cache.get("resident")
    if last is not None:
        arrays, placed, blocks = last
        same = len(arrays) == len(leaves)
        same = same and all(a is b for a, b in zip(arrays, leaves, strict=True))
        if same and placed.spec == source.spec and all(frozen(a) for a in leaves):
            return placed, blocks
    blocks = Blocks(source, engine.strategy)
    if all(frozen(a) for a in leaves):
        engine.cache["resident"] = (leaves, source, blocks)
    else:
        engine.cache.pop("resident", None)  # (its device memory goes with it)
    return source, blocks
