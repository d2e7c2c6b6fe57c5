"""What an exported model takes and returns: its inputs' specs and names, its outputs' names.

The inputs come from, in order: `input_signature=` (a `phalanx.data.TensorSpec`, or a
tuple, list or dict of them, the structure `predict` takes, each shape with its batch
dimension, None for any size); the inputs `fit`, `evaluate` or `predict` last saw (their
batch dimension made any-size); a functional or Sequential Keras model's own `inputs`.
Every input's first dimension is the batch, shared by all inputs; other None dimensions
are any-size too.

Names follow Keras's `export`: an input is named by its TensorSpec's `name`, else its dict
key, else a Keras model's input name, else `inputs` (one input) or `input_<i>`; outputs
are `output_0` for one array, `output_<i>` for a list or tuple, the keys for a dict.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import numpy as np

from phalanx._src.data.options import TensorSpec
from phalanx._src.train.api.keras_bridge import is_keras_object

_EXAMPLE = "input_signature=phalanx.data.TensorSpec((None, 784), 'float32')"


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The exported function's inputs: `specs` (a pytree of TensorSpec, batch first) and
    one name per leaf (flattened order)."""

    specs: Any
    names: tuple[str, ...]

    @property
    def leaves(self) -> list[TensorSpec]:
        return jax.tree.leaves(self.specs, is_leaf=_is_spec)

    def polymorphic(self) -> Any:
        """jax2tf / jax.export shapes: `"(b, 28, 28)"`, a symbol for every None size."""

        def shape(spec: TensorSpec, index: int) -> str:
            dims = ["b"] + [
                str(d) if d is not None else f"d{index}_{i}" for i, d in enumerate(spec.shape[1:])
            ]
            return f"({', '.join(dims)})"

        leaves, tree = jax.tree.flatten(self.specs, is_leaf=_is_spec)
        return jax.tree.unflatten(tree, [shape(s, i) for i, s in enumerate(leaves)])

    def examples(self, rows: int) -> Any:
        """Zero arrays of these specs with `rows` rows (other None sizes: 1)."""
        return jax.tree.map(
            lambda s: np.zeros((rows, *[1 if d is None else d for d in s.shape[1:]]), s.dtype),
            self.specs,
            is_leaf=_is_spec,
        )


def _is_spec(x: Any) -> bool:
    return isinstance(x, TensorSpec)


def _clean(name: str) -> str:
    """A name TF and ONNX accept as a tensor name."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-/]", "_", name).strip("/")
    return cleaned if cleaned and cleaned[0].isalnum() else f"input_{cleaned}"


def _as_spec(value: Any, where: str) -> TensorSpec:
    if isinstance(value, TensorSpec):
        spec = value
    elif hasattr(value, "shape") and hasattr(value, "dtype"):  # tf.TensorSpec, ShapeDtypeStruct
        shape = None if value.shape is None else tuple(value.shape)
        spec = TensorSpec(shape, np.dtype(getattr(value.dtype, "as_numpy_dtype", value.dtype)),
                          getattr(value, "name", None))  # fmt: skip
    else:
        raise TypeError(
            f"input_signature{where} is a {type(value).__name__}; give a "
            f"phalanx.data.TensorSpec per input (a tuple, list or dict of them for several), "
            f"e.g. {_EXAMPLE}"
        )
    if spec.shape is None or len(spec.shape) == 0 or spec.dtype == np.dtype(object):
        raise ValueError(
            f"input_signature{where} is {spec}: an exported input needs a known rank with a "
            f"batch dimension first, and a numeric dtype; e.g. {_EXAMPLE}"
        )
    return spec


def from_argument(signature: Any) -> Any:
    """`input_signature=` as a pytree of TensorSpec (a one-element list means its element,
    as Keras's `input_signature=[spec]`)."""
    if isinstance(signature, list) and len(signature) == 1:
        signature = signature[0]
    leaves, tree = jax.tree_util.tree_flatten_with_path(
        signature, is_leaf=lambda x: _is_spec(x) or hasattr(x, "dtype")
    )
    if not leaves:
        raise ValueError(f"input_signature is empty; e.g. {_EXAMPLE}")
    specs = [_as_spec(leaf, jax.tree_util.keystr(path)) for path, leaf in leaves]
    return jax.tree.unflatten(tree, specs)


def _keras_inputs(network: Any) -> Any:
    """A functional or Sequential Keras model's Input tensors (its `input` structure)."""
    if not is_keras_object(network, "Model"):
        return None
    try:
        return network.input  # subclassed models have none: AttributeError or ValueError
    except (AttributeError, ValueError):
        return None


def resolve(model: Any, signature: Any) -> Inputs:
    """The exported inputs of `model` (a `phalanx.Model`); see the module docstring.

    Raises:
      ValueError: nothing says what the model takes (no signature given, no data seen).
    """
    tensors = _keras_inputs(model.adapter.model)
    keras_names = [t.name for t in jax.tree.leaves(tensors)] if tensors is not None else []
    if signature is not None:
        specs = from_argument(signature)
    elif model.engine.input_spec is not None:
        specs = jax.tree.map(
            lambda a: TensorSpec((None, *a.shape[1:]), np.dtype(a.dtype)), model.engine.input_spec
        )
    elif tensors is not None:
        specs = jax.tree.map(lambda t: TensorSpec((None, *t.shape[1:]), t.dtype), tensors)
    else:
        raise ValueError(
            "export does not know the model's inputs: it has not seen data (fit, evaluate or "
            f"predict) and it is not a functional Keras model; pass {_EXAMPLE} (one "
            "TensorSpec per input, batch dimension first)"
        )
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(specs, is_leaf=_is_spec)[0]]
    leaves = jax.tree.leaves(specs, is_leaf=_is_spec)
    names = []
    for index, (path, spec) in enumerate(zip(paths, leaves, strict=True)):
        keys = [str(getattr(k, "key", "")) for k in path if hasattr(k, "key")]
        if spec.name:
            names.append(spec.name)
        elif keys:
            names.append("/".join(keys))
        elif len(keras_names) == len(leaves):
            names.append(keras_names[index])
        else:
            names.append("inputs" if len(leaves) == 1 else f"input_{index}")
    cleaned = tuple(_clean(n) for n in names)
    if len(set(cleaned)) != len(cleaned):
        raise ValueError(f"the exported inputs need distinct names, got {list(cleaned)}; name "
                         "them with TensorSpec(..., name='...')")  # fmt: skip
    return Inputs(specs, cleaned)


def output_names(outputs: Any) -> list[str]:
    """Keras's names for the exported outputs (flattened order)."""
    flat = jax.tree_util.tree_flatten_with_path(outputs)[0]
    if len(flat) == 1 and not flat[0][0]:
        return ["output_0"]
    names = []
    for index, (path, _) in enumerate(flat):
        keys = [str(k.key) for k in path if hasattr(k, "key")]
        names.append(_clean("/".join(keys)) if keys else f"output_{index}")
    return names
