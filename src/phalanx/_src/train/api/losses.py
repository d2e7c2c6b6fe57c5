"""Per-example losses with Keras's names, defaults and numerics, built on optax.

A loss here is a small callable object: `loss(y_true, y_pred)` returns one float32 value per
example, shape `(batch,)`. Trailing axes are reduced with a mean, as Keras does. Reduction over
the batch is the caller's job: the training step computes
`sum(loss * sample_weight * mask) / denominator`, so a padded row (mask 0) never counts and the
global-batch denominator is chosen in one place (see `phalanx.compute_average_loss`).

Predictions in bfloat16 or float16 are cast to float32 before any log or exp, so the loss is
always computed, and returned, in float32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from phalanx._src.train.api.loss_base import (
    EPSILON,
    Loss,
    LossFn,
    _float32,
    _squeeze_sparse_labels,
    align_rank,
)


class SparseCategoricalCrossentropy(Loss):
    """Cross-entropy between integer class labels and a distribution over classes.

    `y_true` holds class indices, shape (batch,) or (batch, 1); `y_pred` holds logits
    (`from_logits=True`, via `optax.softmax_cross_entropy_with_integer_labels`) or
    probabilities, which are renormalised and clipped to [1e-7, 1 - 1e-7] before the log as
    Keras does.

    Args:
      from_logits: whether `y_pred` is logits (recommended: more stable) or probabilities.
      name: the loss's name in logs.
      reduction: see `Loss`; default 'none' (one value per example).

    Example:
      >>> loss = SparseCategoricalCrossentropy(from_logits=True)
      >>> loss(jnp.array([1, 0]), jnp.array([[0.0, 2.0], [1.0, 0.0]])).shape
      (2,)
    """

    def __init__(
        self,
        from_logits: bool = False,
        name: str = "sparse_categorical_crossentropy",
        reduction: str | None = "none",
    ):
        super().__init__(name, reduction)
        self.from_logits = from_logits

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        labels = _squeeze_sparse_labels(y_true, y_pred)
        if self.from_logits:
            return optax.softmax_cross_entropy_with_integer_labels(y_pred, labels)
        probs = _clip_probabilities(y_pred / jnp.sum(y_pred, axis=-1, keepdims=True))
        return -jnp.take_along_axis(jnp.log(probs), labels[..., None], axis=-1)[..., 0]


class CategoricalCrossentropy(Loss):
    """Cross-entropy between one-hot (or soft) labels and a distribution over classes.

    Args:
      from_logits: whether `y_pred` is logits (uses `optax.softmax_cross_entropy`) or
        probabilities (renormalised, clipped to [1e-7, 1 - 1e-7], as Keras does).
      label_smoothing: in [0, 1]; labels become `y * (1 - s) + s / num_classes`.
      name: the loss's name in logs.

    Example:
      >>> CategoricalCrossentropy()(jnp.eye(3), jnp.full((3, 3), 1 / 3))   # log(3) each
    """

    def __init__(
        self,
        from_logits: bool = False,
        label_smoothing: float = 0.0,
        name: str = "categorical_crossentropy",
        reduction: str | None = "none",
    ):
        super().__init__(name, reduction)
        self.from_logits = from_logits
        self.label_smoothing = _check_smoothing(label_smoothing)

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        if y_true.shape != y_pred.shape:
            raise ValueError(
                f"one-hot labels of shape {y_true.shape} do not match predictions of shape "
                f"{y_pred.shape}; for integer class labels use "
                "loss='sparse_categorical_crossentropy'"
            )
        labels = _float32(y_true)
        if self.label_smoothing:
            labels = labels * (1.0 - self.label_smoothing) + self.label_smoothing / y_pred.shape[-1]
        if self.from_logits:
            return optax.softmax_cross_entropy(y_pred, labels)
        probs = _clip_probabilities(y_pred / jnp.sum(y_pred, axis=-1, keepdims=True))
        return -jnp.sum(labels * jnp.log(probs), axis=-1)


class BinaryCrossentropy(Loss):
    """Cross-entropy between 0/1 labels and independent Bernoulli predictions.

    The last axis is averaged (Keras's `axis=-1`): predictions of shape (batch, 1) give one
    value per example; (batch, k) multi-label predictions give the mean over the k labels;
    (batch,) gives one value per element.

    Args:
      from_logits: whether `y_pred` is logits (uses `optax.sigmoid_binary_cross_entropy`) or
        probabilities (clipped to [1e-7, 1 - 1e-7], as Keras does).
      label_smoothing: in [0, 1]; labels become `y * (1 - s) + 0.5 * s`.
      name: the loss's name in logs.

    Example:
      >>> BinaryCrossentropy(from_logits=True)(jnp.array([[1.0]]), jnp.array([[0.0]]))  # log 2
    """

    def __init__(
        self,
        from_logits: bool = False,
        label_smoothing: float = 0.0,
        name: str = "binary_crossentropy",
        reduction: str | None = "none",
    ):
        super().__init__(name, reduction)
        self.from_logits = from_logits
        self.label_smoothing = _check_smoothing(label_smoothing)

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        labels, y_pred = align_rank(_float32(y_true), y_pred)
        if self.label_smoothing:
            labels = labels * (1.0 - self.label_smoothing) + 0.5 * self.label_smoothing
        if self.from_logits:
            return optax.sigmoid_binary_cross_entropy(y_pred, labels)
        probs = _clip_probabilities(y_pred)
        return -(labels * jnp.log(probs) + (1.0 - labels) * jnp.log(1.0 - probs))


class MeanSquaredError(Loss):
    """Squared error, `(y_true - y_pred) ** 2`, averaged over trailing axes.

    Example:
      >>> MeanSquaredError()(jnp.array([[1.0, 2.0]]), jnp.array([[1.0, 0.0]]))   # [2.0]
    """

    def __init__(self, name: str = "mean_squared_error", reduction: str | None = "none"):
        super().__init__(name, reduction)

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        y_true, y_pred = align_rank(_float32(y_true), y_pred)
        return optax.squared_error(y_pred, y_true)


class MeanAbsoluteError(Loss):
    """Absolute error, `|y_true - y_pred|`, averaged over trailing axes.

    Example:
      >>> MeanAbsoluteError()(jnp.array([[1.0, 2.0]]), jnp.array([[1.0, 0.0]]))   # [1.0]
    """

    def __init__(self, name: str = "mean_absolute_error", reduction: str | None = "none"):
        super().__init__(name, reduction)

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        y_true, y_pred = align_rank(_float32(y_true), y_pred)
        return jnp.abs(y_pred - y_true)


class FunctionLoss(Loss):
    """Wraps a plain function `(y_true, y_pred) -> per-example values` as a `Loss`."""

    def __init__(self, fn: LossFn, name: str | None = None, reduction: str | None = "none"):
        super().__init__(name or getattr(fn, "__name__", "loss"), reduction)
        self.fn = fn

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        return jnp.asarray(self.fn(y_true, y_pred))


def _clip_probabilities(p: jax.Array) -> jax.Array:
    return jnp.clip(p, EPSILON, 1.0 - EPSILON)


def _check_smoothing(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {value!r}")
    return float(value)


_BY_NAME: dict[str, type[Loss]] = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
    "mean_squared_error": MeanSquaredError,
    "mse": MeanSquaredError,
    "mean_absolute_error": MeanAbsoluteError,
    "mae": MeanAbsoluteError,
}


def _from_keras(identifier: Any, kwargs: dict) -> Loss | None:
    """A Keras 3 loss object, or a name only Keras knows (when keras is imported), as a
    per-example `keras_bridge.losses.KerasLoss`; None for anything else."""
    from phalanx._src.train.api import keras_bridge

    if isinstance(identifier, str) and identifier.lower() not in _BY_NAME:
        found = keras_bridge.keras_by_name("losses", identifier)
        if found is not None and not kwargs and not isinstance(found, type) and callable(found):
            return FunctionLoss(found)  # Keras's per-example function, e.g. 'huber'
        if not keras_bridge.is_keras_object(found, "losses.Loss"):
            return None
        identifier = type(found)(**kwargs) if kwargs else found
    elif not keras_bridge.is_keras_object(identifier, "losses.Loss"):
        return None
    from phalanx._src.train.api.keras_bridge.losses import KerasLoss

    return KerasLoss(identifier)


def get(identifier: str | Loss | LossFn, **kwargs: Any) -> Loss:
    """Resolves a Keras loss identifier to a `Loss`.

    Args:
      identifier: a name ('sparse_categorical_crossentropy', 'categorical_crossentropy',
        'binary_crossentropy', 'mse' / 'mean_squared_error', 'mae' / 'mean_absolute_error'),
        a `Loss` instance (returned as is), or a plain function
        `(y_true, y_pred) -> per-example loss` (wrapped, keeping its `__name__`).
      **kwargs: constructor arguments for a named loss, e.g. `from_logits=True`.

    Returns:
      A `Loss`.

    Raises:
      ValueError: for an unknown name (the message lists the legal ones).
      TypeError: for anything else, or kwargs given with an instance or function.

    Example:
      >>> loss = get("sparse_categorical_crossentropy", from_logits=True)
      >>> loss.name
      'sparse_categorical_crossentropy'
    """
    keras_loss = _from_keras(identifier, kwargs)
    if keras_loss is not None:
        return keras_loss
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.lower())
        if cls is None:
            raise ValueError(
                f"unknown loss {identifier!r}; legal names are {sorted(_BY_NAME)}, or pass a "
                "phalanx.losses.Loss or a function (y_true, y_pred) -> per-example loss, e.g. "
                "loss='sparse_categorical_crossentropy'"
            )
        return cls(**kwargs)
    if kwargs:
        raise TypeError(
            f"keyword arguments {sorted(kwargs)} only apply to a loss given by name; configure "
            f"the instance {identifier!r} directly instead"
        )
    if isinstance(identifier, Loss):
        # The step weighs, masks and averages per-example values itself (one place for the
        # global-batch denominator), so a loss built with a Keras reduction is used unreduced.
        return identifier.unreduced()
    if callable(identifier):
        return FunctionLoss(identifier)
    raise TypeError(
        f"loss must be a name, a phalanx.losses.Loss or a function (y_true, y_pred) -> "
        f"per-example loss; got {identifier!r} of type {type(identifier).__name__}"
    )
