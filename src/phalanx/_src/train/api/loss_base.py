"""`Loss`, the base of phalanx's losses: one float32 value per example, shape `(batch,)`.

Its own module so that the Keras bridge (`keras_bridge.losses`) can subclass it while
`losses.get` wraps Keras objects through the bridge: imports go one way.

Example:
  >>> class Hinge(Loss):
  ...     def call(self, y_true, y_pred):
  ...         return jnp.maximum(0.0, 1.0 - y_true * y_pred)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from phalanx._src.train.api.reduction import Reduction

# Keras's `backend.epsilon()`: probabilities are clipped to [EPSILON, 1 - EPSILON] before log.
EPSILON = 1e-7

LossFn = Callable[[Any, Any], jax.Array]


def _per_example(values: jax.Array) -> jax.Array:
    """Means every axis after the first, so the result has shape (batch,)."""
    if values.ndim <= 1:
        return values
    return jnp.mean(values, axis=tuple(range(1, values.ndim)))


def _check_per_example(name: str, values: jax.Array, pred_shape: tuple) -> None:
    """Raises unless `values` has one entry per example (its first axis the batch's).

    A loss that reduces over the batch itself (a scalar, Keras's reduction='sum_over_batch_size'
    applied too early) cannot be weighed by example: the padded rows of a partial last batch,
    which the step masks out, would be averaged in, and the numbers would be wrong. So it is
    refused when the step is traced, before anything compiles.
    """
    if not pred_shape:
        return  # an unbatched call, e.g. loss(1.0, 0.5)
    batch = pred_shape[0]
    if values.ndim >= 1 and values.shape[0] == batch:
        return
    hint = ""
    if len(pred_shape) == 1:
        hint = (
            " (with predictions of shape (batch,), a mean over axis=-1 is the batch mean: "
            "reduce nothing, or give the model's output a trailing axis of 1)"
        )
    raise ValueError(
        f"the loss {name!r} returned shape {tuple(values.shape)} for a batch of {batch} "
        f"examples (predictions of shape {tuple(pred_shape)}); a loss must return one value "
        f"per example, shape ({batch},), as Keras's reduction='none' does, and phalanx then "
        "weighs and averages them over the real examples. Reduce every axis but the first, "
        f"e.g. return jnp.mean(jnp.square(y_true - y_pred), axis=-1), not the batch mean{hint}"
    )


def _float32(x: Any) -> jax.Array:
    return jnp.asarray(x).astype(jnp.float32)


def _squeeze_sparse_labels(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
    """Integer labels of shape (..., 1) against predictions (..., C) become (...,)."""
    if y_true.ndim == y_pred.ndim and y_true.shape[-1] == 1:
        y_true = jnp.squeeze(y_true, -1)
    if y_true.shape != y_pred.shape[:-1]:
        raise ValueError(
            f"sparse labels of shape {y_true.shape} do not match predictions of shape "
            f"{y_pred.shape}; sparse labels need shape {y_pred.shape[:-1]} (or with a trailing "
            "1). For one-hot labels use loss='categorical_crossentropy'"
        )
    return y_true.astype(jnp.int32)


def align_rank(
    y_true: jax.Array, y_pred: jax.Array, hint: str = "give labels the shape of the predictions"
) -> tuple[jax.Array, jax.Array]:
    """Keras's squeeze-or-expand: (B,) against (B, 1) is made (B, 1) against (B, 1).

    Raises:
      ValueError: when the shapes still differ; the message ends with `hint`.
    """
    if y_true.ndim == y_pred.ndim - 1 and y_pred.shape[-1] == 1:
        y_true = y_true[..., None]
    elif y_pred.ndim == y_true.ndim - 1 and y_true.shape[-1] == 1:
        y_pred = y_pred[..., None]
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_true of shape {y_true.shape} does not match y_pred of shape {y_pred.shape}; {hint}"
        )
    return y_true, y_pred


def _snake(name: str) -> str:
    out = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return out


REDUCTIONS = ("none", "sum", "sum_over_batch_size", "mean", "mean_with_sample_weight")


class Loss:
    """Base class: a named callable returning one float32 loss per example.

    Subclasses implement `call(y_true, y_pred)` returning values of any shape whose first axis
    is the batch; `__call__` casts to float32 and means the trailing axes.

    `reduction` is Keras 3's: 'none' (or None; phalanx's default: one value per example),
    'sum', 'sum_over_batch_size' (Keras 3's default; 'mean' is the same), or
    'mean_with_sample_weight'. Inside `strategy.run`, 'sum_over_batch_size' gives the
    replica's share of the global-batch mean (`compute_average_loss`: padded rows never
    count), so summed over replicas it equals one device's mean, as TF recommends; 'sum' and
    'mean_with_sample_weight' reduce the replica's real rows. `compile` always uses the
    per-example values (the step averages them over the global batch), whatever the
    reduction.

    Example:
      >>> class Huber(Loss):
      ...     def call(self, y_true, y_pred):
      ...         return optax.huber_loss(y_pred, y_true)
      >>> Huber(name="huber")(y, p).shape   # (batch,)
    """

    def __init__(self, name: str | None = None, reduction: str | None = "none") -> None:
        self.name = name or _snake(type(self).__name__)
        self.reduction = _check_reduction(reduction, self.name)

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        raise NotImplementedError

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> jax.Array:
        """The loss of each example, or their reduction when `reduction` is not 'none'
        (`sample_weight`, one weight per example or a scalar, weighs them first)."""
        values = self.per_example(y_true, y_pred)
        reduction = getattr(self, "reduction", "none")  # a subclass may skip our __init__
        if reduction == "none":
            return values if sample_weight is None else values * _weights(sample_weight, values)
        return _reduce(values, sample_weight, reduction)

    def unreduced(self) -> Loss:
        """This loss with reduction 'none' (itself when it already is)."""
        if getattr(self, "reduction", "none") == "none":
            return self
        clone = copy.copy(self)
        clone.reduction = "none"
        return clone

    def per_example(self, y_true: Any, y_pred: Any) -> jax.Array:
        """One float32 loss per example, shape (batch,), whatever the reduction."""
        if isinstance(y_pred, dict | list | tuple):
            outputs = list(y_pred) if isinstance(y_pred, dict) else f"{len(y_pred)} outputs"
            raise ValueError(
                f"the model returns several outputs ({outputs}) but the loss {self.name!r} "
                "takes one; compile with one loss per output, e.g. loss={'a': 'mse', 'b': "
                "'mae'} for dict outputs or loss=['mse', 'mae'] for a tuple"
            )
        values = _float32(self.call(jnp.asarray(y_true), _float32(y_pred)))
        _check_per_example(self.name, values, jnp.shape(y_pred))
        return _per_example(values)

    def __repr__(self) -> str:
        reduction = getattr(self, "reduction", "none")
        reduction = "" if reduction == "none" else f", reduction={reduction!r}"
        return f"{type(self).__name__}(name={self.name!r}{reduction})"


def _check_reduction(reduction: Any, name: str) -> str:
    if reduction is None:
        return "none"
    if reduction is Reduction.AUTO:  # TF's name; Keras 3's string 'auto' stays refused
        return "sum_over_batch_size"  # as TF's AUTO outside a strategy (reduction.py)
    if isinstance(reduction, str) and reduction.lower() in REDUCTIONS:
        return str(reduction.lower())
    raise ValueError(
        f"loss {name!r} got reduction={reduction!r}; legal values are {list(REDUCTIONS)} or "
        "None, or phalanx.losses.Reduction.NONE / SUM / SUM_OVER_BATCH_SIZE / AUTO (TF's "
        "names), e.g. reduction='none' for a custom training loop"
    )


def _weights(sample_weight: Any, values: jax.Array) -> jax.Array:
    weight = jnp.asarray(sample_weight, jnp.float32)
    if weight.ndim == values.ndim + 1 and weight.shape[-1] == 1:
        weight = jnp.squeeze(weight, -1)
    try:
        return jnp.broadcast_to(weight, values.shape)
    except ValueError:
        raise ValueError(
            f"sample_weight of shape {weight.shape} does not match the {values.shape[0]} "
            "examples of the batch; give one weight per example, shape (batch,), or a scalar"
        ) from None


def _reduce(values: jax.Array, sample_weight: Any, reduction: str) -> jax.Array:
    """Keras 3's reductions of per-example `values`, with the replica's padding mask."""
    from phalanx._src.strategy.loss import compute_average_loss
    from phalanx._src.strategy.replica_context import current_example_mask

    if values.ndim == 0:
        return values
    weights = None if sample_weight is None else _weights(sample_weight, values)
    if reduction in ("sum_over_batch_size", "mean"):
        return compute_average_loss(values, sample_weight=weights)
    mask = current_example_mask(values.shape[0])
    if mask is not None:
        weights = mask if weights is None else weights * mask
    weighted = values if weights is None else jnp.where(weights != 0, values * weights, 0.0)
    total = jnp.sum(weighted)
    if reduction == "sum":
        return total
    count = jnp.sum(weights) if weights is not None else jnp.float32(values.size)
    return jnp.where(count == 0, 0.0, total / jnp.where(count == 0, 1.0, count))
