"""What a `phalanx.Checkpoint` holds: each keyword object's state, read and written back.

`tf.train.Checkpoint(model=..., optimizer=..., step=...)` tracks mutable objects and
restores them in place. Here each keyword object becomes one entry of a pytree of
`jax.Array`s, the same kind of state fit's checkpoints hold, so both are written by the same
code (`checkpointer.TrainCheckpointer`). Four kinds of object are understood:

* Flax NNX objects (modules, `nnx.Optimizer`, `phalanx.metrics` and `nnx.metrics`, `nnx.Rngs`):
  `nnx.state(obj)`, restored in place with `nnx.update`.
* Keras 3 models, layers, optimizers and metrics: their `variables`, restored in place with
  `variable.assign`.
* A compiled `phalanx.Model`: its whole training state (parameters, optimizer, metrics).
* Values (a `jax.Array`, NumPy array, int, float, bool, or a dict / list / tuple of them, such
  as a step counter or an optax state): immutable, so `restore` rebinds the checkpoint's
  attribute (`checkpoint.step`), keeping the Python type (an int stays an int).

Example:
  >>> entry = track("model", model)
  >>> state = entry.state()        # a pytree of jax.Arrays
  >>> entry.assign(state)          # in place (NNX, Keras, Model); a new value for values
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from phalanx._src.train.api import keras_bridge

_KERAS_BASES = ("Layer", "optimizers.Optimizer", "metrics.Metric")
_SCALARS = (bool, int, float)
SUPPORTED = (
    "a Flax NNX module, nnx.Optimizer, metric or nnx.Rngs; a Keras 3 model, layer, optimizer "
    "or metric; a compiled phalanx.Model; or a value (jax.Array, NumPy array, int, float, "
    "bool, or a dict / list / tuple of them)"
)


class Tracked:
    """One keyword object of a Checkpoint: its kind, its state, and how it takes one back."""

    def __init__(self, name: str, obj: Any, kind: str) -> None:
        self.name = name
        self.obj = obj
        self.kind = kind

    def state(self) -> Any:
        """The object's current state, a pytree of `jax.Array`s (NumPy arrays for values
        that are not yet on a device)."""
        if self.kind == "nnx":
            return nnx.state(self.obj)
        if self.kind == "keras":
            return {_keras_key(i, v): v.value for i, v in enumerate(self.obj.variables)}
        if self.kind == "phalanx.Model":
            state = self.obj.engine.state
            if state is None:
                raise ValueError(
                    f"the checkpoint entry {self.name!r} is a phalanx.Model that is not "
                    "compiled yet, so it has no training state to save or restore; call "
                    f"{self.name}.compile(...) before checkpointing it"
                )
            return state
        return jax.tree.map(_as_array, self.obj)

    def assign(self, state: Any) -> Any:
        """Writes `state` (the structure `state()` gave) into the object; returns the
        object, or for a value the new value (of the old one's Python types)."""
        if self.kind == "nnx":
            nnx.update(self.obj, state)
        elif self.kind == "keras":
            for i, variable in enumerate(self.obj.variables):
                variable.assign(state[_keras_key(i, variable)])
        elif self.kind == "phalanx.Model":
            self.obj.engine.state = state
        else:
            self.obj = jax.tree.map(_like, state, self.obj)
        return self.obj


def track(name: str, obj: Any) -> Tracked:
    """`obj` as a checkpoint entry named `name`.

    Raises:
      TypeError: naming the entry, for an object of no supported kind.
    """
    if nnx.graph.is_graph_node(obj):
        return Tracked(name, obj, "nnx")
    if any(keras_bridge.is_keras_object(obj, base) for base in _KERAS_BASES):
        return Tracked(name, obj, "keras")
    if type(obj).__name__ == "Model" and hasattr(getattr(obj, "engine", None), "state"):
        return Tracked(name, obj, "phalanx.Model")
    leaves = jax.tree.leaves(obj)
    bad = [leaf for leaf in leaves if not _is_value(leaf)]
    if bad or obj is None:
        what = type(bad[0] if bad else obj).__name__
        raise TypeError(
            f"phalanx.Checkpoint cannot save {name}={_short(obj)} (it holds a {what}); an "
            f"entry must be {SUPPORTED}. Pass the object that owns the state, e.g. "
            f"phalanx.Checkpoint({name}=model), or its arrays"
        )
    return Tracked(name, obj, "value")


def _keras_key(index: int, variable: Any) -> str:
    # Matched by order, as Keras's get_weights: paths hold layer names Keras makes unique
    # per model (dense, dense_1...). The name says which variable in errors.
    return f"{index:04d}_{variable.name}"


def _is_value(leaf: Any) -> bool:
    if isinstance(leaf, jax.Array | np.ndarray | np.generic):
        return jnp.dtype(leaf.dtype) != np.dtype(object)
    return isinstance(leaf, _SCALARS)


def _as_array(leaf: Any) -> Any:
    """A value's leaf for saving: a `jax.Array` as it is, anything else as a NumPy array
    (the checkpoint places it beside the other entries' arrays)."""
    return leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)


def _like(restored: jax.Array, old: Any) -> Any:
    """The restored leaf in the Python type of the value it replaces."""
    if isinstance(old, bool | int | float):
        return type(old)(restored.item())
    if isinstance(old, np.generic):
        return old.dtype.type(np.asarray(restored).item())
    if isinstance(old, np.ndarray):
        return np.asarray(restored).astype(old.dtype).reshape(np.shape(old))
    return restored


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."
