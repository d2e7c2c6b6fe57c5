"""Confusion-matrix metrics: Precision, Recall and Keras's thresholded AUC.

State: weighted counts of true/false positives/negatives per threshold, float32. Every
element of `y_pred` is one binary decision (multi-label outputs are flattened, as Keras does
with `multi_label=False`); an example's weight applies to all of its elements, so a padded
row (weight 0) adds nothing to any cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from phalanx._src.train.api.loss_base import align_rank
from phalanx._src.train.api.metrics.base import Metric, example_weights, safe_divide, zeros

# Keras's `backend.epsilon()`, which pads AUC's end thresholds to -eps and 1 + eps.
_EPSILON = 1e-7


def _prepare(
    y_true: Any, y_pred: Any, sample_weight: Any, class_id: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Labels as 0/1 float32, predictions as float32 and per-element weights, same shape."""
    y_true, y_pred = align_rank(
        jnp.asarray(y_true, jnp.float32),
        jnp.asarray(y_pred, jnp.float32),
        "confusion metrics (precision, recall, auc) need 0/1 labels shaped like the "
        "predictions (one-hot for several classes)",
    )
    if class_id is not None:
        y_true, y_pred = y_true[..., class_id, None], y_pred[..., class_id, None]
    weight = example_weights(sample_weight, y_pred.shape[0] if y_pred.ndim else None)
    if weight is None:
        weight = jnp.ones_like(y_pred)
    else:
        if 0 < weight.ndim < y_pred.ndim:
            weight = weight.reshape(weight.shape + (1,) * (y_pred.ndim - weight.ndim))
        weight = jnp.broadcast_to(weight, y_pred.shape)
    return (y_true != 0).astype(jnp.float32), y_pred, weight


def _check_thresholds(thresholds: float | Sequence[float] | None) -> tuple[tuple[float, ...], bool]:
    if thresholds is None:
        return (0.5,), True
    single = isinstance(thresholds, int | float)
    values = (float(thresholds),) if single else tuple(float(t) for t in thresholds)
    if not values or any(not 0.0 <= t <= 1.0 for t in values):
        raise ValueError(
            f"thresholds must be floats in [0, 1], got {thresholds!r}; e.g. thresholds=0.5 or "
            "thresholds=[0.3, 0.5, 0.7]"
        )
    return values, single


class _ThresholdCounts(Metric):
    """Precision and Recall: true positives and one other count per threshold.

    The ratio is `tp / (tp + other)`, where `other` is false positives (precision) or false
    negatives (recall); a prediction is positive when `y_pred > threshold`.
    """

    _OTHER: str  # "false_positives" or "false_negatives"

    def __init__(
        self,
        thresholds: float | Sequence[float] | None = None,
        class_id: int | None = None,
        name: str | None = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(name, dtype=dtype)
        self.thresholds, self._single = _check_thresholds(thresholds)
        self.class_id = class_id
        self.true_positives = zeros((len(self.thresholds),))
        setattr(self, self._OTHER, zeros((len(self.thresholds),)))

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        labels, y_pred, weight = _prepare(y_true, y_pred, sample_weight, self.class_id)
        thresholds = jnp.asarray(self.thresholds, jnp.float32).reshape((-1,) + (1,) * y_pred.ndim)
        predicted = (y_pred[None] > thresholds).astype(jnp.float32)
        axes = tuple(range(1, predicted.ndim))
        tp = jnp.sum(predicted * labels * weight, axis=axes)
        if self._OTHER == "false_positives":
            other = jnp.sum(predicted * (1.0 - labels) * weight, axis=axes)
        else:
            other = jnp.sum((1.0 - predicted) * labels * weight, axis=axes)
        counter = getattr(self, self._OTHER)
        self.true_positives[...] = self.true_positives[...] + tp
        counter[...] = counter[...] + other

    def result(self) -> jax.Array:
        tp = self.true_positives[...]
        value = safe_divide(tp, tp + getattr(self, self._OTHER)[...])
        return value[0] if self._single else value


class Precision(_ThresholdCounts):
    """The fraction of predicted positives (`y_pred > threshold`) that are positive.

    Args:
      thresholds: a float in [0, 1] (default 0.5), or a list of them (the result is then a
        vector, one precision per threshold).
      class_id: optional class index to restrict the metric to (for one-hot outputs).
      name: the key in logs (default 'precision').

    Example:
      >>> m = Precision(); m.update_state(jnp.array([1, 0, 1]), jnp.array([0.9, 0.8, 0.1]))
      >>> float(m.result())
      0.5
    """

    _OTHER = "false_positives"


class Recall(_ThresholdCounts):
    """The fraction of positives that are predicted positive (`y_pred > threshold`).

    Args:
      thresholds: a float in [0, 1] (default 0.5), or a list of them.
      class_id: optional class index to restrict the metric to (for one-hot outputs).
      name: the key in logs (default 'recall').

    Example:
      >>> m = Recall(); m.update_state(jnp.array([1, 0, 1]), jnp.array([0.9, 0.8, 0.1]))
      >>> float(m.result())
      0.5
    """

    _OTHER = "false_negatives"


_CURVES = ("ROC", "PR")
_SUMMATIONS = ("interpolation", "minoring", "majoring")


class AUC(Metric):
    """Area under the ROC or precision-recall curve, approximated as Keras does.

    Predictions are bucketed against `num_thresholds` evenly spaced thresholds
    (`[-1e-7, 1/(n-1), ..., (n-2)/(n-1), 1 + 1e-7]`), accumulating weighted TP/FP/TN/FN per
    threshold; the area is then a Riemann sum over the thresholds. With the defaults
    (`curve='ROC'`, `summation_method='interpolation'`) this is the trapezoidal rule; `'PR'`
    with interpolation uses Keras's closed form (Davis & Goadrich). The state is additive, so
    AUC merges exactly across replicas (unlike a rank-based AUC).

    Args:
      num_thresholds: number of thresholds, > 1 (default 200, as Keras).
      curve: 'ROC' or 'PR'.
      summation_method: 'interpolation', 'minoring' or 'majoring'.
      from_logits: apply a sigmoid to `y_pred` first.
      name: the key in logs.

    Example:
      >>> m = AUC()
      >>> m.update_state(jnp.array([0, 0, 1, 1]), jnp.array([0.1, 0.4, 0.35, 0.8]))
      >>> round(float(m.result()), 2)
      0.75
    """

    def __init__(
        self,
        num_thresholds: int = 200,
        curve: str = "ROC",
        summation_method: str = "interpolation",
        from_logits: bool = False,
        name: str = "auc",
        dtype: Any = None,
    ) -> None:
        super().__init__(name, dtype=dtype)
        if not isinstance(num_thresholds, int) or num_thresholds <= 1:
            raise ValueError(f"num_thresholds must be an int > 1, got {num_thresholds!r}")
        if str(curve).upper() not in _CURVES:
            raise ValueError(f"curve must be one of {_CURVES}, got {curve!r}; e.g. curve='PR'")
        if str(summation_method).lower() not in _SUMMATIONS:
            raise ValueError(
                f"summation_method must be one of {_SUMMATIONS}, got {summation_method!r}"
            )
        self.num_thresholds = num_thresholds
        self.curve = str(curve).upper()
        self.summation_method = str(summation_method).lower()
        self.from_logits = from_logits
        self.true_positives = zeros((num_thresholds,))
        self.false_positives = zeros((num_thresholds,))
        self.true_negatives = zeros((num_thresholds,))
        self.false_negatives = zeros((num_thresholds,))

    @property
    def thresholds(self) -> np.ndarray:
        """The thresholds, ascending, as Keras builds them."""
        n = self.num_thresholds
        inner = [(i + 1) / (n - 1) for i in range(n - 2)]
        return np.array([0.0 - _EPSILON, *inner, 1.0 + _EPSILON])

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        labels, y_pred, weight = _prepare(y_true, y_pred, sample_weight)
        if self.from_logits:
            y_pred = jax.nn.sigmoid(y_pred)
        n = self.num_thresholds
        # Keras's O(N + T) path for evenly spaced thresholds: bucket i collects predictions in
        # (t_i, t_{i+1}]; a reversed cumulative sum then counts `pred > t_i` per threshold.
        # The first threshold is -eps, so bucket -1 folds into bucket 0.
        flat_pred = jnp.clip(y_pred, 0.0, 1.0).reshape(-1)
        bucket = jnp.maximum(jnp.ceil(flat_pred * (n - 1)) - 1, 0).astype(jnp.int32)
        positives = (labels * weight).reshape(-1)
        negatives = ((1.0 - labels) * weight).reshape(-1)
        tp = _reverse_cumsum(jax.ops.segment_sum(positives, bucket, num_segments=n))
        fp = _reverse_cumsum(jax.ops.segment_sum(negatives, bucket, num_segments=n))
        self.true_positives[...] = self.true_positives[...] + tp
        self.false_positives[...] = self.false_positives[...] + fp
        self.false_negatives[...] = self.false_negatives[...] + (jnp.sum(positives) - tp)
        self.true_negatives[...] = self.true_negatives[...] + (jnp.sum(negatives) - fp)

    def result(self) -> jax.Array:
        tp, fp = self.true_positives[...], self.false_positives[...]
        tn, fn = self.true_negatives[...], self.false_negatives[...]
        if self.curve == "PR" and self.summation_method == "interpolation":
            return _interpolate_pr_auc(tp, fp, fn)
        recall = safe_divide(tp, tp + fn)
        if self.curve == "ROC":
            x, y = safe_divide(fp, fp + tn), recall
        else:
            x, y = recall, safe_divide(tp, tp + fp)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / 2.0
        elif self.summation_method == "minoring":
            heights = jnp.minimum(y[:-1], y[1:])
        else:
            heights = jnp.maximum(y[:-1], y[1:])
        return jnp.sum((x[:-1] - x[1:]) * heights)


def _reverse_cumsum(x: jax.Array) -> jax.Array:
    return jnp.flip(jnp.cumsum(jnp.flip(x)))


def _interpolate_pr_auc(tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
    """Keras's closed-form PR-AUC: precision interpolated linearly in TP between thresholds."""
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    dp = p[:-1] - p[1:]
    slope = safe_divide(dtp, jnp.maximum(dp, 0.0))
    intercept = tp[1:] - slope * p[1:]
    both_positive = (p[:-1] > 0) & (p[1:] > 0)
    ratio = jnp.where(both_positive, safe_divide(p[:-1], jnp.maximum(p[1:], 0.0)), 1.0)
    increment = safe_divide(
        slope * (dtp + intercept * jnp.log(ratio)), jnp.maximum(tp[1:] + fn[1:], 0.0)
    )
    return jnp.sum(increment)
