"""The compiled steps: pure functions of explicit state, one per phase (train, test, predict).

State is a dict pytree: `params` (the model's trainable variables, float32), `rest` (its other
variables: batch statistics, RNG state, counters), `opt` (optimizer state, including the gradient
accumulator and the loss scale), `metrics` (the metric objects' sums). A step is
`state, batch, mask -> state`; `mask` marks the real rows of a padded batch. The test step
adds nothing for a batch with no real row (the filler of a short `steps_per_execution`
group); the loop never gives the train step one.

The steps see the model only through its adapter (`adapters.protocol.ModelAdapter`): the
train step runs it in training mode and carries its updated `rest` (new batch statistics,
advanced RNG counters); evaluate and predict run it in inference mode and leave `rest` as
it is.

The loss is Keras's: the compiled loss's weighted mean over the real examples, plus the
losses the model adds itself (regularizers, `add_loss`, NNX `extra_losses`) once per global
batch, in training and in evaluation; or the model's own overridden `compute_loss`. As in
Keras 3, `sample_weight` (and `class_weight`) weigh the loss and the `weighted_metrics`;
the other metrics count every real example once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax

from phalanx._src.train.adapters.protocol import ModelAdapter
from phalanx._src.train.api import precision


def unpack(batch: Any) -> tuple[Any, Any, Any]:
    """Keras's convention: `(x,)`, `(x, y)`, `(x, y, sample_weight)`, or a bare `x`."""
    if isinstance(batch, tuple | list) and not hasattr(batch, "_fields"):
        if len(batch) == 1:
            return batch[0], None, None
        if len(batch) == 2:
            return batch[0], batch[1], None
        if len(batch) == 3:
            return batch[0], batch[1], batch[2]
        raise ValueError(
            f"a batch tuple must be (x,), (x, y) or (x, y, sample_weight); got {len(batch)} "
            "items. Pack several inputs into a dict or a nested tuple as x"
        )
    return batch, None, None


def _labels(y: Any, phase: str) -> Any:
    """`y`, or a ValueError when a batch without labels reached a step that needs them (the
    loops check the data first, see `checks.require_labels`; this catches any other way in)."""
    if y is None:
        raise ValueError(
            f"a batch without labels reached the {phase} step: it is x alone, but the loss "
            "needs y_true. Pass (x, y) batches, e.g. model.fit(x, y) or model.evaluate(x, y)"
        )
    return y


def _row_weights(rows: int, sample_weight: Any) -> jax.Array:
    """Per-example float32 weights; trailing weight axes (per-timestep weights) averaged."""
    if sample_weight is None:
        return jnp.ones((rows,), jnp.float32)
    weight = jnp.asarray(sample_weight, jnp.float32)
    if weight.ndim > 1:
        weight = jnp.mean(weight, axis=tuple(range(1, weight.ndim)))
    return jnp.broadcast_to(weight, (rows,))


@dataclasses.dataclass(frozen=True)
class Steps:
    """Pure step functions for one compiled model; see the module docstring.

    Attributes:
      adapter: the model, as pure functions of `(params, rest)`.
      metrics_graphdef: the structure of `[loss tracker, *metrics]`.
      loss: per-example loss `(y_true, y_pred) -> (batch,)` float32.
      tx: the full optimizer (loss scaling > accumulation > clipping > optimizer).
      weighted: per metric after the loss tracker, whether `sample_weight` weighs it
        (Keras's `weighted_metrics`); default: none does.
    """

    adapter: ModelAdapter
    metrics_graphdef: Any
    loss: Callable[[Any, Any], jax.Array]
    tx: optax.GradientTransformationExtraArgs
    weighted: tuple[bool, ...] = ()

    def _losses(self, params, rest, batch, y_pred, losses, sw, mask, *, training: bool):
        """`(weighted per-example loss, the model's added loss, rest)`: the loss of row i
        is `weighted[i] + added` (see the module docstring); `mask` None: all rows real."""
        if self.adapter.overrides_loss:
            weighted, rest = self.adapter.model_loss(
                params, rest, losses, batch, y_pred, mask, training=training
            )
            return weighted, jnp.float32(0.0), rest
        added = sum(losses, jnp.float32(0.0))
        return self.loss(batch[1], y_pred) * sw, added, rest

    def _update_metrics(self, metrics: Any, y: Any, y_pred: Any, loss, sw, mask):
        """Keras's bookkeeping: the loss tracker averages each real example's loss (`loss`:
        weighted, with the model's added losses); `weighted_metrics` weigh each example by
        `sample_weight`, the other metrics count each real example once (0 for pads)."""
        loss_tracker, *others = nnx.merge(self.metrics_graphdef, metrics)
        loss_tracker.update_state(loss, mask)
        y_pred = jax.tree.map(lambda p: p.astype(jnp.float32), y_pred)
        for index, metric in enumerate(others):
            # Keras's per-output `{output}_loss` trackers (multi_output.OutputLoss) average as
            # the loss tracker does, so they need the mask apart from the sample weights.
            if hasattr(metric, "update_with_mask"):
                if not self.adapter.overrides_loss:
                    metric.update_with_mask(y, y_pred, sw, mask)
            else:
                weighted = index < len(self.weighted) and self.weighted[index]
                metric.update_state(y, y_pred, sample_weight=sw * mask if weighted else mask)
        return nnx.state([loss_tracker, *others])

    def train(self, state: dict, batch: Any, mask: jax.Array | None) -> dict:
        """One optimizer step (or one accumulation step) on a global batch with real rows.

        A batch without a real row would still move the optimizer (Adam's moments decay), so
        the loop never runs one: a short last group of K runs as single steps. `mask=None`
        says every row is real: the step then compiles without the mask's arithmetic (~14 %
        of a small MLP's step on an H100) and BatchNorm takes its unmasked statistics.
        """
        x, y, sample_weight = unpack(batch)
        y = _labels(y, "train")
        rows = jax.tree.leaves(batch)[0].shape[0]
        full = mask is None
        mask = jnp.ones((rows,), jnp.float32) if full else mask.astype(jnp.float32)
        sw = _row_weights(rows, sample_weight)
        count = jnp.float32(rows) if full else jnp.sum(mask)
        layer_mask = None if full else mask

        def loss_fn(params):
            y_pred, rest, losses = self.adapter.apply_with_losses(
                params, state["rest"], x, training=True, mask=layer_mask
            )
            weighted, added, rest = self._losses(
                params, rest, (x, y, sample_weight), y_pred, losses, sw, layer_mask, training=True
            )
            # Differentiated over the static row count (so float16 loss scaling stays in
            # range) and rescaled to the real count below: the count's all-reduce then does
            # not have to finish before the backward pass starts. The added losses count
            # once per global batch, so they are pre-scaled by count / rows.
            loss = jnp.sum(weighted * mask) / rows
            if losses:
                loss = loss + added * (1.0 if full else count / rows)
            aux = (weighted + added, y_pred, rest)
            return precision.scale_loss(loss, state["opt"]), aux

        grads, (row_losses, y_pred, rest) = jax.grad(loss_fn, has_aux=True)(state["params"])
        # Keras's sum_over_batch_size: the weighted sum over the real examples' count.
        scale = rows / jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g: g * scale.astype(g.dtype), grads)
        updates, opt = self.tx.update(grads, state["opt"], state["params"], example_count=count)
        return {
            "params": optax.apply_updates(state["params"], updates),
            "rest": rest,
            "opt": opt,
            "metrics": self._update_metrics(state["metrics"], y, y_pred, row_losses, sw, mask),
        }

    def test(self, state: dict, batch: Any, mask: jax.Array) -> dict:
        """Adds one global batch to the loss and metric sums, in inference mode.

        Only `state["metrics"]` changes; the rest of `state` is returned as it came.
        """
        x, y, sample_weight = unpack(batch)
        y = _labels(y, "test")
        mask = mask.astype(jnp.float32)
        sw = _row_weights(mask.shape[0], sample_weight)
        params, rest = state["params"], state["rest"]
        y_pred, _, losses = self.adapter.apply_with_losses(
            params, rest, x, training=False, mask=mask
        )
        weighted, added, _ = self._losses(
            params, rest, (x, y, sample_weight), y_pred, losses, sw, mask, training=False
        )
        metrics = self._update_metrics(state["metrics"], y, y_pred, weighted + added, sw, mask)
        return {**state, "metrics": metrics}

    def predict(self, state: dict, batch: Any) -> Any:
        """The model's outputs for one global batch, in inference mode, as float32."""
        x, _, _ = unpack(batch)
        rows = jax.tree.leaves(x)[0].shape[0]
        y_pred, _ = self.adapter.apply(
            state["params"], state["rest"], x, training=False, mask=jnp.ones((rows,), jnp.float32)
        )
        return jax.tree.map(lambda p: p.astype(jnp.float32), y_pred)


def scanned(step: Callable[[dict, Any, jax.Array], dict], unroll: bool) -> Callable:
    """K steps in one call: `state, (K, rows, ...) batches, (K, rows) masks -> state`."""

    def many(state: dict, batches: Any, masks: jax.Array) -> dict:
        def body(state, inputs):
            batch, mask = inputs
            return step(state, batch, mask), None

        state, _ = lax.scan(body, state, (batches, masks), unroll=unroll)
        return state

    return many


def log_values(graphdef: Any, metrics: Any) -> list[jax.Array]:
    """`[loss, *metrics]` results (inside jit). Every compiled call returns them with the
    state, so reading logs costs one device-to-host copy and no second call; the first one
    is also the tick that bounds the calls in flight (it is ready when the call is done)."""
    return [m.result() for m in nnx.merge(graphdef, metrics)]
