"""How the loop executes K steps per call: one compiled `lax.scan`, or K single calls.

`steps_per_execution=K` normally compiles K steps into one call (`lax.scan` over K stacked
batches). On XLA:CPU a convolution inside a loop body misses the fast path and runs ~22x
slower per step (stack-facts section 9), so there, when the step contains a convolution,
the K steps are dispatched as single compiled calls instead; logs are still fetched only
every K steps. Either way the model never runs slower than with K = 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax import lax

from phalanx._src.train.engine import checks
from phalanx._src.train.engine.step import log_values, scanned, unpack

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine
    from phalanx._src.train.engine.packing import Packing

SCAN, LOOP = "scan", "loop"


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


def _jit_phase(engine: Engine, phase: str, many: bool, packing: Packing) -> Callable:
    """The phase's compiled call on the state's packed leaves (see `Engine.state`).

    Train: `(metric leaves, other leaves, source, batch, mask, cursor) -> (metric leaves,
    other leaves, logs, cursor)`, the other leaves donated. Test: the same arguments ->
    `(metric leaves, logs, cursor)`, nothing donated. No call donates the metric sums (a few
    bytes: donating them saves nothing), so `feed.reset_metrics` puts in one set of zeros
    every time. `cursor` is None for a batch given directly, or the device-side index of the
    call's entry in a `Table`.
    """
    steps = engine.steps
    repl = engine.strategy.replicated_sharding
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
        state = engine.abstract_state()  # shapes only: reading `state` would unpack it
        prefix = engine.strategy.train_state_shardings(state)
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


def compiled(engine: Engine, phase: str, many: bool, packing: Packing) -> Callable:
    """The phase's compiled call for a state packed by `packing` (cached by the engine)."""
    key = (phase, many)
    fn = engine.cache.get(key)
    if fn is None or engine.cache.get(("packing", *key)) != packing:
        fn = engine.cache[key] = _jit_phase(engine, phase, many, packing)
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
