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
from flax import nnx

from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train.step import scanned

if TYPE_CHECKING:
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


def _jit_phase(model: Model, phase: str, many: bool) -> Callable:
    steps = model.steps
    repl = model.strategy.replicated_sharding

    def run(step: Callable, state: dict, source: Any, batch: Any, mask: jax.Array) -> dict:
        one = _with_source(step, source)
        return (scanned(one, unroll=False) if many else one)(state, batch, mask)

    if phase == "train":
        # Only a scan pads a short group with empty steps, which must change nothing.
        train = functools.partial(steps.train, may_be_empty=many)

        def call(state, source, batch, mask):
            state = run(train, state, source, batch, mask)
            return state, log_values(steps.metrics_graphdef, state["metrics"])

        # The state keeps its layout: replicated, or sharded by Strategy(state_sharding=...).
        state_shardings = model.strategy.train_state_shardings(model._state)
        return jax.jit(call, donate_argnums=0, out_shardings=(state_shardings, repl))

    def call_test(metrics, frozen, source, batch, mask):
        state = run(steps.test, {**frozen, "metrics": metrics}, source, batch, mask)
        return state["metrics"], log_values(steps.metrics_graphdef, state["metrics"])

    return jax.jit(call_test, donate_argnums=0, out_shardings=(repl, repl))


def compiled(model: Model, phase: str, many: bool) -> Callable:
    key = (phase, many)
    fn = model._compiled_fns.get(key)
    if fn is None:
        fn = model._compiled_fns[key] = _jit_phase(model, phase, many)
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


class Runner:
    """Turns groups of host batches into device inputs and runs them for one phase."""

    def __init__(
        self, model: Model, phase: str, k: int, distributor: BatchDistributor, source: Any = None
    ) -> None:
        self.model = model
        self.phase = phase
        self.k = k
        self.distributor = distributor
        self.source = source  # on-device arrays the batches index into, or None
        self.mode: str | None = None if k > 1 else LOOP

    def put(self, group: list[Any]) -> tuple[str, Any, int]:
        """Device input for a group of up to K host batches (runs in the consumer thread)."""
        if self.mode is None:
            batch, mask = self.distributor.arrays(group[0])
            self.mode = choose_mode(self.model, self.source, batch, mask)
            if self.mode == LOOP:
                rest = [self.distributor.arrays(b) for b in group[1:]]
                return LOOP, [(batch, mask), *rest], len(group)
        if self.mode == SCAN:
            return SCAN, self.distributor.stacked(group, self.k), len(group)
        return LOOP, [self.distributor.arrays(b) for b in group], len(group)

    @staticmethod
    def batches_in(item: tuple[str, Any, int]) -> int:
        return item[2]

    def execute(self, item: tuple[str, Any, int]) -> jax.Array:
        """Runs the item's steps on the model's state; returns a tick to wait on."""
        mode, payload, _ = item
        calls = [payload] if mode == SCAN else payload
        fn = compiled(self.model, self.phase, many=mode == SCAN)
        model = self.model
        logs = None
        for batch, mask in calls:
            if self.phase == "train":
                model._state, logs = fn(model._state, self.source, batch, mask)
            else:
                frozen = {k: v for k, v in model._state.items() if k != "metrics"}
                metrics, logs = fn(model._state["metrics"], frozen, self.source, batch, mask)
                model._state = {**model._state, "metrics": metrics}
        # The logs of these metric sums, for `feed.fetch_logs` (no second call needed).
        model._compiled_fns["last_logs"] = (model._state["metrics"], logs)
        return logs[0]


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
