"""A Keras 3 metric object as a phalanx `Metric`, through `stateless_update_state`.

Keras's metric variables become the phalanx metric's `MetricState` arrays (so they are
carried through the compiled steps, summed across replicas by `strategy.run`, and
checkpointed); each update runs Keras's own code on them (`stateless_update_state`) and the
result is Keras's (`stateless_result`). Padded rows get weight 0. Keras's accumulators
(totals, counts, confusion-matrix cells) are sums, which is what the cross-replica merge
assumes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from phalanx._src.train.api.metrics.base import Metric, MetricState, example_weights

_DOWN_WORDS = ("loss", "error", "crossentropy", "hinge", "divergence", "poisson", "cosh")


class _Handle:
    """The Keras object, kept out of NNX's state (hashed by identity, so jit caches hold)."""

    def __init__(self, obj: Any, initial: tuple) -> None:
        self.obj = obj
        self.initial = initial


class KerasMetric(Metric):
    """A `keras.metrics.Metric` with phalanx's metric API and pytree state.

    Args:
      metric: the Keras metric object, e.g. `keras.metrics.CategoricalAccuracy()`; it is
        reset, and its name is the key in logs.

    Raises:
      ValueError: the metric has no variables yet (Keras metrics that create them on first
        use); call its `update_state` once on one batch before `compile`.

    Example:
      >>> m = KerasMetric(keras.metrics.AUC())
      >>> m.update_state(y, p); float(m.result())
    """

    def __init__(self, metric: Any) -> None:
        super().__init__(metric.name)
        if not metric.variables:
            raise ValueError(
                f"the Keras metric {metric.name!r} has no variables yet (it creates them on "
                "first use); call its update_state once on one batch before compile"
            )
        metric.reset_state()
        initial = tuple(np.asarray(v.value) for v in metric.variables)
        self._handle = _Handle(metric, initial)
        self.values = nnx.List([MetricState(jnp.asarray(v)) for v in initial])
        name = metric.name.lower()
        self.direction = "down" if any(w in name for w in _DOWN_WORDS) else "up"

    @property
    def keras_metric(self) -> Any:
        return self._handle.obj

    def _current(self) -> list[jax.Array]:
        return [v[...] for v in self.values]

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        rows = jax.tree.leaves(y_pred)[0].shape[0] if jax.tree.leaves(y_pred) else None
        weight = example_weights(sample_weight, rows)
        new = self.keras_metric.stateless_update_state(
            self._current(), y_true, y_pred, sample_weight=weight
        )
        for variable, value in zip(self.values, new, strict=True):
            variable[...] = jnp.asarray(value, variable[...].dtype)

    def result(self) -> jax.Array:
        return self.keras_metric.stateless_result(self._current())

    def reset_state(self) -> None:
        for variable, value in zip(self.values, self._handle.initial, strict=True):
            variable[...] = jnp.asarray(value)
