"""Keras 2's TF-format `save_weights` read into a Keras 3 model.

`tf_keras` (Keras 2) `model.save_weights("dir/weights")` writes an object-based TF
checkpoint whose root is the model: `layer_with_weights-N` is the N-th layer that has
weights (`layer-N` every layer), with that layer's variables below it (`kernel`, `bias`,
`gamma`, `moving_mean`...; a nested model's own `layer_with_weights-M`). Keras 3 builds
the same layers, so the N-th layer with weights of the Keras 3 model takes the N-th
`layer_with_weights`, each variable by its name when the names under the layer are
unique, else in order (as Keras's own legacy loaders match weights). The optimizer's
state is not read: `load_weights` loads weights, as Keras 3's does.

A checkpoint of `tf.train.Checkpoint(model=model, ...)` is read the same way as
`phalanx.Checkpoint(model=model).restore(prefix)`: its model only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phalanx._src.train.checkpoint.record import CheckpointError
from phalanx._src.train.checkpoint.tf_format.bundle import CheckpointReader
from phalanx._src.train.checkpoint.tf_format.object_graph import VALUE, Node
from phalanx._src.train.checkpoint.tf_format.restore import expected, fit, graph, restore_entries

_LAYER = "layer_with_weights-"


def _variables(nodes: list[Node], start: int) -> list[tuple[str, str]]:
    """(edge name, checkpoint key) of every variable below node `start`, depth first in
    the stored order, each node once."""
    out, seen = [], {start}

    def visit(index: int) -> None:
        for node, name in nodes[index].children:
            if node in seen:
                continue
            seen.add(node)
            if VALUE in nodes[node].attributes:
                out.append((name, nodes[node].attributes[VALUE]))
            visit(node)

    visit(start)
    return out


def _pairs(layer: Any, stored: list[tuple[str, str]], index: int, prefix: str) -> list:
    """(variable, checkpoint key) for one layer: by name when the names are unique."""
    weights = list(layer.weights)
    names = [name for name, _ in stored]
    if len(weights) != len(stored):
        raise CheckpointError(
            f"{prefix}: {_LAYER}{index} holds {len(stored)} variables {names}, but the "
            f"Keras 3 layer it maps onto, {layer.name!r} (the model's layer number {index} "
            f"that has weights), has {len(weights)}: {[w.name for w in weights]}; build the "
            "model with the layers of the one saved, in the same order"
        )
    by_name = dict(stored)
    if len(by_name) == len(stored) and all(w.name in by_name for w in weights):
        return [(w, by_name[w.name]) for w in weights]
    return [(w, key) for w, (_, key) in zip(weights, stored, strict=True)]


def load_weights(model: Any, prefix: str) -> None:
    """Reads the TF-format weights at `prefix` into the Keras 3 `model` (in place).

    Raises:
      CheckpointError: naming the layer, or the checkpoint key and the variable, when the
        checkpoint does not fit the model (nothing is assigned then).
    """
    reader = CheckpointReader(prefix)
    nodes = graph(reader)
    root = {name: node for node, name in nodes[0].children}
    numbered = sorted(
        (int(name[len(_LAYER) :]), node)
        for name, node in root.items()
        if name.startswith(_LAYER) and name[len(_LAYER) :].isdigit()
    )
    if not numbered:
        if "model" not in root:
            raise CheckpointError(
                f"{reader.prefix} is a TF checkpoint, but neither Keras 2's save_weights "
                f"(no {_LAYER}N) nor a tf.train.Checkpoint with a model entry; its entries: "
                f"{sorted(root)}. Restore it with phalanx.Checkpoint(name=object).restore"
            )
        status, _ = restore_entries(reader.prefix, {"model": model}, {"model": expected(model)})
        status.expect_partial()  # weights only, as load_weights: the optimizer stays
        return
    layers = [layer for layer in model.layers if layer.weights]
    if len(layers) != len(numbered):
        raise CheckpointError(
            f"{reader.prefix} holds {len(numbered)} layers with weights (Keras 2's "
            f"{_LAYER}0..{len(numbered) - 1}), the model has {len(layers)}: "
            f"{[layer.name for layer in layers]}; build the model with the layers of the one "
            "saved, in the same order"
        )
    planned = []
    for (index, node), layer in zip(numbered, layers, strict=True):
        for variable, key in _pairs(layer, _variables(nodes, node), index, reader.prefix):
            where = f"{_LAYER}{index} ({layer.name!r})"
            planned.append((variable, fit(reader.get_tensor(key), variable, key, where, prefix)))
    for variable, value in planned:
        variable.assign(np.asarray(value))
