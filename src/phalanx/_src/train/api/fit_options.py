"""`fit`'s `validation_split` and `class_weight`, with Keras's semantics, for array inputs.

Both act on the arrays before batching, so they cost nothing per step:

- `validation_split=f` holds out the *last* `floor(n * f)` rows of x, y and sample_weight
  (before any shuffling, as Keras does) and evaluates on them after every epoch.
- `class_weight={class: weight}` turns each example's label into a weight (classes not in
  the dict weigh 1.0) and multiplies it into `sample_weight`. Labels may be integers of
  shape (n,) / (n, 1) or one-hot / probability rows (the argmax is the class), as in Keras.
  Keras 3 refuses `class_weight` together with `sample_weight`; tf.keras multiplied them,
  and so does phalanx.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray | jax.Array)


def _all_arrays(*trees: Any) -> bool:
    leaves = [leaf for tree in trees for leaf in jax.tree.leaves(tree)]
    return bool(leaves) and all(_is_array(leaf) for leaf in leaves)


def validation_split(x: Any, y: Any, sample_weight: Any, fraction: float) -> tuple[Any, Any]:
    """Splits array inputs into `(x, y, sw)` for training and `(x, y, sw)` for validation.

    Args:
      x, y, sample_weight: arrays, or dicts / tuples of arrays, with the examples first
        (y and sample_weight may be None).
      fraction: in (0, 1); the last `floor(n * fraction)` rows are held out.

    Returns:
      `(train, validation)`, each an `(x, y, sample_weight)` tuple.

    Raises:
      ValueError: for a fraction outside (0, 1), inputs that are not arrays (a dataset),
        or too few rows to split.

    Example:
      >>> (x_t, y_t, _), (x_v, y_v, _) = validation_split(x, y, None, 0.2)
    """
    if isinstance(fraction, bool) or not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"validation_split must be a float in (0, 1), got {fraction!r}")
    if not _all_arrays(x, y, sample_weight):
        raise ValueError(
            "validation_split is only supported for NumPy / JAX array inputs (as in Keras); "
            f"got x of type {type(x).__name__}. For a dataset, pass validation_data= with a "
            "separate validation dataset"
        )
    n = int(jax.tree.leaves(x)[0].shape[0])
    split_at = math.floor(n * (1.0 - float(fraction)))
    if split_at in (0, n):
        raise ValueError(
            f"the training data has {n} examples, too few to hold out validation_split="
            f"{fraction} of them; pass more data or a different validation_split"
        )

    def part(tree: Any, start: int, stop: int | None) -> Any:
        return None if tree is None else jax.tree.map(lambda a: a[start:stop], tree)

    train = tuple(part(t, 0, split_at) for t in (x, y, sample_weight))
    val = tuple(part(t, split_at, None) for t in (x, y, sample_weight))
    return train, val


def class_weights(y: Any, class_weight: Mapping[int, float], sample_weight: Any) -> np.ndarray:
    """Per-example weights from `class_weight`, times `sample_weight` when given.

    Args:
      y: the labels of a single-output model: integers (n,) / (n, 1), or one-hot rows (n, C).
      class_weight: `{class index: weight}`; classes not listed weigh 1.0.
      sample_weight: None or per-example weights (n,) to multiply in.

    Returns:
      float32 weights of shape (n,).

    Raises:
      ValueError: for labels that are not one array (several outputs, a dataset, none).

    Example:
      >>> class_weights(np.array([0, 1, 1]), {1: 2.0}, None)
      array([1., 2., 2.], dtype=float32)
    """
    if not isinstance(class_weight, Mapping):
        raise ValueError(
            f"class_weight must be a dict {{class index: weight}}, got {class_weight!r}"
        )
    if not _is_array(y):
        raise ValueError(
            "class_weight needs the labels y as one NumPy / JAX array of a single-output model "
            f"(as in Keras); got y of type {type(y).__name__}. For several outputs or a "
            "dataset, pass per-example weights instead (sample_weight=, or batches of "
            "(x, y, sample_weight))"
        )
    labels = np.asarray(y)
    if labels.ndim > 1:
        labels = labels[..., 0] if labels.shape[-1] == 1 else np.argmax(labels, axis=-1)
    labels = np.round(labels).astype(np.int64).reshape(labels.shape[0], -1)[:, 0]
    classes = np.array(sorted(class_weight), dtype=np.int64)
    values = np.array([float(class_weight[c]) for c in sorted(class_weight)], np.float32)
    weights = np.ones(labels.shape[0], np.float32)
    if classes.size:
        where = np.searchsorted(classes, labels)
        found = (where < classes.size) & (classes[np.minimum(where, classes.size - 1)] == labels)
        weights[found] = values[where[found]]
    if sample_weight is not None:
        sw = np.asarray(sample_weight, np.float32)
        weights = (sw * weights.reshape((-1,) + (1,) * (sw.ndim - 1))).astype(np.float32)
    return weights


def step_count(value: Any, name: str) -> int | None:
    """`value` as a step count: None (the whole dataset) or an int >= 1.

    A count of 0 would run no step, and the loss would read 0.0 as if the model were perfect
    (EarlyStopping then trusts it), so it is refused with the other non-counts.

    Raises:
      ValueError: naming `name` and the value received.

    Example:
      >>> step_count(100, "steps_per_epoch")
      100
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(
            f"{name} must be an int >= 1, or None for the whole dataset; got {value!r}. "
            f"{name}=0 would run no step and log a loss of 0.0; e.g. {name}=100"
        )
    return int(value)
