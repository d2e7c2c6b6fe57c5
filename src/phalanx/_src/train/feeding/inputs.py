"""What one compiled call takes, besides the state: the three kinds of device input.

A `Runner` makes them from groups of host batches:
- a batch (or K stacked batches) put on the devices, sharded over the data axis, with its
  mask: host data, or row numbers of device-resident data made in the loop;
- `FromTable`: the next calls' entries in a `Table`, the row numbers of ~128 steps sent to
  the devices in one copy, read inside the call at a device-side cursor;
- `Resident`: batches already on the devices as arrays of their own (`blocks.Blocks`),
  taken directly, with no gather (and no mask but the padded last batch's);
- `Cycled`: calls that read device-resident data in order (`blocks.Blocks`) inside the
  compiled call, at a cursor kept on the devices: nothing crosses per call.

Example:
  >>> table = Table(rows, mask, zero_cursor(engine))
  >>> FromTable(table, calls=1, full=True)   # the next call reads its entry of `table`
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine


@dataclasses.dataclass(eq=False)
class Table:
    """The inputs of up to `calls` compiled calls, on the devices at once (see `Runner`)."""

    batch: Any  # (calls, rows) or (calls, K, rows) row numbers
    mask: jax.Array
    zero: jax.Array  # the cursor of the table's first call


@dataclasses.dataclass(frozen=True)
class Resident:
    """Batches already on the devices as arrays of their own (`blocks.Blocks`): the calls
    take them directly, with no gather; `masks[i]` is None for a full batch (or group), or
    the padded last batch's mask."""

    batches: list
    masks: list


@dataclasses.dataclass(frozen=True)
class Cycled:
    """Calls on in-order resident data (`blocks.Blocks`): `kind` (`BLOCK` or `WINDOW`),
    the position of the first batch, `steps` per call (1, or K in one scan), batches of
    `rows` rows, and per call whether its batches are all full (no mask)."""

    kind: str
    start: int
    steps: int
    rows: int
    full: tuple[bool, ...]


@dataclasses.dataclass(frozen=True)
class FromTable:
    """The next `calls` calls of `table` (`full`: its batches have no padding)."""

    table: Table
    calls: int
    full: bool = False


def zero_cursor(engine: Engine) -> jax.Array:
    """A replicated int32 0, made once on the devices (the calls never donate a cursor)."""
    repl = engine.strategy.replicated_sharding
    return engine.memo(
        "zero", lambda: jax.jit(lambda: jnp.zeros((), jnp.int32), out_shardings=repl)()
    )
