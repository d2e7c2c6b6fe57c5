"""A TF checkpoint restored into a `phalanx.Checkpoint`'s objects, matched as TF matches.

`tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)` saved in TensorFlow
restores into `phalanx.Checkpoint(model=model, optimizer=optimizer, step=0)` on JAX:
- a Keras 3 model, layer, optimizer or metric (or a compiled `phalanx.Model` wrapping a
  Keras model) is matched through the object graph (`matching`): variables, BatchNorm's
  moving statistics, every optimizer's slots, `iterations` (which drives a learning-rate
  schedule) and `learning_rate`;
- a value entry (an int, float or array) takes the variable saved under its name;
- the Checkpoint's `save_counter` continues TF's, so the next `save` is numbered after it.

Checked before anything is assigned: every variable of the objects given gets a value
(else CheckpointError naming the variable and the object path looked at), each value has
the variable's shape and fits its dtype exactly (int64 counters into int32 ones; else
CheckpointError naming the checkpoint key and the variable). Values for objects not given
are left unused, as in TF (see `status.RestoreStatus`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from phalanx._src.train.api.keras_bridge import is_keras_object
from phalanx._src.train.checkpoint.record import CheckpointError
from phalanx._src.train.checkpoint.status import RestoreStatus
from phalanx._src.train.checkpoint.tf_format.bundle import CheckpointReader
from phalanx._src.train.checkpoint.tf_format.matching import Walk, walk
from phalanx._src.train.checkpoint.tf_format.object_graph import GRAPH_KEY, VALUE, Node, decode


class Slot:
    """An immutable value of a Checkpoint (`step=0`, `save_counter`): restored by rebinding."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value
        self.shape = tuple(np.shape(value))
        self.dtype = np.asarray(value).dtype if not isinstance(value, jax.Array) else value.dtype


def graph(reader: CheckpointReader) -> list[Node]:
    """The checkpoint's object graph (CheckpointError for a name-based TF 1 checkpoint)."""
    if not reader.has_tensor(GRAPH_KEY):
        raise CheckpointError(
            f"{reader.prefix} has no object graph: it was written by TF 1's tf.train.Saver "
            "(names, not objects). Map its names onto your variables with "
            "phalanx.train.init_from_checkpoint(prefix, {name: variable})"
        )
    return decode(reader.get_tensor(GRAPH_KEY).reshape(()).item(), reader.prefix)


def _is_variable(obj: Any) -> bool:
    return isinstance(obj, Slot) or is_keras_object(obj, "Variable")


def fit(value: np.ndarray, target: Any, key: str, where: str, prefix: str) -> np.ndarray:
    """`value` as `target`'s shape and dtype, or CheckpointError naming both."""
    shape, dtype = tuple(target.shape), np.dtype(target.dtype)
    if value.shape != shape:
        raise CheckpointError(
            f"{prefix}: the value {key} has shape {list(value.shape)}, but the variable it "
            f"restores, {where} ({_name(target)}), has shape {list(shape)}; build the model "
            "with the shapes of the one saved"
        )
    if value.dtype == dtype:
        return value
    cast = value.astype(dtype)
    if not np.array_equal(cast.astype(value.dtype), value, equal_nan=value.dtype.kind in "fc"):
        raise CheckpointError(
            f"{prefix}: the value {key} is {value.dtype.name} and does not fit the "
            f"{dtype.name} variable {where} ({_name(target)}) exactly; make that variable "
            f"{value.dtype.name}"
        )
    return cast


def _name(target: Any) -> str:
    if isinstance(target, Slot):
        return target.name
    path = getattr(target, "path", None)
    return path if isinstance(path, str) else f"{type(target).__name__}{list(target.shape)}"


def plan(reader: CheckpointReader, walked: Walk, nodes: list[Node]) -> tuple[list, list]:
    """`([(target, key, value)...], [(unused key, where)...])`, every value checked."""
    assignments, unused = [], []
    for node, obj in walked.bound.items():
        for attribute, key in nodes[node].attributes.items():
            where = walked.where[node]
            if attribute != VALUE:  # e.g. a tf.data iterator's state: nothing here takes it
                unused.append((key, where))
                continue
            if not _is_variable(obj):
                raise CheckpointError(
                    f"{reader.prefix}: {key} is a variable, but {where} is a "
                    f"{type(obj).__name__}, not a variable; build the objects as the ones saved"
                )
            value = fit(reader.get_tensor(key), obj, key, where, reader.prefix)
            assignments.append((obj, key, value))
    for node, where in sorted(walked.lost.items()):
        unused.extend((key, where) for key in nodes[node].attributes.values())
    return assignments, unused


def expected(obj: Any) -> list[Any]:
    """The variables of entry `obj` that a restore must give a value."""
    if isinstance(obj, Slot):
        return [obj]
    if is_keras_object(obj, "Layer"):
        return list(obj.weights)  # not the seed generators' state, which TF does not save
    return list(obj.variables)  # an optimizer's or a metric's


def keras_root(name: str, obj: Any, kind: str) -> Any:
    """The object a Checkpoint entry is matched as (a phalanx.Model: its Keras model)."""
    if kind == "phalanx.Model":
        obj = obj.module
    if kind == "value":
        return Slot(name, obj)
    if kind == "nnx" or not any(
        is_keras_object(obj, base) for base in ("Layer", "optimizers.Optimizer", "metrics.Metric")
    ):
        raise TypeError(
            f"the checkpoint entry {name!r} is a {type(obj).__name__}, which TF's object graph "
            "cannot be matched onto (its names are Keras's); read the TF checkpoint by name "
            "with phalanx.train.init_from_checkpoint(prefix, {key: variable}) or "
            "phalanx.train.load_checkpoint(prefix)"
        )
    if is_keras_object(obj, "Layer") and not obj.built:
        raise ValueError(
            f"the Keras model {name!r} is not built, so it has no variables to restore into; "
            f"build it first (call it on a batch, or {name}.build(input_shape))"
        )
    return obj


def restore_entries(
    prefix: str, roots: dict[str, Any], must: dict[str, list[Any]]
) -> tuple[RestoreStatus, dict[str, np.ndarray]]:
    """Restores TF checkpoint `prefix` into `roots` (the root's children by name).

    Keras variables are assigned in place; the values for `Slot`s are returned by name.
    `must` lists, per entry, the variables that must get a value.
    """
    reader = CheckpointReader(prefix)
    nodes = graph(reader)
    models = [root for root in roots.values() if is_keras_object(root, "Layer")]
    trained = list(models[0].trainable_variables) if len(models) == 1 else None
    walked = walk(nodes, roots, reader.prefix, trained)
    assignments, unused = plan(reader, walked, nodes)
    got = {id(target) for target, _, _ in assignments}
    missing = [
        f"{entry}: {_name(variable)} {list(variable.shape)}"
        for entry, variables in must.items()
        for variable in variables
        if id(variable) not in got
    ]
    if missing:
        raise CheckpointError(
            f"{reader.prefix} holds no value for {len(missing)} variables of the objects given: "
            f"{missing[:6]}{' ...' if len(missing) > 6 else ''}; values left unused: "
            f"{[key for key, _ in unused[:4]]}. Build the objects as the ones saved (same "
            "layers, optimizer class and learning-rate kind), or pass only the ones saved"
        )
    slots = {}
    for target, _, value in assignments:
        if isinstance(target, Slot):
            slots[target.name] = value
        else:
            target.assign(value)
    return RestoreStatus(reader.prefix, unused, restored=len(assignments)), slots
