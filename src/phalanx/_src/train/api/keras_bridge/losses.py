"""A Keras 3 loss object as a phalanx per-example `Loss`.

Keras's own `__call__` runs with `reduction=None` (set on the user's object only while it is
traced, then restored: a copy would lose arguments some losses leave out of their config):
rank alignment, the loss function and its dtype are Keras's; the training step then weighs,
masks and averages the per-example values exactly as for phalanx's losses.
"""

from __future__ import annotations

from typing import Any

import jax

from phalanx._src.train.api.loss_base import Loss

# Keras's choice of accuracy for metrics=['accuracy'], by the loss's class name.
_IMPLIED_ACCURACY = {
    "SparseCategoricalCrossentropy": "sparse_categorical_accuracy",
    "CategoricalCrossentropy": "categorical_accuracy",
    "CategoricalFocalCrossentropy": "categorical_accuracy",
    "BinaryCrossentropy": "binary_accuracy",
    "BinaryFocalCrossentropy": "binary_accuracy",
}


class KerasLoss(Loss):
    """A `keras.losses.Loss` returning one float32 value per example.

    Args:
      loss: the Keras loss object, e.g. `keras.losses.CategoricalCrossentropy()`.

    Example:
      >>> loss = KerasLoss(keras.losses.Huber(delta=0.5))
      >>> loss(y_true, y_pred).shape   # (batch,)
    """

    def __init__(self, loss: Any) -> None:
        super().__init__(loss.name)
        self.keras_loss = loss
        # Read by metrics.get('accuracy'); None: decided from the shapes, as Keras does.
        self.implied_accuracy = _IMPLIED_ACCURACY.get(type(loss).__name__)

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        if y_pred.ndim == 1 and y_true.ndim <= 1:
            # Keras's losses average the last axis, which for predictions of shape (batch,)
            # is the batch itself: with a trailing axis of 1 they give one value per example.
            y_true, y_pred = y_true.reshape(-1, 1), y_pred[:, None]
        reduction = self.keras_loss.reduction
        self.keras_loss.reduction = None
        try:
            return self.keras_loss(y_true, y_pred)
        finally:
            self.keras_loss.reduction = reduction

    def __repr__(self) -> str:
        return f"KerasLoss({self.keras_loss!r})"


class ModelOwnLoss(Loss):
    """Stands for the loss of a Keras model that overrides `compute_loss`, compiled
    without `loss=`: the training step calls the model's `compute_loss` instead (see
    `adapters.keras_loss`), so there is no per-example function of `(y_true, y_pred)`.

    Example:
      >>> model.compile(optimizer="adam", student_loss_fn=..., alpha=0.1)  # a Distiller
      >>> model.loss.name
      'compute_loss'
    """

    def __init__(self) -> None:
        super().__init__("compute_loss")

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        raise TypeError(
            "this model computes its loss in its own compute_loss(x, y, y_pred, "
            "sample_weight), which needs the whole batch; call that, not model.loss"
        )
