"""TF's object-graph matching, onto Python objects that are not TensorFlow's.

TF restores a checkpoint by walking its object graph from the root: each child edge
`(node, name)` of a matched object is looked up on the Python object (`_lookup_dependency`),
and a node holding tensors restores into the object it matched. Keras 3 builds the same
attributes on every backend, so a Keras model or optimizer on JAX answers TF's edges by
the same names: `getattr` for an object (`_operations`, `_kernel`, `_trainable_variables`,
`_iterations`), an index for a list, a key for a dict.

Two things TF defers until the object exists, resolved here at once:
- an optimizer whose slots are not built yet (TF creates them at the first step and
  restores them then) is built on the variables its checkpoint node trains, when those
  were matched through the model;
- a node reached by two paths (the model's kernel, and the optimizer's
  `_trainable_variables/0`) is one node: both paths must lead to the same Python object.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any

from phalanx._src.train.api.keras_bridge import is_keras_object
from phalanx._src.train.checkpoint.record import CheckpointError
from phalanx._src.train.checkpoint.tf_format.object_graph import Node, with_values


@dataclasses.dataclass
class Walk:
    """The result of matching: `bound` node -> Python object, `where` node -> the Python
    path it was found at (in the style of TF's `(root).optimizer._variables.2`), and `lost`
    value-holding nodes that found no Python object -> where it was looked for."""

    bound: dict[int, Any]
    where: dict[int, str]
    lost: dict[int, str]


def child(obj: Any, name: str) -> Any:
    """The Python object TF's edge `name` leads to from `obj`, or None."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    if isinstance(obj, list | tuple):
        return obj[int(name)] if name.isdigit() and int(name) < len(obj) else None
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that cannot be computed yet: no such dependency now
        return None


def _is_unbuilt_optimizer(obj: Any) -> bool:
    return is_keras_object(obj, "optimizers.Optimizer") and not obj.built


def walk(nodes: list[Node], root: Any, where: str, trained: list[Any] | None = None) -> Walk:
    """Matches `nodes` (node 0 is `root`) onto Python objects, as TF's restore does.

    Args:
      nodes: the decoded object graph.
      root: the Python object of node 0 (a mapping of the root's children, or a model).
      where: the checkpoint, for messages.
      trained: what an unbuilt optimizer is built on when the variables its checkpoint
        node trains were not matched through a model (a subclassed Keras 3 model's layers
        in lists are not in TF's graph, only the optimizer reaches its variables): the one
        model's trainable variables, which TF's deferred restore meets at the first step.

    Raises:
      CheckpointError: one checkpoint node reached as two different Python objects.
    """
    walked = Walk({0: root}, {0: "(root)"}, {})
    values = with_values(nodes)
    queue = collections.deque([0])
    waiting: list[int] = []  # unbuilt optimizers: their slots come once the model matched
    while queue:
        index = queue.popleft()
        obj = walked.bound[index]
        if _is_unbuilt_optimizer(obj):
            waiting.append(index)
        else:
            for node, name in nodes[index].children:
                path = f"{walked.where[index]}.{name}"
                if node in values and _visit(node, path, child(obj, name), where, walked):
                    queue.append(node)
        if not queue:  # everything else matched: build what waits, and walk it
            queue.extend(n for n in waiting if _build(nodes, n, walked.bound, trained))
            waiting = [n for n in waiting if n not in queue]
    for index in waiting:
        walked.lost.setdefault(
            index,
            f"{walked.where[index]} (an optimizer not built yet, whose trained variables are "
            "not all in this Checkpoint: build it first, optimizer.build(model."
            "trainable_variables))",
        )
    for index, path in list(walked.lost.items()):
        for node in _below(nodes, index):
            if nodes[node].attributes:
                walked.lost.setdefault(node, path)
    walked.lost = {n: path for n, path in walked.lost.items() if n not in walked.bound}
    return walked


def _visit(node: int, path: str, found: Any, where: str, walked: Walk) -> bool:
    """Binds checkpoint `node`, reached at `path`, to the Python object `found`; True when
    it is newly bound (its children are to be walked)."""
    if found is None:
        walked.lost.setdefault(node, path)
        return False
    if node not in walked.bound:
        walked.bound[node], walked.where[node] = found, path
        return True
    if walked.bound[node] is not found:
        first, second = _describe(walked.bound[node]), _describe(found)
        raise CheckpointError(
            f"{where} stores one object that is reached as {walked.where[node]} and as {path}, "
            f"but here those are two different objects ({first} and {second}): build the "
            "objects as the ones saved (the same layers, optimizer class and learning-rate "
            "kind; an optimizer built on the model's own variables, or not built yet)"
        )
    return False


def _build(nodes: list[Node], index: int, bound: dict[int, Any], trained: Any) -> bool:
    """Builds the unbuilt optimizer of node `index` on the variables its checkpoint node
    trains (`_trainable_variables`): those matched through the model, else `trained` when
    their count is the checkpoint's; True if it was built."""
    lists = [node for node, name in nodes[index].children if name == "_trainable_variables"]
    refs = sorted(
        (int(name), node) for lst in lists for node, name in nodes[lst].children if name.isdigit()
    )
    variables = [bound.get(node) for _, node in refs]
    if refs and any(variable is None for variable in variables) and trained is not None:
        variables = list(trained) if len(trained) == len(refs) else variables
    if not refs or any(variable is None for variable in variables):
        return False
    bound[index].build(variables)
    return True


def _describe(obj: Any) -> str:
    path = getattr(obj, "path", None)
    return f"the variable {path}" if isinstance(path, str) else f"a {type(obj).__name__}"


def _below(nodes: list[Node], index: int) -> list[int]:
    seen, todo = {index}, [index]
    while todo:
        for node, _ in nodes[todo.pop()].children:
            if node not in seen:
                seen.add(node)
                todo.append(node)
    return sorted(seen)
