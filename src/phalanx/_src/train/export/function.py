"""The exported computation: a pure function of the weights and the inputs.

`serving(model)` returns `(fn, weights)`: `fn(weights, inputs)` is the model's forward pass
in inference mode (BatchNorm's moving statistics, no Dropout), through the same adapter
`predict` uses, under the model's precision policy, with floating outputs cast to float32
as `predict` returns them. `weights` are the model's variables (parameters, then the
other state), each once, named by its path, as host arrays: the converters store them as
variables (SavedModel) or initializers (ONNX), never folded into the program. Random-key
state, which inference does not read, travels as constants of the program.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from phalanx._src.train.api import precision
from phalanx._src.train.api.keras_bridge import is_keras_object


@dataclasses.dataclass(frozen=True)
class Weight:
    """One variable of the exported model."""

    name: str
    value: np.ndarray
    trainable: bool


def _host(array: Any) -> np.ndarray:
    if isinstance(array, jax.Array) and not array.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(jax.device_get(array))


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _names(model: Any, params: Any, rest: Any) -> list[str]:
    network = model.adapter.model
    if is_keras_object(network, "Model"):  # Keras's own variable paths, in the adapter's order
        return [v.path for v in (*network.trainable_variables, *network.non_trainable_variables)]
    paths = jax.tree_util.tree_flatten_with_path({"params": params, "state": rest})[0]
    return [
        "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
        for path, _ in paths
    ]


def serving(model: Any) -> tuple[Callable[[list[Any], Any], Any], list[Weight], list[Any]]:
    """The inference function of `model` (a `phalanx.Model`), its weights as host arrays,
    and the same weights as they are on the devices (to run `fn` without a second copy);
    see above."""
    adapter = model.adapter
    state = model.engine.state
    if state is None:  # not compiled: the module's own values, the global precision policy
        adapter.set_policy(precision.get(None))
        params, rest = adapter.variables()
    else:
        params, rest = state["params"], state["rest"]
    leaves, tree = jax.tree.flatten({"params": params, "rest": rest})
    names = _names(model, params, rest)
    trainable = len(jax.tree.leaves(params))
    weights, on_devices, constants = [], [], {}
    for index, (leaf, name) in enumerate(zip(leaves, names, strict=True)):
        if _is_key(leaf):
            constants[index] = leaf
        else:
            clean = re.sub(r"[^A-Za-z0-9_./\-]", "_", name)
            weights.append(Weight(clean, _host(leaf), index < trainable))
            on_devices.append(leaf)
    slots = [i for i in range(len(leaves)) if i not in constants]

    def fn(values: list[Any], inputs: Any) -> Any:
        filled = dict(constants)
        filled.update(zip(slots, values, strict=True))
        variables = jax.tree.unflatten(tree, [filled[i] for i in range(len(leaves))])
        rows = jax.tree.leaves(inputs)[0].shape[0]
        outputs, _ = adapter.apply(
            variables["params"],
            variables["rest"],
            inputs,
            training=False,
            mask=jnp.ones((rows,), jnp.float32),
        )
        return jax.tree.map(
            lambda y: y.astype(jnp.float32) if jnp.issubdtype(y.dtype, jnp.floating) else y,
            outputs,
        )

    return fn, weights, on_devices
