"""The plan behind a Dataset: a chain of random-access nodes that turn positions into rows.

Why random access: shuffle, repeat, shard, take and batch are all index arithmetic, so
(1) a whole batch is gathered with one fancy-indexing operation per array instead of one
Python call per record (~30 us each), (2) an iterator's position is just (epoch, step) and
restoring it costs nothing, and (3) a process can compute which rows of a global batch it
owns and read only those.

Every node has a `level`, a `length` (elements per iteration, None when infinite) and
`get(key, positions)`, which returns the elements at `positions` (an int64 array) of
iteration `key`. The level is only how those elements are held, never what they are: at
level 0 one pytree whose leaves stack the elements (a leaf whose elements differ in shape,
a ragged map's output, is an object array of the elements' arrays: `ragged`), at level 1 a
list of element pytrees (batches, or anything else that does not stack). A key is a tuple
of ints, `(epoch,)` at the top; repeat() appends the repetition so a shuffle below it draws
a fresh permutation each time round.

This module holds the node protocol, the in-memory source and helpers over a chain;
`index_ops` holds the index arithmetic (shuffle, repeat, shard, take, batch) and
`element_ops` the nodes that compute elements (map, cache).
"""

from __future__ import annotations

import dataclasses
import math
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
    structures = {jax.tree.structure(part) for part in parts}
    if len(structures) > 1:
        raise ValueError(
            "elements of different structures were joined (concatenate() needs datasets "
            f"whose elements have one structure, as tf.data's): {sorted(map(str, structures))}"
        )
    return jax.tree.map(lambda *arrays: join(arrays), *parts)


def join(arrays: Any) -> np.ndarray:
    """Stacked elements' leaves joined along the first axis; ragged when their shapes differ."""
    if len({a.shape[1:] for a in arrays}) == 1 and not any(is_ragged(a) for a in arrays):
        return np.concatenate(arrays)
    return ragged([row for a in arrays for row in as_rows(a)])


class Ragged(np.ndarray):
    """A 1-d object array of elements' leaves that do not stack (`ragged`).

    A subclass marks it (indexing, reshaping and pickling keep it): an object array of
    arrays given by the user stays what it is, legal on the host as tf.data's `as_numpy`
    object arrays are.
    """


def ragged(rows: Any) -> np.ndarray:
    """Elements' leaves that do not stack (different shapes), held as a 1-d object array.

    Why not a list: every level-0 node gathers, joins and reorders leaves as arrays, and an
    object array of the rows goes through all of it unchanged; a row read back (`a[i]`) is
    the element's own array. `index_ops.Batch` stacks such a leaf, or says to pad it.
    """
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out.view(Ragged)


def is_ragged(leaf: Any) -> bool:
    """Whether a stacked leaf holds elements of different shapes (see `ragged`)."""
    return isinstance(leaf, Ragged)


def as_rows(leaf: np.ndarray) -> np.ndarray:
    """A stacked leaf as `ragged` rows (itself if it already is)."""
    return leaf if is_ragged(leaf) else ragged(list(leaf))


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

    @property
    def cardinality(self) -> float | None:
        """Elements per iteration: a count, `math.inf`, or None when only iterating tells
        (a streaming node's, see `stream.Stream`)."""
        n = self.length
        return math.inf if n is None else n

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


@dataclasses.dataclass(eq=False)
class Elements(Node):
    """In-memory elements that need not stack (a window's, a group's): a list, level 1."""

    items: list[Any]

    level = 1

    @property
    def length(self) -> int:
        return len(self.items)

    def get(self, key: Key, positions: np.ndarray) -> Any:
        return [self.items[p] for p in positions]


@dataclasses.dataclass(eq=False)
class Listed(Node):
    """A level-0 parent's elements as a list (level 1), to sit beside a level-1 node in a
    zip or a concatenate: the level is how elements are held, so it never refuses an op."""

    parent: Node

    level = 1

    def get(self, key: Key, positions: np.ndarray) -> Any:
        leaves, treedef = jax.tree.flatten(self.parent.get(key, positions))
        return [treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(len(positions))]


def same_level(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """`nodes`, a level-0 one `Listed` when another is at level 1."""
    if len({n.level for n in nodes}) == 1:
        return nodes
    return tuple(n if n.level == 1 else Listed(n) for n in nodes)


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
