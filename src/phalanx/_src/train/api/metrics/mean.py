"""Metrics that are a weighted mean of per-example values: the loss, accuracies, errors.

State: `total` (sum of weight * value) and `count` (sum of weight), both float32. The result
is `total / count`, or 0 before any example (Keras's `divide_no_nan`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from phalanx._src.train.api.metrics.base import Metric, safe_divide, weighted_sums, zeros


class Mean(Metric):
    """The weighted mean of the values given, e.g. of the per-example loss.

    Args:
      name: the key in logs.

    Example:
      >>> m = Mean(name="loss")
      >>> m.update_state(jnp.array([1.0, 3.0]), sample_weight=jnp.array([1.0, 0.0]))
      >>> float(m.result())
      1.0
    """

    direction = "down"

    def __init__(self, name: str = "mean", dtype: Any = None) -> None:
        super().__init__(name, dtype=dtype)
        self.total = zeros()
        self.count = zeros()

    def update_state(self, values: Any, sample_weight: Any = None) -> None:  # type: ignore[override]
        """Adds `values` (batch first, or a scalar) with optional per-example weights."""
        total, count = weighted_sums(values, sample_weight)
        self.total[...] = self.total[...] + total
        self.count[...] = self.count[...] + count

    def update(self, values: Any = None, sample_weight: Any = None, **_: Any) -> None:  # type: ignore[override]
        self.update_state(values, sample_weight)

    def result(self) -> jax.Array:
        return safe_divide(self.total[...], self.count[...])


class MeanMetricWrapper(Mean):
    """The weighted mean of `fn(y_true, y_pred)`, one value per example.

    Args:
      fn: `(y_true, y_pred) -> values` with the batch first (trailing axes are averaged);
        None in subclasses that override `values` instead.
      name: the key in logs.
      direction: 'up' if larger is better (accuracies), 'down' otherwise (errors).

    Example:
      >>> m = MeanMetricWrapper(lambda t, p: jnp.abs(t - p), name="mae", direction="down")
    """

    def __init__(
        self,
        fn: Callable[[Any, Any], jax.Array] | None,
        name: str | None = None,
        direction: str = "up",
        dtype: Any = None,
    ) -> None:
        super().__init__(name or getattr(fn, "__name__", "mean_metric"), dtype=dtype)
        self.fn = fn
        self.direction = direction

    def values(self, y_true: Any, y_pred: Any) -> jax.Array:
        """The per-example values this metric averages."""
        return self.fn(y_true, y_pred)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:  # type: ignore[override]
        super().update_state(self.values(y_true, y_pred), sample_weight)

    def update(self, y_true: Any = None, y_pred: Any = None, sample_weight: Any = None, **_):  # type: ignore[override]
        self.update_state(y_true, y_pred, sample_weight)


def _squeeze_labels(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
    if y_true.ndim == y_pred.ndim and y_true.shape[-1] == 1:
        y_true = jnp.squeeze(y_true, -1)
    return y_true


def _align(y_true: jax.Array, y_pred: jax.Array) -> tuple[jax.Array, jax.Array]:
    if y_true.ndim == y_pred.ndim - 1 and y_pred.shape[-1] == 1:
        y_true = y_true[..., None]
    elif y_pred.ndim == y_true.ndim - 1 and y_true.shape[-1] == 1:
        y_pred = y_pred[..., None]
    return y_true, y_pred


def accuracy(y_true: Any, y_pred: Any) -> jax.Array:
    """1.0 where `y_pred == y_true` elementwise (Keras's `accuracy`)."""
    y_true, y_pred = _align(jnp.asarray(y_true), jnp.asarray(y_pred))
    return (y_true == y_pred).astype(jnp.float32)


def binary_accuracy(y_true: Any, y_pred: Any, threshold: float = 0.5) -> jax.Array:
    """1.0 where `(y_pred > threshold) == y_true`, elementwise."""
    y_true, y_pred = _align(jnp.asarray(y_true, jnp.float32), jnp.asarray(y_pred, jnp.float32))
    return ((y_pred > threshold).astype(jnp.float32) == y_true).astype(jnp.float32)


def sparse_categorical_accuracy(y_true: Any, y_pred: Any) -> jax.Array:
    """1.0 where `argmax(y_pred) == y_true` (integer labels, shape (batch,) or (batch, 1))."""
    y_pred = jnp.asarray(y_pred)
    y_true = _squeeze_labels(jnp.asarray(y_true), y_pred)
    return (jnp.argmax(y_pred, axis=-1) == y_true.astype(jnp.int32)).astype(jnp.float32)


def categorical_accuracy(y_true: Any, y_pred: Any) -> jax.Array:
    """1.0 where `argmax(y_pred) == argmax(y_true)` (one-hot labels)."""
    y_pred = jnp.asarray(y_pred)
    return (jnp.argmax(y_pred, axis=-1) == jnp.argmax(jnp.asarray(y_true), axis=-1)).astype(
        jnp.float32
    )


def _in_top_k(labels: jax.Array, y_pred: jax.Array, k: int) -> jax.Array:
    """Keras's `in_top_k`: ties with the label's score count in its favour; NaN never wins."""
    y_pred = jnp.asarray(y_pred, jnp.float32)
    at_label = jnp.take_along_axis(y_pred, labels.astype(jnp.int32)[..., None], axis=-1)
    at_label = jnp.where(jnp.isnan(at_label), -jnp.inf, at_label)
    rank = 1 + jnp.sum(y_pred > at_label, axis=-1)
    return (rank <= k).astype(jnp.float32)


def sparse_top_k_categorical_accuracy(y_true: Any, y_pred: Any, k: int = 5) -> jax.Array:
    """1.0 where the integer label is among the `k` highest predictions."""
    y_pred = jnp.asarray(y_pred)
    return _in_top_k(_squeeze_labels(jnp.asarray(y_true), y_pred), y_pred, k)


def top_k_categorical_accuracy(y_true: Any, y_pred: Any, k: int = 5) -> jax.Array:
    """1.0 where the one-hot label's class is among the `k` highest predictions."""
    return _in_top_k(jnp.argmax(jnp.asarray(y_true), axis=-1), jnp.asarray(y_pred), k)


def squared_error(y_true: Any, y_pred: Any) -> jax.Array:
    y_true, y_pred = _align(jnp.asarray(y_true, jnp.float32), jnp.asarray(y_pred, jnp.float32))
    return jnp.square(y_pred - y_true)


def absolute_error(y_true: Any, y_pred: Any) -> jax.Array:
    y_true, y_pred = _align(jnp.asarray(y_true, jnp.float32), jnp.asarray(y_pred, jnp.float32))
    return jnp.abs(y_pred - y_true)


class Accuracy(MeanMetricWrapper):
    """How often predictions equal labels exactly (Keras's `Accuracy`).

    Example:
      >>> m = Accuracy(); m.update_state(jnp.array([1, 2]), jnp.array([1, 0]))  # 0.5
    """

    def __init__(self, name: str = "accuracy", dtype: Any = None) -> None:
        super().__init__(accuracy, name, dtype=dtype)


class BinaryAccuracy(MeanMetricWrapper):
    """How often `y_pred > threshold` matches 0/1 labels.

    Args:
      threshold: the decision threshold on probabilities (use 0.0 for logits).
      name: the key in logs.

    Example:
      >>> m = BinaryAccuracy(); m.update_state(jnp.array([[1], [0]]), jnp.array([[0.9], [0.7]]))
    """

    def __init__(
        self, name: str = "binary_accuracy", threshold: float = 0.5, dtype: Any = None
    ) -> None:
        self.threshold = float(threshold)
        super().__init__(None, name, dtype=dtype)

    def values(self, y_true: Any, y_pred: Any) -> jax.Array:
        return binary_accuracy(y_true, y_pred, self.threshold)


class SparseCategoricalAccuracy(MeanMetricWrapper):
    """How often `argmax(y_pred)` equals the integer label.

    Example:
      >>> m = SparseCategoricalAccuracy()
      >>> m.update_state(jnp.array([2, 1]), jnp.array([[0.1, 0.2, 0.7], [0.5, 0.3, 0.2]]))
    """

    def __init__(self, name: str = "sparse_categorical_accuracy", dtype: Any = None) -> None:
        super().__init__(sparse_categorical_accuracy, name, dtype=dtype)


class CategoricalAccuracy(MeanMetricWrapper):
    """How often `argmax(y_pred)` equals `argmax(y_true)` for one-hot labels.

    Example:
      >>> m = CategoricalAccuracy(); m.update_state(jnp.eye(3), jnp.eye(3))   # 1.0
    """

    def __init__(self, name: str = "categorical_accuracy", dtype: Any = None) -> None:
        super().__init__(categorical_accuracy, name, dtype=dtype)


class SparseTopKCategoricalAccuracy(MeanMetricWrapper):
    """How often the integer label is among the `k` highest predictions.

    Example:
      >>> m = SparseTopKCategoricalAccuracy(k=2)
    """

    def __init__(
        self, k: int = 5, name: str = "sparse_top_k_categorical_accuracy", dtype: Any = None
    ) -> None:
        self.k = _check_k(k)
        super().__init__(None, name, dtype=dtype)

    def values(self, y_true: Any, y_pred: Any) -> jax.Array:
        return sparse_top_k_categorical_accuracy(y_true, y_pred, self.k)


class TopKCategoricalAccuracy(MeanMetricWrapper):
    """How often the one-hot label's class is among the `k` highest predictions.

    Example:
      >>> m = TopKCategoricalAccuracy(k=2)
    """

    def __init__(
        self, k: int = 5, name: str = "top_k_categorical_accuracy", dtype: Any = None
    ) -> None:
        self.k = _check_k(k)
        super().__init__(None, name, dtype=dtype)

    def values(self, y_true: Any, y_pred: Any) -> jax.Array:
        return top_k_categorical_accuracy(y_true, y_pred, self.k)


class MeanSquaredError(MeanMetricWrapper):
    """The weighted mean of `(y_true - y_pred) ** 2` (trailing axes averaged per example)."""

    def __init__(self, name: str = "mean_squared_error", dtype: Any = None) -> None:
        super().__init__(squared_error, name, direction="down", dtype=dtype)


class MeanAbsoluteError(MeanMetricWrapper):
    """The weighted mean of `|y_true - y_pred|` (trailing axes averaged per example)."""

    def __init__(self, name: str = "mean_absolute_error", dtype: Any = None) -> None:
        super().__init__(absolute_error, name, direction="down", dtype=dtype)


def _check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}; e.g. k=5")
    return k
