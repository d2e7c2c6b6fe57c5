"""`Blocks`: device-resident data read in order, placed once, indexed inside the calls.

Data batched without a shuffle reads consecutive rows: each batch is `B` rows `[s, s + B)`
of the data read round and round (mod `N`, its length), or the partial last batch
`[S*B, N)` (`S = N // B` whole batches). Training calls take such batches from data placed
once per `fit` (issue 35) and read inside the compiled call at a cursor the call advances
(issue 43): nothing is assembled or cut per call, and nothing crosses from the host after
the first placement, whatever the epochs' lengths. A batch's position is one of:

- a *block*: batch `j < S` (rows `[j*B, (j+1)*B)`), or the padded last batch `j = S`. The
  blocks are split over the replicas as a hand-written loop places its data, as one
  `(P, B, ...)` array per leaf for a scan (`P = S`, plus the padded last batch at `S`):
  step by step the call reads `body[c]` and advances `c` mod `P` (the fastest scan a JAX
  user writes: whole data resident, dynamic index). Single-step calls (K = 1, and a convnet
  on XLA:CPU, see `execution`) take one `(B, ...)` array per batch as their argument
  instead: reading `body[c]` copies the batch, ~5 % of the MLP's step on XLA:CPU.
- a *window*: `B` consecutive rows mod `N` that are not a block (`repeat().batch()` over
  `N % B != 0` rows reads them after its first pass). A window takes rows from every
  replica's share, so windows are gathered from the data replicated on every device, at a
  row cursor each step advances by `B` mod `N`. Before the first epoch, one pass of row
  numbers is read ahead (`look_ahead`, the iterator put back): when windows come, every
  batch is read as a window from the first, so one layout and one compiled program serve
  the run. When blocks were placed before windows came (an iterator that cannot be read
  ahead), the replicated copy is assembled from them on the devices (`Source.assemble`):
  the host's rows cross once.

A layout changes on the devices when the calls change shape (`steps_per_execution='auto'`
times single calls, then scans: `trial`), never by placing the data again.

The padded last batch is padded as the host pipeline pads it (a pad repeats a real row)
and comes with its mask, so the numbers are the host pipeline's. One process only
(`BatchDistributor.is_full` is False otherwise), and only when a full batch fills every
slot (the global batch splits evenly over the replicas).

Example:
  >>> blocks = Blocks(source, strategy)
  >>> blocks.positions([np.arange(1024, 2048)], rows=1024)   # (BLOCK, [1])
  >>> body, masks = blocks.body(1024, record)                 # (P, 1024, ...) per leaf
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from phalanx._src.strategy.strategy import Strategy
from phalanx._src.train.engine.execution import BLOCK, WINDOW
from phalanx._src.train.engine.transfers import Door
from phalanx._src.train.feeding import layouts

LOOK_AHEAD = 100_000  # batches read ahead at most, to see whether windows come


class Blocks:
    """The source's in-order batches on the devices; see the module docstring.

    Args:
      source: the `device_data.Source` whose rows the batches hold.
      strategy: whose devices hold them.
    """

    def __init__(self, source: Any, strategy: Strategy) -> None:
        self._source = source
        self._length = int(jax.tree.leaves(source.spec)[0].shape[0])  # N
        self._strategy = strategy
        data = strategy.data_sharding
        self._data = data
        self._stacked = NamedSharding(data.mesh, PartitionSpec(None, *data.spec))
        self._rows: int | None = None  # B, once placed
        self._layout: dict[str, Any] = {}  # "body", "masks", "batches", "tail_mask"
        self._cursors: dict[str, tuple[int, jax.Array]] = {}  # kind: (position, on device)
        self._ahead: tuple[int, bool] | None = None  # (rows, whether windows come)

    @property
    def rows(self) -> int | None:
        """The rows of a batch, once blocks are placed (None before)."""
        return self._rows

    def padded(self, rows: int) -> bool:
        """Whether batches of `rows` rows end with a padded partial batch (block `P - 1`)."""
        return self._length % rows > 0

    def period(self, kind: str, rows: int) -> int:
        """Positions before a cursor of `kind` comes back: `P` blocks, or `N` rows."""
        whole, tail = divmod(self._length, rows)
        return whole + (tail > 0) if kind == BLOCK else self._length

    # ---- where batches are -------------------------------------------------------------------
    def look_ahead(self, iterator: Any) -> None:
        """Reads the row numbers of one pass over the data ahead, to tell whether windows
        will come (then every full batch is read as a window from the first: one layout and
        one compiled program, where blocks first would compile a second for the windows once
        the first pass ends); once per batch size. The iterator is put back where it was
        (`get_state` / `set_state`); one without them, or data over `LOOK_AHEAD` batches,
        is not read ahead (blocks first, then windows, as they come). A partial batch among
        batches read as windows turns the windows off (another pipeline over the same
        placed data: `reuse`)."""
        if not all(hasattr(iterator, a) for a in ("get_state", "set_state", "next_many")):
            return
        state = iterator.get_state()
        try:
            first = iterator.next_many(1)
            rows = int(np.size(first[0])) if first else 0
            if not rows or (self._ahead is not None and self._ahead[0] == rows):
                return
            self._ahead = (rows, False)
            if self._positions(first, rows, False) is None:
                return  # shuffled, or not row numbers in order: nothing to look for
            if self._length // rows + 1 > LOOK_AHEAD:
                return
            ahead = first + iterator.next_many(self._length // rows + 1)
            found = [self._positions([b], rows, False) for b in ahead]
            self._ahead = (rows, any(f is not None and f[0] == WINDOW for f in found))
        finally:
            iterator.set_state(state)

    def positions(self, batches: list[Any], rows: int) -> tuple[str, list[int]] | None:
        """`(BLOCK, batch numbers)` or `(WINDOW, first rows)` when `batches` (row numbers)
        are consecutive in order, each a block or each a full window; else None. Full
        batches are windows when windows come (`look_ahead`)."""
        if self._ahead == (rows, True):
            found = self._positions(batches, rows, True)
            if found is not None or all(np.size(b) == rows for b in batches):
                return found
            self._ahead = (rows, False)  # a partial batch: this pipeline reads blocks
        return self._positions(batches, rows, False)

    def _positions(
        self, batches: list[Any], rows: int, windows: bool
    ) -> tuple[str, list[int]] | None:
        n = self._length
        if n < rows or not batches:
            return None
        whole, tail = divmod(n, rows)
        spans = [_span(np.asarray(b), n, rows, whole * rows) for b in batches]
        if any(s is None for s in spans):
            return None
        if not windows and all(s % rows == 0 and (s + size <= n) for s, size in spans):
            index = [s // rows for s, _ in spans]
            if _consecutive(index, 1, whole + (tail > 0)):
                return BLOCK, index
        if all(size == rows for _, size in spans):
            starts = [s for s, _ in spans]
            if _consecutive(starts, rows, n):
                return WINDOW, starts
        return None

    # ---- the placed data -----------------------------------------------------------------------
    def body(self, rows: int, record: Door | None) -> tuple[Any, jax.Array | None]:
        """`(body, masks)`: every block as one `(P, rows, ...)` array per leaf, and the
        `(P, rows)` masks (None without a partial last batch); placed on the first call."""
        self._place(rows, True, record)
        return self._layout["body"], self._layout.get("masks")

    def batch(self, j: int, rows: int, record: Door | None) -> tuple[Any, jax.Array | None]:
        """Block `j` as a `(rows, ...)` array per leaf, with its mask (None unless it is the
        padded last batch); the blocks are placed on the first call."""
        self._place(rows, False, record)
        batches = self._layout["batches"]
        return batches[j], (self._layout.get("tail_mask") if j == len(batches) - 1 else None)

    def flat(self, record: Door | None) -> Any:
        """The source replicated on every device (for windows): assembled from the blocks
        on the devices when they are there, else placed from the host (`record`ed)."""
        return self._source.arrays(record)

    def _place(self, rows: int, stacked: bool, record: Door | None) -> None:
        """Lays the blocks out for batches of `rows` rows (a body for scans, else one array
        per batch), unless they already are."""
        have, other = ("body", "batches") if stacked else ("batches", "body")
        if self._rows == rows and have in self._layout:
            return
        if self._rows == rows and other in self._layout:  # the other shape: restacked there
            made = self._layout
            made[have] = layouts.restack(stacked, self._stacked if stacked else self._data)(
                made.pop(other)
            )
            mask = made.pop("tail_mask" if stacked else "masks", None)
            if mask is not None:
                count = self.period(BLOCK, rows)
                on = self._stacked if stacked else self._data
                made["masks" if stacked else "tail_mask"] = layouts.restack_masks(
                    stacked, count, on
                )(mask)
            return
        host = self._source.host
        if host is None:  # replicated for gathers (or from these blocks): cut from there
            host = self._source.arrays()
        self._layout = {}  # (another batch size: its device memory first)
        self._cursors = {}
        self._rows = rows
        with record or contextlib.nullcontext():  # (the ledger's door: see `Door`)
            made = layouts.lay_out(host, rows, self._length, stacked, self._data, self._stacked)
        self._layout = made["layout"]
        if record is not None and made["crossed"]:
            record(made["crossed"])
        # Windows and gathers read the data replicated: assembled from these blocks.
        self._source.assemble = self._replicated

    def _replicated(self) -> Any:
        made = self._layout
        parts = made["body"] if "body" in made else made["batches"]
        tail = self._length % self._rows
        flatten = layouts.flatten(self._strategy.replicated_sharding, tail, "body" in made)
        return flatten(parts)

    # ---- the device cursors ------------------------------------------------------------------
    def cursor(self, kind: str, position: int, record: Door | None) -> jax.Array:
        """A device cursor at `position` (a batch number or a first row): the one the last
        call returned when it is there, made on the devices from the other kind's when it
        points at the same rows (a block's first row is a window's start), else placed
        (a scalar, `record`ed: the position jumped, e.g. a new `fit` call)."""
        at = self._cursors.get(kind)
        if at is not None and at[0] == position:
            return at[1]
        rows = self._rows
        other = self._cursors.get(WINDOW if kind == BLOCK else BLOCK)
        if other is not None and rows is not None:
            seen, cursor = other
            if (kind == WINDOW and position == seen * rows) or (
                kind == BLOCK and seen == position * rows
            ):
                return layouts.convert(self._strategy.replicated_sharding, rows, kind)(cursor)
        with record or contextlib.nullcontext():
            cursor = jax.device_put(np.int32(position), self._strategy.replicated_sharding)
        return cursor if record is None else record(cursor)

    def moved(self, kind: str, position: int, cursor: jax.Array) -> None:
        """Notes the cursor a call returned, at `position`."""
        self._cursors[kind] = (position, cursor)


def _span(batch: np.ndarray, n: int, rows: int, cut: int) -> tuple[int, int] | None:
    """`(first row, size)` of a batch of consecutive rows mod `n`: `rows` of them, or the
    partial last batch `[cut, n)`; else None."""
    if batch.ndim != 1 or not batch.size:
        return None
    start, size = int(batch[0]), int(batch.size)
    if size != rows and (start != cut or size != n - cut):
        return None
    if not 0 <= start < n:
        return None
    expect = np.arange(start, start + size, dtype=np.int64)
    if start + size > n:
        expect %= n
    return (start, size) if np.array_equal(batch, expect) else None


def _consecutive(values: list[int], step: int, period: int) -> bool:
    return all((a + step) % period == b for a, b in itertools.pairwise(values))
