"""`metrics.get`: Keras's metric strings to metric objects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from phalanx._src.train.api import losses as losses_lib
from phalanx._src.train.api.metrics.base import Metric
from phalanx._src.train.api.metrics.confusion import AUC, Precision, Recall
from phalanx._src.train.api.metrics.mean import (
    BinaryAccuracy,
    CategoricalAccuracy,
    MeanAbsoluteError,
    MeanMetricWrapper,
    MeanSquaredError,
    SparseCategoricalAccuracy,
    SparseTopKCategoricalAccuracy,
    TopKCategoricalAccuracy,
)

_BY_NAME: dict[str, type[Metric]] = {
    "binary_accuracy": BinaryAccuracy,
    "categorical_accuracy": CategoricalAccuracy,
    "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "top_k_categorical_accuracy": TopKCategoricalAccuracy,
    "sparse_top_k_categorical_accuracy": SparseTopKCategoricalAccuracy,
    "precision": Precision,
    "recall": Recall,
    "auc": AUC,
    "mse": MeanSquaredError,
    "mean_squared_error": MeanSquaredError,
    "mae": MeanAbsoluteError,
    "mean_absolute_error": MeanAbsoluteError,
}
_ACCURACY = ("accuracy", "acc")

# Which accuracy a loss implies (Keras's choice for metrics=['accuracy']).
_ACCURACY_FOR_LOSS: dict[type, type[Metric]] = {
    losses_lib.SparseCategoricalCrossentropy: SparseCategoricalAccuracy,
    losses_lib.CategoricalCrossentropy: CategoricalAccuracy,
    losses_lib.BinaryCrossentropy: BinaryAccuracy,
}


def _accuracy_from_shapes(y_true_shape: Sequence[int], y_pred_shape: Sequence[int]) -> type[Metric]:
    """Keras 3's rule: one output unit is binary; labels one rank lower (or a trailing 1)
    are sparse; otherwise categorical."""
    if len(y_pred_shape) and y_pred_shape[-1] == 1:
        return BinaryAccuracy
    if len(y_true_shape) == len(y_pred_shape) - 1 or (
        len(y_true_shape) == len(y_pred_shape) and y_true_shape[-1] == 1
    ):
        return SparseCategoricalAccuracy
    return CategoricalAccuracy


def _accuracy_class(
    loss: Any, y_true_shape: Sequence[int] | None, y_pred_shape: Sequence[int] | None
) -> type[Metric]:
    resolved = None
    if loss is not None:
        try:
            resolved = losses_lib.get(loss)
        except (TypeError, ValueError):
            resolved = None
    for loss_type, metric_type in _ACCURACY_FOR_LOSS.items():
        if isinstance(resolved, loss_type):
            return metric_type
    if y_true_shape is not None and y_pred_shape is not None:
        return _accuracy_from_shapes(tuple(y_true_shape), tuple(y_pred_shape))
    raise ValueError(
        f"metrics='accuracy' cannot tell sparse, categorical or binary accuracy apart with "
        f"loss={loss!r} and no shapes; pass a crossentropy loss, the label and prediction "
        "shapes (y_true_shape=, y_pred_shape=), or the metric itself, e.g. "
        "metrics=['sparse_categorical_accuracy']"
    )


def _from_keras(identifier: Any, loss: Any) -> Metric | None:
    """A Keras 3 metric object, or a name only Keras knows (when keras is imported), as a
    `keras_bridge.metrics.KerasMetric`; 'accuracy' for a Keras loss as Keras picks it; None
    for anything else."""
    from phalanx._src.train.api import keras_bridge

    implied = getattr(loss, "implied_accuracy", None)  # a keras_bridge.losses.KerasLoss
    if isinstance(identifier, str) and identifier.lower() in _ACCURACY and implied:
        return _BY_NAME[implied](name=identifier)
    if isinstance(identifier, str) and identifier.lower() not in (*_BY_NAME, *_ACCURACY):
        identifier = keras_bridge.keras_by_name("metrics", identifier)
    if not keras_bridge.is_keras_object(identifier, "metrics.Metric"):
        return None
    from phalanx._src.train.api.keras_bridge.metrics import KerasMetric

    return KerasMetric(identifier)


def get(
    identifier: str | Metric | Callable[[Any, Any], Any],
    loss: Any = None,
    *,
    y_true_shape: Sequence[int] | None = None,
    y_pred_shape: Sequence[int] | None = None,
) -> Metric:
    """Resolves a Keras metric identifier to a fresh `Metric`.

    'accuracy' / 'acc' picks the accuracy the loss implies, as Keras does:
    sparse_categorical_crossentropy -> SparseCategoricalAccuracy, categorical_crossentropy ->
    CategoricalAccuracy, binary_crossentropy -> BinaryAccuracy; for other losses it follows
    Keras 3's shape rule when `y_true_shape` / `y_pred_shape` are given. A string identifier
    becomes the metric's name, so logs show exactly what the user wrote ('acc', 'mae').

    Args:
      identifier: a name ('accuracy', 'acc', 'binary_accuracy', 'categorical_accuracy',
        'sparse_categorical_accuracy', 'top_k_categorical_accuracy',
        'sparse_top_k_categorical_accuracy', 'precision', 'recall', 'auc', 'mse' /
        'mean_squared_error', 'mae' / 'mean_absolute_error'), a `Metric` (returned as is), or
        a function `(y_true, y_pred) -> per-example values` (averaged with weights).
      loss: the model's loss (a name, `Loss` or function); only used for 'accuracy'.
      y_true_shape: shape of one batch of labels; only used for 'accuracy'.
      y_pred_shape: shape of one batch of predictions; only used for 'accuracy'.

    Returns:
      A `Metric` with empty state.

    Raises:
      ValueError: for an unknown name (the message lists the legal ones), or 'accuracy'
        that cannot be resolved.
      TypeError: for an identifier of another type.

    Example:
      >>> get("accuracy", loss="sparse_categorical_crossentropy")   # SparseCategoricalAccuracy
      >>> get("auc").name
      'auc'
    """
    if isinstance(identifier, Metric):
        return identifier
    keras_metric = _from_keras(identifier, loss)
    if keras_metric is not None:
        return keras_metric
    if isinstance(identifier, str):
        key = identifier.lower()
        if key in _ACCURACY:
            return _accuracy_class(loss, y_true_shape, y_pred_shape)(name=identifier)
        cls = _BY_NAME.get(key)
        if cls is None:
            legal = sorted((*_BY_NAME, *_ACCURACY))
            raise ValueError(
                f"unknown metric {identifier!r}; legal names are {legal}, or pass a "
                "phalanx.metrics.Metric or a function (y_true, y_pred) -> per-example values, "
                "e.g. metrics=['accuracy']"
            )
        return cls(name=identifier)
    if callable(identifier):
        return MeanMetricWrapper(identifier, getattr(identifier, "__name__", None))
    raise TypeError(
        f"a metric must be a name, a phalanx.metrics.Metric or a function (y_true, y_pred) -> "
        f"per-example values; got {identifier!r} of type {type(identifier).__name__}"
    )
