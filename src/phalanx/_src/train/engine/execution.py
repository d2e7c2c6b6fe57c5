"""How the loop executes K steps per call: one compiled `lax.scan`, or K single calls.

`steps_per_execution=K` normally compiles K steps into one call (`lax.scan` over K stacked
batches). On XLA:CPU a convolution inside a loop body misses the fast path and runs ~22x
slower per step (stack-facts section 9), so there, when the step contains a convolution,
the K steps are dispatched as single compiled calls instead; logs are still fetched only
every K steps. With `steps_per_execution='auto'` the first training calls also time the
two ways (`feeding.trial`) and keep the faster, so a step never runs slower than with
K = 1 for a trap this rule does not know.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from phalanx._src.train.engine import checks
from phalanx._src.train.engine.step import log_values, scanned, unpack

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine
    from phalanx._src.train.engine.packing import Packing

SCAN, LOOP = "scan", "loop"
BLOCK, WINDOW = "block", "window"  # the positions of in-order resident data (`feeding.blocks`)


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


def _cycled(step: Callable, cycle: tuple, data_sharding: Any) -> Callable:
    """`step` over in-order resident data: `(state, data, masks, cursor) -> (state, cursor)`.

    `cycle` is `((BLOCK,), steps)`: `data` holds every block as `(P, rows, ...)` arrays and
    step j reads `data[c]` (and `masks[c]`, None for full batches), advancing `c` mod P; or
    `((WINDOW, rows), steps)`: `data` is the source replicated, and each step gathers rows
    `c, c+1, ... mod N` (split over the replicas: each device gathers its own rows),
    advancing `c` by `rows` mod N. The position is a device scalar carried through the
    steps, so a call needs nothing from the host (see `feeding.blocks`).
    """
    (kind, *rows), steps = cycle

    def pick(data: Any, masks: Any, c: jax.Array) -> tuple[Any, Any, jax.Array]:
        if kind == BLOCK:
            period = jax.tree.leaves(data)[0].shape[0]
            take = functools.partial(lax.dynamic_index_in_dim, index=c, keepdims=False)
            mask = None if masks is None else take(masks)
            return jax.tree.map(take, data), mask, (c + 1) % period
        (size,) = rows
        period = jax.tree.leaves(data)[0].shape[0]
        index = (c + lax.iota(jnp.int32, size)) % period
        index = lax.with_sharding_constraint(index, data_sharding)
        return jax.tree.map(lambda a: a[index], data), None, (c + size) % period

    def run(state: dict, data: Any, masks: Any, c: jax.Array) -> tuple[dict, jax.Array]:
        def one(carry: tuple, _: Any) -> tuple[tuple, None]:
            state, c = carry
            batch, mask, c = pick(data, masks, c)
            return (step(state, batch, mask), c), None

        if steps == 1:
            return one((state, c), None)[0]
        return lax.scan(one, (state, c), None, length=steps)[0]

    return run


def _jit_phase(
    engine: Engine, phase: str, many: bool, packing: Packing, cycle: tuple | None = None
) -> Callable:
    """The phase's compiled call on the state's packed leaves (see `Engine.state`).

    Train: `(metric leaves, other leaves, source, batch, mask, cursor) -> (metric leaves,
    other leaves, logs, cursor)`, the other leaves donated. Test: the same arguments ->
    `(metric leaves, logs, cursor)`, nothing donated. No call donates the metric sums (a few
    bytes: donating them saves nothing), so `feed.reset_metrics` puts in one set of zeros
    every time. `cursor` is None for a batch given directly, or the device-side index of the
    call's entry in a `Table`; with a `cycle` (see `_cycled`), `batch` is the in-order data
    on the devices, `mask` its masks, and `cursor` the position the call starts at.
    """
    steps = engine.steps
    repl = engine.strategy.replicated_sharding
    treedef = packing.treedef
    n = packing.metric_count

    def run(step: Callable, metrics: list, others: list, source, batch, mask, cursor):
        state = jax.tree.unflatten(treedef, packing.unpack([*metrics, *others]))
        if cycle is not None:
            data = engine.strategy.data_sharding
            state, cursor = _cycled(step, cycle, data)(state, batch, mask, cursor)
        else:
            batch, mask = _pick(batch, mask, cursor)
            one = _with_source(step, source)
            state = (scanned(one, unroll=False) if many else one)(state, batch, mask)
            cursor = _next(cursor)
        logs = log_values(steps.metrics_graphdef, state["metrics"])
        return state, logs, cursor

    if phase == "train":

        def call(metrics, others, source, batch, mask, cursor):
            state, logs, cursor = run(steps.train, metrics, others, source, batch, mask, cursor)
            out, out_def = jax.tree.flatten(state)
            if out_def != treedef:
                raise TypeError(f"the train step changed the state's structure: {out_def}")
            out = packing.pack(out)
            return out[:n], out[n:], logs, cursor

        # The state keeps its layout: replicated, or sharded by Strategy(state_sharding=...).
        state = engine.abstract_state()  # shapes only: reading `state` would unpack it
        prefix = engine.strategy.train_state_shardings(state)
        shardings = packing.shardings(
            treedef.flatten_up_to(jax.tree.broadcast(prefix, state)), repl
        )
        out_shardings = (shardings[:n], shardings[n:], repl, repl)
        return jax.jit(call, donate_argnums=1, out_shardings=out_shardings)

    def call_test(metrics, others, source, batch, mask, cursor):
        state, logs, cursor = run(steps.test, metrics, others, source, batch, mask, cursor)
        out = packing.pack(jax.tree.leaves(state))
        return out[:n], logs, cursor

    return jax.jit(call_test, out_shardings=(repl, repl, repl))


def compiled(
    engine: Engine, phase: str, many: bool, packing: Packing, cycle: tuple | None = None
) -> Callable:
    """The phase's compiled call for a state packed by `packing` (cached by the engine);
    `cycle`: over in-order resident data, see `_cycled`."""
    key = (phase, many) if cycle is None else (phase, many, cycle)
    fn = engine.cache.get(key)
    if fn is None or engine.cache.get(("packing", *key)) != packing:
        fn = engine.cache[key] = _jit_phase(engine, phase, many, packing, cycle)
        engine.cache[("packing", *key)] = packing
    return fn


def choose_mode(engine: Engine, source: Any, batch: Any, mask: jax.Array) -> str:
    """SCAN, unless the model has a convolution and runs on XLA:CPU (then LOOP)."""
    mode = engine.cache.get("mode")
    if mode is None:
        mode = _mode(engine, source, batch)
        engine.cache["mode"] = mode
    return mode


def _mode(engine: Engine, source: Any, batch: Any) -> str:
    """SCAN or LOOP for batches like `batch` (row numbers when `source` is given).

    The model's forward pass as the boundary check traced it (`checks.has_convolution`)
    tells: no second trace of the step, and no lowering of a program that would hold
    device-resident data (lowering the step that closed over a 160 MB dataset and printing
    it took ~2 s and ~500 MB before the first step, issue 23). A convolution in the forward
    pass is one in the backward pass too."""
    if engine.strategy.devices[0].platform != "cpu":
        return SCAN
    if source is not None:
        rows = np.shape(batch)[0]
        batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct((rows, *a.shape[1:]), a.dtype), source)
    x, _, _ = unpack(batch)
    return LOOP if checks.has_convolution(engine, x) else SCAN


def predict_fn(engine: Engine, many: bool = False) -> Callable:
    """`(state, source, batch) -> outputs`; `source` as for the other phases.

    `many`: the batch is K stacked batches `(K, rows, ...)`, run in one call (`lax.map`), and
    so are the outputs.
    """
    key = ("predict", many)
    fn = engine.cache.get(key)
    if fn is None:

        def one(state, source, batch):
            if source is not None:
                batch = jax.tree.map(lambda a: a[batch], source)
            return engine.steps.predict(state, batch)

        def predict(state, source, batch):
            if many:
                return jax.lax.map(lambda b: one(state, source, b), batch)
            return one(state, source, batch)

        fn = engine.cache[key] = jax.jit(predict)
    return fn


def predict_mode(engine: Engine, source: Any, batch: Any) -> str:
    """SCAN (K batches per call), unless the model has a convolution on XLA:CPU (LOOP)."""
    mode = engine.cache.get("predict_mode")
    if mode is None:
        mode = engine.cache["predict_mode"] = _mode(engine, source, batch)
    return mode
