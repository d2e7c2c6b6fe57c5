"""`init_from_checkpoint`: a TF checkpoint's tensors into chosen variables, by name.

For models whose structure TF's object graph cannot name (Flax NNX modules, or a Keras
model built differently from the one saved), as TF 1's `tf.train.init_from_checkpoint`
maps checkpoint names onto variables: list the names with `list_variables(prefix)`, then
pass `{checkpoint name: variable}`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from phalanx._src.train.api.keras_bridge import is_keras_object
from phalanx._src.train.checkpoint.tf_format.bundle import load_checkpoint
from phalanx._src.train.checkpoint.tf_format.restore import fit

SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _key(reader: Any, name: str) -> str:
    for key in (name, name + SUFFIX):
        if reader.has_tensor(key):
            return key
    near = [k for k in reader.names() if name.split("/")[-1] in k][:6]
    raise KeyError(
        f"{name!r} is not in the checkpoint {reader.prefix} (nor {name + SUFFIX!r}); names "
        f"ending alike: {near}; list them all with phalanx.train.list_variables(prefix)"
    )


def _set(target: Any, value: np.ndarray) -> None:
    if isinstance(target, nnx.Variable):
        old = target.get_value()
        target.set_value(
            jax.device_put(value, old.sharding) if isinstance(old, jax.Array) else value
        )
    else:
        target.assign(value)


def init_from_checkpoint(
    ckpt_dir_or_file: str | os.PathLike, assignment_map: Mapping[str, Any]
) -> None:
    """Sets variables from a TF checkpoint's tensors, by name, without TensorFlow.

    Every name and shape is checked before anything is set.

    Args:
      ckpt_dir_or_file: a TF checkpoint prefix, or a folder with TF's `checkpoint` file.
      assignment_map: `{checkpoint name: variable}`; a name as `list_variables` gives it
        (the `/.ATTRIBUTES/VARIABLE_VALUE` suffix may be left out), a variable an
        `nnx.Variable` (`nnx.Param`, `nnx.BatchStat`...) or a Keras variable.

    Raises:
      KeyError: a name the checkpoint does not hold (similar names are listed).
      TypeError: a target that is not a variable.
      CheckpointError: naming the key and the variable, when a shape differs or a dtype
        does not fit exactly.

    Example:
      >>> phalanx.train.list_variables(prefix)[:2]
      [('_CHECKPOINTABLE_OBJECT_GRAPH', []), ('layer_with_weights-0/bias/...', [8])]
      >>> phalanx.train.init_from_checkpoint(prefix, {
      ...     "layer_with_weights-0/kernel": module.l1.kernel,
      ...     "layer_with_weights-0/bias": module.l1.bias,
      ... })
    """
    reader = load_checkpoint(ckpt_dir_or_file)
    planned = []
    for name, target in assignment_map.items():
        if not (isinstance(target, nnx.Variable) or is_keras_object(target, "Variable")):
            raise TypeError(
                f"init_from_checkpoint maps {name!r} onto a {type(target).__name__}; map each "
                "name onto a variable: an nnx.Variable (e.g. module.linear.kernel) or a Keras "
                "variable (e.g. layer.kernel)"
            )
        key = _key(reader, name)
        value = target.get_value() if isinstance(target, nnx.Variable) else target
        where = f"the {type(target).__name__} mapped from {name!r}"
        planned.append((target, fit(reader.get_tensor(key), value, key, where, reader.prefix)))
    for target, value in planned:
        _set(target, value)
