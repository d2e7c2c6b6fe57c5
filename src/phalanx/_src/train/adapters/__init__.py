"""Model adapters: one per framework, chosen by `adapt`; see `protocol.ModelAdapter`.

The engine sees a model only through its adapter: its variables as `(params, rest)`, a
pure `apply` (and `apply_with_losses`: the losses the model adds itself, such as Keras's
regularizers), and assigning trained values back to the user's object. `keras_loss` runs a
subclassed Keras model's own `compute_loss` and `compile`. A new framework adds
an adapter class to `ADAPTERS` and nothing else changes.

May import: `api` (precision, the Keras bridge) and the strategy layer; nothing above.
"""

from __future__ import annotations

from typing import Any

from phalanx._src.train.adapters.keras_adapter import KerasAdapter
from phalanx._src.train.adapters.nnx_adapter import NNXAdapter
from phalanx._src.train.adapters.protocol import ModelAdapter

# Tried in order; the first whose `accepts` says yes wraps the model. A new framework adds
# its adapter class here and nothing else changes.
ADAPTERS: tuple[type, ...] = (NNXAdapter, KerasAdapter)


def adapt(model: Any) -> ModelAdapter:
    """The adapter for `model`, or TypeError listing what phalanx accepts."""
    for adapter in ADAPTERS:
        if adapter.accepts(model):
            return adapter(model)
    raise TypeError(
        f"phalanx.Model cannot train a {type(model).__module__}.{type(model).__name__}; it "
        "accepts a Flax NNX module (class Net(nnx.Module): ...) or a Keras 3 model on the JAX "
        "backend (KERAS_BACKEND=jax)"
    )
