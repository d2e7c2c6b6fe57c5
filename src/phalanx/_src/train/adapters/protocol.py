"""The model protocol: what the compiled steps need of a model framework.

The train, test and predict steps, the loop and the checkpoints never look at the model's
type. They ask an adapter for the model's variables as two pytrees of arrays, call its pure
forward pass, and write the values back into the user's object when asked. Flax NNX and
Keras are two implementations (`nnx_adapter.py`, `keras_adapter.py`); another framework
(e.g. Equinox) plugs in by implementing this protocol and adding its class to
`adapters.ADAPTERS`, without touching the step or the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np


class ModelAdapter(Protocol):
    """One framework's model, seen as pure functions of explicit state.

    `params` are the trainable floating-point variables, the pytree the optimizer updates,
    stored in the policy's variable dtype (float32). `state` is everything else the forward
    pass reads or writes: batch statistics, RNG state (keys, counters, seed generators),
    counters, caches. Both are pytrees of arrays whose structure never changes, so they can
    be donated, sharded and checkpointed.

    Attributes:
      model: the user's model object (an `nnx.Module`, a `keras.Model`, ...).
      resolves_keras_names: whether `compile` looks names phalanx does not know up in Keras.
    """

    model: Any
    # Whether `compile` also looks up names phalanx does not know ('nadam', 'huber') in
    # Keras for this model.
    resolves_keras_names: bool

    def __init__(self, model: Any) -> None:
        """Wraps the user's model; raises TypeError with a clear message if it cannot."""
        ...

    @classmethod
    def accepts(cls, model: Any) -> bool:
        """Whether `model` belongs to this framework. Must not import the framework unless
        the model's own module already did (so an optional framework costs nothing)."""
        ...

    def set_policy(self, policy: Any) -> None:
        """Sets the precision policy (`phalanx.mixed_precision.Policy`) `apply` computes in;
        called by `Model.compile` before `variables()`."""
        ...

    def variables(self) -> tuple[Any, Any]:
        """`(params, state)` as they are now in the user's object."""
        ...

    def apply(
        self, params: Any, state: Any, inputs: Any, *, training: bool, mask: jax.Array
    ) -> tuple[Any, Any]:
        """The pure forward pass, traceable under `jax.jit`, `jax.grad` and `lax.scan`.

        Args:
          params, state: as `variables()` returns them (possibly updated by earlier steps).
          inputs: the batch's model inputs (an array, a tuple or a dict of arrays).
          training: training mode (dropout on, batch statistics computed from the batch and
            their running averages updated, RNG state advanced) or inference mode (running
            averages, no dropout, `state` returned unchanged).
          mask: `(batch,)` float32, 1.0 for real rows and 0.0 for the padding of a partial
            batch; statistics over the batch (BatchNorm) must ignore the padded rows.

        Returns:
          `(outputs, new_state)`. All floating-point compute runs in the adapter's policy's
          compute dtype; normalisation statistics stay float32.
        """
        ...

    def assign(self, params: Any, state: Any) -> None:
        """Writes `params` and `state` into the user's model object, so the framework's own
        tools (saving, its own evaluate, calling the model) see the trained values."""
        ...

    def get_weights(self, params: Any, state: Any) -> list[np.ndarray]:
        """Every variable as a host NumPy array, in the framework's own order."""
        ...

    def set_weights(self, weights: Sequence[Any]) -> tuple[Any, Any]:
        """`(params, state)` from a `get_weights()` list; raises ValueError naming the
        first mismatch (count or shape)."""
        ...
