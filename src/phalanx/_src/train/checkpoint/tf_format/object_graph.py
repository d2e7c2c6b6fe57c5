"""The `_CHECKPOINTABLE_OBJECT_GRAPH` of an object-based TF checkpoint, decoded.

    TrackableObjectGraph { repeated TrackableObject nodes = 1; }
    TrackableObject {
      repeated ObjectReference children = 1;       { int32 node_id = 1; string local_name = 2; }
      repeated SerializedTensor attributes = 2;    { string name = 1; string full_name = 2;
                                                     string checkpoint_key = 3; }
      repeated SlotVariableReference slot_variables = 3;
                                                   { int32 original_variable_node_id = 1;
                                                     string slot_name = 2;
                                                     int32 slot_variable_node_id = 3; }
    }

Node 0 is the root (the `tf.train.Checkpoint`, or the model of Keras's `save_weights`). An
object reached by several paths is one node, stored once: TF names its tensors by the
first path of a breadth-first walk from the root (so a Keras 3 model's trainable variables
sit under `optimizer/_trainable_variables/N` when an optimizer is saved beside it).
"""

from __future__ import annotations

import dataclasses

from phalanx._src.data.records.wire import WireError, fields
from phalanx._src.train.checkpoint.record import CheckpointError

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE = "VARIABLE_VALUE"  # a variable's attribute name


@dataclasses.dataclass
class Node:
    """One object of the graph: its named children, its tensors `{attribute: checkpoint
    key}` and its slot variables `(original node, slot name, slot node)`."""

    children: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    attributes: dict[str, str] = dataclasses.field(default_factory=dict)
    slots: list[tuple[int, str, int]] = dataclasses.field(default_factory=list)


def _text(buf: bytes, span: tuple[int, int]) -> str:
    return buf[span[0] : span[1]].decode("utf-8", "surrogateescape")


def _node(buf: bytes, start: int, end: int) -> Node:
    node = Node()
    for number, wire, part in fields(buf, start, end):
        if wire != 2:
            continue
        if number == 1:
            ref = {n: v for n, _, v in fields(buf, *part)}
            node.children.append((ref.get(1, 0), _text(buf, ref[2]) if 2 in ref else ""))
        elif number == 2:
            tensor = {n: v for n, _, v in fields(buf, *part)}
            name = _text(buf, tensor[1]) if 1 in tensor else ""
            node.attributes[name] = _text(buf, tensor[3]) if 3 in tensor else ""
        elif number == 3:
            slot = {n: v for n, _, v in fields(buf, *part)}
            node.slots.append(
                (slot.get(1, 0), _text(buf, slot[2]) if 2 in slot else "", slot.get(3, 0))
            )
    return node


def decode(serialized: bytes, where: str) -> list[Node]:
    """The graph's nodes, by id.

    Raises:
      CheckpointError: naming `where`, when the bytes are not a valid graph.
    """
    try:
        nodes = [_node(serialized, *span) for n, w, span in fields(serialized) if n == 1 and w == 2]
    except (WireError, KeyError) as error:
        raise CheckpointError(f"the object graph of {where} does not decode ({error})") from None
    for node in nodes:
        bad = [child for child, _ in node.children if not 0 <= child < len(nodes)]
        if bad:
            raise CheckpointError(
                f"the object graph of {where} is damaged: it names node {bad[0]} of {len(nodes)}"
            )
    if not nodes:
        raise CheckpointError(f"the object graph of {where} is empty")
    return nodes


def with_values(nodes: list[Node]) -> set[int]:
    """The nodes holding a tensor or leading to one (the others need no Python object)."""
    parents: dict[int, set[int]] = {}
    for index, node in enumerate(nodes):
        for child, _ in node.children:
            parents.setdefault(child, set()).add(index)
    found = {index for index, node in enumerate(nodes) if node.attributes}
    todo = list(found)
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent not in found:
                found.add(parent)
                todo.append(parent)
    return found
