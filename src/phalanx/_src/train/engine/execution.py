"""How the loop executes K steps per call: one compiled `lax.scan`, or K single calls.

`steps_per_execution=K` normally compiles K steps into one call (`lax.scan` over K stacked
batches). On XLA:CPU a convolution inside a loop body misses the fast path and runs ~22x
slower per step (stack-facts section 9), so there, when the step contains a convolution,
the K steps are dispatched as single compiled calls instead; logs are still fetched only
every K steps. Either way the model never runs slower than with K = 1.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train.engine.step import scanned

if TYPE_CHECKING:
    from phalanx._src.train.engine.packing import Packing
    from phalanx._src.train.feeding.device_data import Blocks
    from phalanx._src.train.model import Model

SCAN, LOOP = "scan", "loop"


def log_values(graphdef: Any, metrics: Any) -> list[jax.Array]:
    """`[loss, *metrics]` results (inside jit). Every compiled call returns them with the
    state, so reading logs costs one device-to-host copy and no second call; the first one
    is also the tick that bounds the calls in flight (it is ready when the call is done)."""
    return [m.result() for m in nnx.merge(graphdef, metrics)]


def _with_source(step: Callable, source: Any) -> Callable:
    """`step` on a batch given directly, or as row numbers into on-device `source` arrays."""
    if source is None:
        return step
    return lambda state, rows, mask: step(state, jax.tree.map(lambda a: a[rows], source), mask)


def _pick(batch: Any, mask: jax.Array, cursor: jax.Array | None) -> tuple[Any, jax.Array]:
    """The call's input: `(batch, mask)` itself, or entry `cursor` of a `Table`'s arrays."""
    if cursor is None:
        return batch, mask
    pick = functools.partial(lax.dynamic_index_in_dim, index=cursor, keepdims=False)
    return jax.tree.map(pick, batch), None if mask is None else pick(mask)


def _next(cursor: jax.Array | None) -> jax.Array | None:
    return None if cursor is None else cursor + 1


def _jit_phase(model: Model, phase: str, many: bool, packing: Packing) -> Callable:
    """The phase's compiled call on the state's packed leaves (see `Model._state`).

    Train: `(metric leaves, other leaves, source, batch, mask, cursor) -> (metric leaves,
    other leaves, logs, cursor)`, the other leaves donated. Test: the same arguments ->
    `(metric leaves, logs, cursor)`, nothing donated. No call donates the metric sums (a few
    bytes: donating them saves nothing), so `feed.reset_metrics` puts in one set of zeros
    every time. `cursor` is None for a batch given directly, or the device-side index of the
    call's entry in a `Table`.
    """
    steps = model.steps
    repl = model.strategy.replicated_sharding
    treedef = packing.treedef
    n = packing.metric_count

    def run(step: Callable, metrics: list, others: list, source, batch, mask, cursor):
        state = jax.tree.unflatten(treedef, packing.unpack([*metrics, *others]))
        batch, mask = _pick(batch, mask, cursor)
        one = _with_source(step, source)
        state = (scanned(one, unroll=False) if many else one)(state, batch, mask)
        logs = log_values(steps.metrics_graphdef, state["metrics"])
        return state, logs

    if phase == "train":

        def call(metrics, others, source, batch, mask, cursor):
            state, logs = run(steps.train, metrics, others, source, batch, mask, cursor)
            out, out_def = jax.tree.flatten(state)
            if out_def != treedef:
                raise TypeError(f"the train step changed the state's structure: {out_def}")
            out = packing.pack(out)
            return out[:n], out[n:], logs, _next(cursor)

        # The state keeps its layout: replicated, or sharded by Strategy(state_sharding=...).
        state = model._state
        prefix = model.strategy.train_state_shardings(state)
        shardings = packing.shardings(
            treedef.flatten_up_to(jax.tree.broadcast(prefix, state)), repl
        )
        out_shardings = (shardings[:n], shardings[n:], repl, repl)
        return jax.jit(call, donate_argnums=1, out_shardings=out_shardings)

    def call_test(metrics, others, source, batch, mask, cursor):
        state, logs = run(steps.test, metrics, others, source, batch, mask, cursor)
        out = packing.pack(jax.tree.leaves(state))
        return out[:n], logs, _next(cursor)

    return jax.jit(call_test, out_shardings=(repl, repl, repl))


def compiled(model: Model, phase: str, many: bool, packing: Packing) -> Callable:
    """The phase's compiled call for a state packed by `packing` (cached on the model)."""
    key = (phase, many)
    fn = model._compiled_fns.get(key)
    if fn is None or model._compiled_fns.get(("packing", *key)) != packing:
        fn = model._compiled_fns[key] = _jit_phase(model, phase, many, packing)
        model._compiled_fns[("packing", *key)] = packing
    return fn


def choose_mode(model: Model, source: Any, batch: Any, mask: jax.Array) -> str:
    """SCAN, unless the step has a convolution and runs on XLA:CPU (then LOOP)."""
    mode = model._compiled_fns.get("mode")
    if mode is None:
        mode = SCAN
        if model.strategy.devices[0].platform == "cpu":
            step = _with_source(model.steps.train, source)
            hlo = jax.jit(step).lower(model._state, batch, mask).as_text()
            if "convolution" in hlo:
                mode = LOOP
        model._compiled_fns["mode"] = mode
    return mode


@dataclasses.dataclass(eq=False)
class Table:
    """The inputs of up to `calls` compiled calls, on the devices at once (see `Runner`)."""

    batch: Any  # (calls, rows) or (calls, K, rows) row numbers
    mask: jax.Array
    zero: jax.Array  # the cursor of the table's first call


@dataclasses.dataclass(frozen=True)
class Resident:
    """Whole batches already on the devices as arrays of their own (`device_data.Blocks`):
    the calls take them directly, with no gather and no mask."""

    batches: list


@dataclasses.dataclass(frozen=True)
class FromTable:
    """The next `calls` calls of `table` (`full`: its batches have no padding)."""

    table: Table
    calls: int
    full: bool = False


def _zero(model: Model) -> jax.Array:
    """A replicated int32 0, made once on the devices (the calls never donate a cursor)."""
    zero = model._compiled_fns.get("zero")
    if zero is None:
        repl = model.strategy.replicated_sharding
        zero = jax.jit(lambda: jnp.zeros((), jnp.int32), out_shardings=repl)()
        model._compiled_fns["zero"] = zero
    return zero


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
        model: Model,
        phase: str,
        k: int,
        distributor: BatchDistributor,
        source: Any = None,
        blocks: Blocks | None = None,
    ) -> None:
        self.model = model
        self.phase = phase
        self.k = k
        self.distributor = distributor
        self.source = source  # on-device arrays the batches index into, or None
        self.blocks = blocks  # the source cut into whole batches in order, for training calls
        self.mode: str | None = None if k > 1 else LOOP
        self._table: Table | None = None
        self._cursor: jax.Array | None = None
        self._fns: dict[str, tuple[Any, Callable]] = {}  # mode: (state packing, call)

    def prepare(self, group: list[Any]) -> None:
        """Chooses the mode (SCAN or LOOP) on the phase's first group, once; its first batch
        fixes the compiled rows."""
        self.distributor.fix_rows(group[0])
        if self.mode is None:
            self.mode = self.model._compiled_fns.get("mode")
        if self.mode is None:
            batch, mask = self.distributor.arrays(group[0])
            self.mode = choose_mode(self.model, self.source, batch, mask)

    def put(self, group: list[Any]) -> tuple[str, Any, int]:
        """Device input for a group of up to K host batches (runs in the consumer thread)."""
        self.prepare(group)
        if self._scans(group):
            batch, mask = self.distributor.stacked(group, self.k)
            return SCAN, (batch, None if self._full([group]) else mask), len(group)
        calls = [self.distributor.arrays(b) for b in group]
        if self.mode == LOOP:  # (a short group of a scan keeps its masks: one compilation)
            full = [self._full([[b]]) for b in group]
            calls = [(b, None if f else m) for (b, m), f in zip(calls, full, strict=True)]
        return LOOP, calls, len(group)

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
        return self.mode == SCAN and (len(group) == self.k or self.phase != "train")

    def table_groups(self) -> int:
        """Groups per `Table`: about `TABLE_STEPS` steps."""
        return max(1, self.TABLE_STEPS // self.k)

    def _table_calls(self) -> int:
        return self.table_groups() * (1 if self.mode == SCAN else self.k)

    def put_table(self, groups: list[list[Any]]) -> list[tuple[str, FromTable, int]]:
        """Items for groups of row-number batches, their inputs sent in one `Table`."""
        self.prepare(groups[0])
        many = self.mode == SCAN
        tabled = [group for group in groups if self._scans(group) or not many]
        if not tabled:  # one short group: single calls
            return [self.put(groups[0])]
        # Only a last group can be short, and only a last batch partial: whole blocks before
        # it still train on their blocks, and it runs on its own.
        whole = tabled if many or self._full(tabled[-1:]) else tabled[:-1]
        resident = self._resident(whole, many) if whole else None
        if resident is not None:
            return resident + [self.put(group) for group in groups[len(whole) :]]
        entries = tabled if many else [[batch] for group in tabled for batch in group]
        batch, mask = self.distributor.table(entries, self.k if many else None, self._table_calls())
        table = Table(batch, mask, _zero(self.model))
        items = [
            (
                self.mode,
                FromTable(table, 1 if many else len(group), self._full([group])),
                len(group),
            )
            for group in tabled
        ]
        return items + [self.put(group) for group in groups[len(tabled) :]]

    def _resident(
        self, groups: list[list[Any]], many: bool
    ) -> list[tuple[str, Resident, int]] | None:
        """Training calls on `Blocks` when every batch is a whole block, else None: one
        `(K, rows, ...)` block per scanned group, or one block per single call."""
        if self.blocks is None or not self._full(groups):
            return None
        rows = int(np.shape(groups[0][0])[0])
        batches = [batch for group in groups for batch in group]
        found = self.blocks.lookup(batches, rows, self.k if many else None)
        if found is None:
            return None
        if many:
            return [
                (SCAN, Resident([block]), len(group))
                for block, group in zip(found, groups, strict=True)
            ]
        items, at = [], 0
        for group in groups:
            items.append((LOOP, Resident(found[at : at + len(group)]), len(group)))
            at += len(group)
        return items

    def bind(self, item: tuple[str, Any, int]) -> Callable[[], jax.Array]:
        """The item's dispatch, everything but the state worked out now.

        The loop binds the next item while the devices still run the last call, before its
        hooks wait for that call's logs: once they return, dispatching is one compiled call
        on the state the model then holds (a hook may have replaced it). The dispatch runs
        the item's steps and returns a tick to wait on.
        """
        mode, payload, _ = item
        model = self.model
        source = self.source
        tabled = isinstance(payload, FromTable)
        if isinstance(payload, Resident):
            calls = [(batch, None) for batch in payload.batches]
            source = None
        elif tabled:
            if payload.table is not self._table:
                self._table, self._cursor = payload.table, payload.table.zero
            mask = None if payload.full else payload.table.mask
            calls = [(payload.table.batch, mask)] * payload.calls
        else:
            calls = [payload] if mode == SCAN else payload
        fns = self._fns
        train = self.phase == "train"

        def dispatch() -> jax.Array:
            leaves, packing = model._state_leaves()
            cached = fns.get(mode)
            if cached is None or cached[0] is not packing:
                many = mode == SCAN
                cached = fns[mode] = (packing, compiled(model, self.phase, many, packing))
            fn = cached[1]
            cursor = self._cursor if tabled else None
            n = packing.metric_count
            metrics, others = leaves[:n], leaves[n:]
            logs = None
            for batch, mask in calls:
                if train:
                    metrics, others, logs, cursor = fn(metrics, others, source, batch, mask, cursor)
                else:
                    metrics, logs, cursor = fn(metrics, others, source, batch, mask, cursor)
            if tabled:
                self._cursor = cursor
            # The logs of these metric sums, for `feed.fetch_logs` (no second call needed).
            model._set_state_leaves([*metrics, *others], logs)
            return logs[0]

        return dispatch


def predict_fn(model: Model, many: bool = False) -> Callable:
    """`(state, source, batch) -> outputs`; `source` as for the other phases.

    `many`: the batch is K stacked batches `(K, rows, ...)`, run in one call (`lax.map`), and
    so are the outputs.
    """
    key = ("predict", many)
    fn = model._compiled_fns.get(key)
    if fn is None:

        def one(state, source, batch):
            if source is not None:
                batch = jax.tree.map(lambda a: a[batch], source)
            return model.steps.predict(state, batch)

        def predict(state, source, batch):
            if many:
                return jax.lax.map(lambda b: one(state, source, b), batch)
            return one(state, source, batch)

        fn = model._compiled_fns[key] = jax.jit(predict)
    return fn


def predict_mode(model: Model, source: Any, batch: Any) -> str:
    """SCAN (K batches per call), unless the model has a convolution on XLA:CPU (LOOP)."""
    mode = model._compiled_fns.get("predict_mode")
    if mode is None:
        mode = SCAN
        if model.strategy.devices[0].platform == "cpu":
            hlo = predict_fn(model).lower(model._state, source, batch).as_text()
            if "convolution" in hlo:
                mode = LOOP
        model._compiled_fns["predict_mode"] = mode
    return mode
