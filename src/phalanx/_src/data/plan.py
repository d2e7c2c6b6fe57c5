"""The plan behind a Dataset: a chain of random-access nodes that turn positions into rows.

Why random access: shuffle, repeat, shard, take and batch are all index arithmetic, so
(1) a whole batch is gathered with one fancy-indexing operation per array instead of one
Python call per record (~30 us each), (2) an iterator's position is just (epoch, step) and
restoring it costs nothing, and (3) a process can compute which rows of a global batch it
owns and read only those.

Every node has a `level` (0: its elements are rows; 1: they are batches), a `length`
(elements per iteration, None when infinite) and `get(key, positions)`, which returns the
elements at `positions` (an int64 array) of iteration `key`: at level 0 one pytree whose
leaves are stacked rows, at level 1 a list of batch pytrees. A key is a tuple of ints,
`(epoch,)` at the top; repeat() appends the repetition so a shuffle below it draws a fresh
permutation each time round.

This module holds the node protocol, the in-memory source and helpers over a chain;
`index_ops` holds the index arithmetic (shuffle, repeat, shard, take, batch) and
`element_ops` the nodes that compute elements (map, cache).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

Key = tuple[int, ...]


def concat(level: int, parts: list[Any]) -> Any:
    """Joins the results of several `get` calls, in order."""
    if len(parts) == 1:
        return parts[0]
    if level == 1:
        return [batch for part in parts for batch in part]
    return jax.tree.map(lambda *arrays: np.concatenate(arrays), *parts)


def pick(level: int, elements: Any, index: np.ndarray) -> Any:
    """Reorders the result of a `get` call."""
    if level == 1:
        return [elements[i] for i in index]
    return jax.tree.map(lambda a: a[index], elements)


class Node:
    """One step of the plan; subclasses are dataclasses with a `parent` (except Source)."""

    parent: Node

    @property
    def level(self) -> int:
        return self.parent.level

    @property
    def length(self) -> int | None:
        return self.parent.length

    def get(self, key: Key, positions: np.ndarray) -> Any:
        raise NotImplementedError


@dataclasses.dataclass(eq=False)
class Source(Node):
    """In-memory arrays; the one place rows are read, with one gather per leaf."""

    leaves: list[np.ndarray]
    treedef: Any

    level = 0

    @property
    def length(self) -> int:
        return len(self.leaves[0])

    @staticmethod
    def single_leaf() -> Any:
        """The treedef of a source with one bare array."""
        return jax.tree.structure(0)

    def get(self, key: Key, positions: np.ndarray) -> Any:
        # Fancy indexing copies, which matters: a device_put of a view could alias (and a
        # donated step could then clobber) the user's arrays on the CPU backend.
        return self.treedef.unflatten([leaf[positions] for leaf in self.leaves])


def parents(node: Node) -> tuple[Node, ...]:
    """The nodes `node` reads from: `parents` (zip, concatenate), `parent`, or none."""
    many = getattr(node, "parents", None)
    if many is not None:
        return tuple(many)
    return (node.parent,) if hasattr(node, "parent") else ()


def chain(root: Node) -> list[Node]:
    """Every node under `root` and `root` itself, sources first (depth first, in order)."""
    nodes: list[Node] = []
    for parent in parents(root):
        nodes.extend(chain(parent))
    nodes.append(root)
    return nodes


def rebuild(root: Node, change: Callable[[Node], Node]) -> Node:
    """A fresh copy of the tree (empty caches) with `change` applied to every node.

    `change` sees the nodes in `chain` order, so sources first.
    """
    if hasattr(root, "parents"):
        node = dataclasses.replace(root, parents=tuple(rebuild(p, change) for p in root.parents))
    elif hasattr(root, "parent"):
        node = dataclasses.replace(root, parent=rebuild(root.parent, change))
    else:
        node = dataclasses.replace(root)
    return change(node)


def element(root: Node, key: Key, step: int) -> Any:
    """Element `step` of iteration `key`: a batch at level 1, a single row at level 0."""
    elements = root.get(key, np.array([step], np.int64))
    if root.level == 1:
        return elements[0]
    return jax.tree.map(lambda a: a[0], elements)


def order_states(root: Node) -> list[dict]:
    """What decides the order of the chain's sources that have a say in it (record files:
    their files and interleave width; see `records/fingerprint.py`), sources first."""
    return [node.order_state() for node in chain(root) if hasattr(node, "order_state")]


def with_order_states(root: Node, saved: list[Any]) -> Node:
    """The chain reading its sources in the saved order (`restore_order` of each: the same
    node, one at the saved width, or an error), sources first.

    Raises:
      ValueError: a source whose saved order cannot be continued exactly, or a state with
        another number of such sources.
    """
    nodes = [node for node in chain(root) if hasattr(node, "order_state")]
    if not isinstance(saved, list) or len(saved) != len(nodes):
        raise ValueError(
            f"the state describes the order of {saved!r} where this dataset reads "
            f"{len(nodes)} record sources; restore a state saved from the same pipeline"
        )
    restored = [node.restore_order(state) for node, state in zip(nodes, saved, strict=True)]
    if all(new is old for new, old in zip(restored, nodes, strict=True)):
        return root
    states = iter(saved)

    def change(node: Node) -> Node:  # the copies of the nodes checked above
        return node.restore_order(next(states)) if hasattr(node, "order_state") else node

    return rebuild(root, change)


def with_max_open(root: Node, limit: int) -> Node:
    """The chain with every node that opens files (`max_open`) keeping at most `limit`
    open (`Options().experimental_max_open_files`); `root` itself when none changes."""
    if all(getattr(node, "max_open", limit) == limit for node in chain(root)):
        return root

    def change(node: Node) -> Node:
        if getattr(node, "max_open", limit) == limit:
            return node
        return dataclasses.replace(node, max_open=limit)

    return rebuild(root, change)
