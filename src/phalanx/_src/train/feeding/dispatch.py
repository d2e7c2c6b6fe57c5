"""`Runner`: turns groups of host batches into device inputs and dispatches compiled calls.

The feeders (`feeders`) decide when an input is made; the runner decides what it is (see
`inputs`) and binds it to the phase's compiled call (`engine.execution`), which it runs on
the state the engine holds.

Example:
  >>> runner = Runner(engine, "train", k=1, distributor=BatchDistributor(strategy))
  >>> dispatch = runner.bind(runner.put([host_batch]))
  >>> tick = dispatch()       # one compiled call; the engine holds the new state
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train.engine import execution, flop_rate
from phalanx._src.train.engine.execution import BLOCK
from phalanx._src.train.engine.transfers import Door
from phalanx._src.train.feeding.inputs import Cycled, FromTable, Resident, Table, zero_cursor
from phalanx._src.train.feeding.trial import Trial

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine
    from phalanx._src.train.feeding.blocks import Blocks


class Runner:
    """Turns groups of host batches into device inputs and runs them for one phase.

    Batches of device-resident data are row numbers. They go to the devices as a `Table`,
    `TABLE_STEPS` steps' worth at once, and each compiled call reads its entry at a cursor
    that lives on the devices and comes back advanced: per call, nothing crosses from the
    host (a host-to-device copy per step was half of fit's overhead on an H100, issue 9).
    """

    TABLE_STEPS = 128

    def __init__(
        self,
        engine: Engine,
        phase: str,
        k: int,
        distributor: BatchDistributor,
        source: Any = None,
        blocks: Blocks | None = None,
    ) -> None:
        self.engine = engine
        self.phase = phase
        self.k = k
        self.distributor = distributor
        self.source = source  # the `device_data.Source` the batches index into, or None
        self.blocks = blocks  # the source cut into whole batches in order, for training calls
        self.mode: str | None = None if k > 1 else execution.LOOP
        # What this runner places counts for the ledger's window when it was made (its
        # epoch), even when a prefetch thread places it after the loop moved on.
        self._ledger = engine.transfers
        self.window = engine.transfers.current
        self._masks: dict[int, jax.Array] = {}  # masks recorded: a reused one crosses once
        self._table: Table | None = None
        self._cursor: jax.Array | None = None
        self._fns: dict[tuple, tuple[Any, Callable]] = {}  # (many, cycle): (packing, call)

    def prepare(self, group: list[Any]) -> None:
        """Chooses the mode (SCAN or LOOP) on the phase's first group, once (with
        `steps_per_execution='auto'`, training items follow the engine's `Trial` until it
        has decided); its first batch fixes the compiled rows."""
        self.distributor.fix_rows(group[0])
        trial = self._trial(group)
        if trial is not None:
            self.mode = trial.mode()
            return
        if self.mode is None:
            self.mode = self._rule(group)

    def _rule(self, group: list[Any]) -> str:
        """The mode the model's forward pass allows (`execution.choose_mode`, cached)."""
        mode = self.engine.cache.get("mode")
        if mode is None:
            batch, mask = self._placed(self.distributor.arrays, group[0])
            spec = None if self.source is None else self.source.spec
            mode = execution.choose_mode(self.engine, spec, batch, mask)
        return mode

    def _trial(self, group: list[Any]) -> Trial | None:
        """The engine's `Trial` when `auto` measures these training calls' mode, else None
        (K = 1, another phase, a set K, or a model the forward pass keeps off the scan)."""
        engine = self.engine
        if self.phase != "train" or self.k == 1 or engine.steps_per_execution != "auto":
            return None
        trial = engine.cache.get("trial")
        if trial is None and self._rule(group) == execution.SCAN:
            trial = engine.cache["trial"] = Trial()
        return trial

    def _note(self, items: list[tuple[str, Any, int]]) -> list[tuple[str, Any, int]]:
        """Counts the items made for the engine's `Trial`, if one runs."""
        trial = self.engine.cache.get("trial") if self.phase == "train" else None
        if trial is not None:
            for mode, _, _ in items:
                trial.note_made(mode, 1)
        return items

    def put(self, group: list[Any]) -> tuple[str, Any, int]:
        """Device input for a group of up to K host batches (runs in the consumer thread)."""
        return self._note([self._put(group)])[0]

    def _put(self, group: list[Any]) -> tuple[str, Any, int]:
        self.prepare(group)
        if self._scans(group):
            batch, mask = self._placed(self.distributor.stacked, group, self.k)
            return execution.SCAN, (batch, None if self._full([group]) else mask), len(group)
        calls = [self._placed(self.distributor.arrays, b) for b in group]
        if (
            self.mode == execution.LOOP
        ):  # (a short group of a scan keeps its masks: one compilation)
            full = [self._full([[b]]) for b in group]
            calls = [(b, None if f else m) for (b, m), f in zip(calls, full, strict=True)]
        return execution.LOOP, calls, len(group)

    def _recorder(self) -> Door:
        """The way across for what the source or blocks place, recorded in this runner's
        ledger window."""
        return self._ledger.door(self.window)

    def _placed(self, place: Callable[..., tuple[Any, jax.Array]], *args: Any) -> tuple:
        """A `(batch, mask)` the distributor places (`place(*args)`), through the ledger's
        door (a reused mask is recorded once)."""
        with self._recorder() as door:
            return door.pair(place(*args), self._masks)

    def _full(self, groups: list[list[Any]]) -> bool:
        """Whether training may drop the mask of these batches' calls (`Steps.train`)."""
        return self.phase == "train" and all(
            self.distributor.is_full(b) for group in groups for b in group
        )

    def _scans(self, group: list[Any]) -> bool:
        """Whether `group` runs as one scan. A short group (the end of an epoch) would need
        filler steps; evaluation's add nothing, but an optimizer step always moves (Adam's
        moments decay), and skipping it costs a conditional that an accelerator resolves on
        the host, every step (3x slower scans on an H100). So training runs it as single
        steps."""
        return self.mode == execution.SCAN and (len(group) == self.k or self.phase != "train")

    def table_groups(self) -> int:
        """Groups per `Table`: about `TABLE_STEPS` steps."""
        return max(1, self.TABLE_STEPS // self.k)

    def _table_calls(self) -> int:
        return self.table_groups() * (1 if self.mode == execution.SCAN else self.k)

    def put_table(self, groups: list[list[Any]]) -> list[tuple[str, Any, int]]:
        """Items for groups of row-number batches: blocks in order (`Blocks`) where every
        batch is one, else their inputs sent in one `Table`."""
        self.prepare(groups[0])
        many = self.mode == execution.SCAN
        resident = self._resident(groups, many)
        if resident is not None:
            return resident
        tabled = [group for group in groups if self._scans(group) or not many]
        if not tabled:  # one short group: single calls
            return [self._put(groups[0])]
        entries = tabled if many else [[batch] for group in tabled for batch in group]
        batch, mask = self._placed(
            self.distributor.table, entries, self.k if many else None, self._table_calls()
        )
        table = Table(batch, mask, zero_cursor(self.engine))
        items = [
            (
                self.mode,
                FromTable(table, 1 if many else len(group), self._full([group])),
                len(group),
            )
            for group in tabled
        ]
        return items + [self._put(group) for group in groups[len(tabled) :]]

    def fill(self, taken: list[tuple[list[Any], Any]]) -> list[tuple[Any, Any]]:
        """`ResidentFeeder`'s fill: items for groups of row-number batches (one `Table`),
        each with the source's state after its group."""
        groups = [group for group, _ in taken]
        self.prepare(groups[0])  # the mode (scan or single calls) sets the shape
        items = self._note(self.put_table(groups))
        return list(zip(items, [s for _, s in taken], strict=True))

    def _resident(
        self, groups: list[list[Any]], many: bool
    ) -> list[tuple[str, Resident | Cycled, int]] | None:
        """Training calls on in-order resident data (`Blocks`) when every group's batches
        are consecutive blocks or windows, else None: a scanned group is one call of K
        steps read at a device cursor; other groups (a short one, or all of them when the
        calls are single steps) run one step per call, on each block's own array in LOOP
        mode (a convnet on XLA:CPU, K = 1), else at the cursor too."""
        blocks = self.blocks
        if blocks is None or self.phase != "train":
            return None
        # A full batch gives the rows (a fill may start at, or be only, the partial last
        # batch: then the blocks' own rows); with padding in every batch (an uneven split),
        # the table serves.
        is_full = self.distributor.is_full
        full = next((b for group in groups for b in group if is_full(b)), None)
        rows = blocks.rows if full is None else int(np.shape(full)[0])
        if rows is None:
            return None
        scanned = [many and self._scans(group) for group in groups]
        if any(scanned[:-1]) and not all(scanned[:-1]):
            return None  # (only a last group can be short)
        found = [blocks.positions(group, rows) for group in groups]
        if any(f is None for f in found):
            return None
        record = self._recorder()
        padded = blocks.period(BLOCK, rows) - 1 if blocks.padded(rows) else None
        items = []
        for group, scans, (kind, at) in zip(groups, scanned, found, strict=True):
            fulls = tuple(kind != BLOCK or j != padded for j in at)
            if kind == BLOCK and not many:  # single steps on each block's own array
                pairs = [blocks.batch(j, rows, record) for j in at]
                calls = Resident([b for b, _ in pairs], [m for _, m in pairs])
                items.append((execution.LOOP, calls, len(group)))
                continue
            if kind == BLOCK:
                blocks.body(rows, record)  # placed now: it counts for this runner's epoch
            if scans:
                item = Cycled(kind, at[0], self.k, rows, (all(fulls),))
                items.append((execution.SCAN, item, len(group)))
            else:
                items.append((execution.LOOP, Cycled(kind, at[0], 1, rows, fulls), len(group)))
        return items

    def bind(
        self, item: tuple[str, Any, int], queued: Callable[[jax.Array], None] | None = None
    ) -> Callable[[], jax.Array]:
        """The item's dispatch, everything but the state worked out now.

        The loop binds the next item while the devices still run the last call, before its
        hooks wait for that call's logs: once they return, dispatching is one compiled call
        on the state the engine then holds (a hook may have replaced it). The dispatch runs
        the item's steps and returns a tick to wait on; `queued` (the loop's bound on calls
        in flight) is given the tick of each call before the last.
        """
        mode, payload, _ = item
        if isinstance(payload, Cycled):
            return self._bind_cycled(payload, queued)
        engine = self.engine
        # The source arrays go on the devices with the first call that gathers from them.
        source = None
        if self.source is not None:
            source = functools.partial(self.source.arrays, self._recorder())
        tabled = isinstance(payload, FromTable)
        if isinstance(payload, Resident):
            calls = list(zip(payload.batches, payload.masks, strict=True))
            source = None
        elif tabled:
            if payload.table is not self._table:
                self._table, self._cursor = payload.table, payload.table.zero
            mask = None if payload.full else payload.table.mask
            calls = [(payload.table.batch, mask)] * payload.calls
        else:
            calls = [payload] if mode == execution.SCAN else payload
        train = self.phase == "train"
        # The first training call also gives the FLOP count, from its compiled executable.
        count = train and not flop_rate.known(engine)
        steps = self.k if mode == execution.SCAN else 1

        def dispatch() -> jax.Array:
            arrays = None if source is None else source()
            leaves, packing = engine.leaves()
            fn = self._compiled(mode == execution.SCAN, packing)
            cursor = self._cursor if tabled else None
            n = packing.metric_count
            metrics, others = leaves[:n], leaves[n:]
            logs = args = None
            watch = self._watch(mode, len(calls), steps)
            for at, (batch, mask) in enumerate(calls):
                if watch is not None:
                    watch.before(at, (metrics, others))
                if at and queued is not None:
                    # Each call of a multi-call item counts in flight (more than ~30 queued
                    # calls with a collective deadlock XLA:CPU; K single steps are K calls).
                    queued(logs[0])
                if train:
                    args = (metrics, others, arrays, batch, mask, cursor)
                    metrics, others, logs, cursor = fn(*args)
                else:
                    metrics, logs, cursor = fn(metrics, others, arrays, batch, mask, cursor)
            if tabled:
                self._cursor = cursor
            return _settle(engine, watch, count and fn, args, [*metrics, *others], logs)

        return dispatch

    def _watch(self, mode: str, calls: int, steps: int) -> Any:
        """The engine's `Trial`'s stopwatch for a training item, if it times this one."""
        trial = self.engine.cache.get("trial") if self.phase == "train" else None
        return None if trial is None else trial.watch(mode, calls, steps)

    def _compiled(self, many: bool, packing: Any, cycle: tuple | None = None) -> Callable:
        """The phase's compiled call (`execution.compiled`), looked up once per packing."""
        key = (many, cycle)
        cached = self._fns.get(key)
        if cached is None or cached[0] is not packing:
            fn = execution.compiled(self.engine, self.phase, many, packing, cycle)
            cached = self._fns[key] = (packing, fn)
        return cached[1]

    def _bind_cycled(
        self, item: Cycled, queued: Callable[[jax.Array], None] | None
    ) -> Callable[[], jax.Array]:
        """`bind` for calls on in-order resident data (see `Cycled`): each call starts at
        the cursor the last one returned (placed only when the position jumped)."""
        engine, blocks = self.engine, self.blocks
        record = self._recorder()
        kind = (BLOCK,) if item.kind == BLOCK else (item.kind, item.rows)  # what compiles
        cycle = (kind, item.steps)
        # Where the calls leave the cursor: a block per step, or a window's rows.
        moves = len(item.full) * item.steps * (1 if item.kind == BLOCK else item.rows)
        end = (item.start + moves) % blocks.period(item.kind, item.rows)
        count = not flop_rate.known(engine)

        def dispatch() -> jax.Array:
            if item.kind == BLOCK:
                data, masks = blocks.body(item.rows, record)
            else:
                data, masks = blocks.flat(record), None
            leaves, packing = engine.leaves()
            fn = self._compiled(item.steps > 1, packing, cycle)
            n = packing.metric_count
            metrics, others = leaves[:n], leaves[n:]
            cursor = blocks.cursor(item.kind, item.start, record)
            logs = None
            mode = execution.SCAN if item.steps > 1 else execution.LOOP
            watch = self._watch(mode, len(item.full), item.steps)
            for at, full in enumerate(item.full):
                if watch is not None:
                    watch.before(at, (metrics, others))
                if at and queued is not None:
                    queued(logs[0])  # (each call counts in flight, as in `bind`)
                args = (metrics, others, None, data, None if full else masks, cursor)
                metrics, others, logs, cursor = fn(*args)
            blocks.moved(item.kind, end, cursor)
            return _settle(engine, watch, count and fn, args, [*metrics, *others], logs)

        return dispatch


def _settle(engine: Any, watch: Any, counted: Any, args: Any, leaves: list, logs: Any) -> Any:
    """An item's end: its stopwatch stops, the first training call gives the FLOP count
    (`counted`: its compiled function, or False), and the engine takes the new metric sums
    and their logs (for `feed.fetch_logs`: no second call needed). Returns the tick."""
    if watch is not None:
        watch.after(logs[0])
    if counted and not flop_rate.known(engine):
        flop_rate.count(engine, counted, args)
    engine.set_leaves(leaves, logs)
    return logs[0]
