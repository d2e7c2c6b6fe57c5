"""`Loss`, the base of phalanx's losses: one float32 value per example, shape `(batch,)`.

Its own module so that the Keras bridge (`keras_bridge.losses`) can subclass it while
`losses.get` wraps Keras objects through the bridge: imports go one way.

Example:
  >>> class Hinge(Loss):
  ...     def call(self, y_true, y_pred):
  ...         return jnp.maximum(0.0, 1.0 - y_true * y_pred)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

# Keras's `backend.epsilon()`: probabilities are clipped to [EPSILON, 1 - EPSILON] before log.
EPSILON = 1e-7

LossFn = Callable[[Any, Any], jax.Array]


def _per_example(values: jax.Array) -> jax.Array:
    """Means every axis after the first, so the result has shape (batch,)."""
    if values.ndim <= 1:
        return values
    return jnp.mean(values, axis=tuple(range(1, values.ndim)))


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


class Loss:
    """Base class: a named callable returning one float32 loss per example.

    Subclasses implement `call(y_true, y_pred)` returning values of any shape whose first axis
    is the batch; `__call__` casts to float32 and means the trailing axes.

    Example:
      >>> class Huber(Loss):
      ...     def call(self, y_true, y_pred):
      ...         return optax.huber_loss(y_pred, y_true)
      >>> Huber(name="huber")(y, p).shape   # (batch,)
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name or _snake(type(self).__name__)

    def call(self, y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        raise NotImplementedError

    def __call__(self, y_true: Any, y_pred: Any) -> jax.Array:
        if isinstance(y_pred, dict | list | tuple):
            outputs = list(y_pred) if isinstance(y_pred, dict) else f"{len(y_pred)} outputs"
            raise ValueError(
                f"the model returns several outputs ({outputs}) but the loss {self.name!r} "
                "takes one; compile with one loss per output, e.g. loss={'a': 'mse', 'b': "
                "'mae'} for dict outputs or loss=['mse', 'mae'] for a tuple"
            )
        return _per_example(_float32(self.call(jnp.asarray(y_true), _float32(y_pred))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
