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

    def apply_with_losses(
        self, params: Any, state: Any, inputs: Any, *, training: bool, mask: jax.Array
    ) -> tuple[Any, Any, list[jax.Array]]:
        """`apply`, also returning the losses the model adds itself, as float32 scalars:
        Keras's `model.losses` of this call (weight regularizers, `add_loss`, activity
        regularizers, each summed to a scalar), or what an NNX model's `extra_losses`
        function returns. The step adds their sum once per global batch (not per example
        or per replica), as Keras's `compute_loss` and tf.distribute's
        `scale_regularization_loss` do."""
        ...

    def compile_arguments(self, arguments: dict[str, Any], custom: dict[str, Any]) -> None:
        """Receives `compile`'s standard `arguments` (by name) and the `custom` keyword
        arguments phalanx does not know: the Keras adapter hands them to a subclassed
        model's own `compile`; raises TypeError for custom arguments nobody takes."""
        ...

    def set_extra_losses(self, fn: Any) -> None:
        """Sets `compile(extra_losses=fn)`; raises TypeError for a framework whose models
        carry their losses themselves (Keras)."""
        ...

    def current_losses(self, params: Any, state: Any) -> list[jax.Array]:
        """The extra loss terms for `params` / `state` now (what `Model.losses` returns)."""
        ...

    # Whether the model computes its loss itself (Keras's overridden `compute_loss`); the
    # step then calls `model_loss` (which only such adapters define) instead of the
    # compiled loss.
    overrides_loss: bool

    def model_loss(
        self,
        params: Any,
        state: Any,
        losses: list[jax.Array],
        batch: tuple[Any, Any, Any],
        y_pred: Any,
        mask: jax.Array | None,
        *,
        training: bool,
    ) -> tuple[jax.Array, Any]:
        """The model's own loss as per-example values `(rows,)` whose mean over the real
        rows is the model's loss of those rows, and the state it leaves; only when
        `overrides_loss`. `batch` is `(x, y, sample_weight)`; `losses` as
        `apply_with_losses` returned them; `mask` None when every row is real."""
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
