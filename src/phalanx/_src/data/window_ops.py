"""Ops that gather elements into datasets: `window` and `group_by_window`.

Both stream (`stream`). A window is a structure of datasets, one per leaf of the element
(tf.data's rule: `ds.window(3)` over `(x, y)` pairs yields `(x_window, y_window)`), usually
flattened back with `flat_map`; a group is one dataset of whole elements, handed with its
key to `reduce_func`. The datasets are made by `make` (the `Dataset` builder, which this
layer cannot import) over an in-memory source: the stacked elements, or a list of them when
their shapes differ.

State: a window pass saves the parent's state at the current window's first element (read
once every `shift` elements) and the number of windows made, so a restore re-reads at most
one window. A grouping pass saves the counts of elements read and groups flushed plus the
position inside the current group's dataset; a restore reads the elements again to rebuild
the groups being filled (their elements are not saved), which costs one re-read of that
part of the epoch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from phalanx._src.data import plan
from phalanx._src.data.element_ops import stack
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.stream import Stream, _get, call, open_node
from phalanx._src.data.stream_nested import dataset_cursor

Make = Callable[[Node], Any]  # a plan node -> the Dataset over it


def elements_node(elements: list[Any]) -> Node:
    """An in-memory node of `elements`: stacked when every leaf stacks, else a list."""
    leaves, treedef = jax.tree.flatten(elements[0])
    columns = [treedef.flatten_up_to(e) for e in elements]
    stacked = [stack(tuple(column[i] for column in columns)) for i in range(len(leaves))]
    if any(plan.is_ragged(leaf) for leaf in stacked):
        return plan.Elements(list(elements))
    return plan.Source(stacked, treedef)


@dataclasses.dataclass(eq=False)
class Window(Stream):
    """tf.data's window: element k holds the parent's elements k*shift + i*stride, i < size."""

    parent: Node
    size: int
    shift: int
    stride: int
    drop_remainder: bool
    make: Make

    @property
    def cardinality(self) -> float | None:
        n = self.parent.cardinality
        if n is None or n == math.inf:
            return n
        if not self.drop_remainder:
            return -(-n // self.shift)
        span = (self.size - 1) * self.stride + 1
        return 0 if n < span else (n - span) // self.shift + 1

    def open(self, key: Key, state: dict | None) -> Any:
        return _WindowCursor(self, key, state)

    def datasets(self, elements: list[Any]) -> Any:
        """The window's structure of datasets, one per leaf of the elements."""
        leaves, treedef = jax.tree.flatten(elements[0])
        columns = [treedef.flatten_up_to(e) for e in elements]
        return treedef.unflatten(
            [self.make(elements_node([c[i] for c in columns])) for i in range(len(leaves))]
        )


class _WindowCursor:
    def __init__(self, node: Window, key: Key, state: dict | None) -> None:
        self.node = node
        self.made = int(_get(state, "made"))
        self.index = int(_get(state, "index"))  # the parent's next element
        self.parent = open_node(node.parent, key, _get(state, "parent", None))
        self.buffer: list[Any] = []  # elements self.start, ..., self.index - 1
        self.starts: dict[int, dict] = {}  # parent states before later windows' first elements
        self.ended = False

    @property
    def start(self) -> int:
        return self.made * self.node.shift

    def _read(self) -> None:
        i = self.index
        if i % self.node.shift == 0 and i >= self.start:  # a window starts here
            self.starts[i] = self.parent.state()
        element = next(self.parent)
        self.index += 1
        if i >= self.start:  # elements between windows (shift > size) are passed
            self.buffer.append(element)

    def __next__(self) -> Any:
        node = self.node
        span = (node.size - 1) * node.stride + 1
        while not self.ended and self.index < self.start + span:
            try:
                self._read()
            except StopIteration:
                self.ended = True
        picks = self.buffer[:: node.stride][: node.size]
        if not picks or (node.drop_remainder and len(picks) < node.size):
            raise StopIteration
        self.made += 1
        del self.buffer[: node.shift]
        self.starts = {i: s for i, s in self.starts.items() if i >= self.start}
        return node.datasets(picks)

    def state(self) -> dict:
        if self.buffer:  # re-read from the current window's first element
            start = self.start
            return {"parent": self.starts[start], "index": start, "made": self.made}
        return {"parent": self.parent.state(), "index": self.index, "made": self.made}


@dataclasses.dataclass(eq=False)
class GroupByWindow(Stream):
    """tf.data's group_by_window: elements grouped by `key_fn`, each group of
    `size_fn(key)` elements handed to `reduce_fn(key, dataset)` as it fills, whose
    dataset's elements are yielded; at the end the groups left, in increasing key order."""

    parent: Node
    key_fn: Callable[..., Any]
    reduce_fn: Callable[[Any, Any], Any]
    size_fn: Callable[[int], Any]
    make: Make

    def open(self, key: Key, state: dict | None) -> Any:
        return _GroupCursor(self, key, state)


class _GroupCursor:
    def __init__(self, node: GroupByWindow, key: Key, state: dict | None) -> None:
        self.node = node
        self.parent = open_node(node.parent, key, None)
        self.groups: dict[int, list[Any]] = {}
        self.sizes: dict[int, int] = {}
        self.read = self.flushed = self.ended = 0
        self.inner: Any = None
        if state is None:
            return
        # A restore: the groups are filled again from the epoch's start (see the module).
        target = (state["read"], state["ended"], state["flushed"])
        group = None
        while (self.read, self.ended, self.flushed) != tuple(target):
            group = self._step() or group
        if state["inner"] is not None:
            self.inner = self._reduce(group, state["inner"])

    def _step(self) -> tuple[int, list[Any]] | None:
        """Reads one element (or flushes one group at the end): a full group, or None."""
        if self.ended:
            if not self.groups:
                raise StopIteration
            self.flushed += 1
            key = min(self.groups)
            return key, self.groups.pop(key)
        try:
            element = next(self.parent)
        except StopIteration:
            self.ended = 1
            return None
        self.read += 1
        key = _key(call(self.node.key_fn, element))
        group = self.groups.setdefault(key, [])
        group.append(element)
        if len(group) >= self._size(key):
            return key, self.groups.pop(key)
        return None

    def _size(self, key: int) -> int:
        if key not in self.sizes:
            size = np.asarray(self.node.size_fn(np.int64(key)))
            if size.shape != () or size.dtype.kind not in "iu" or int(size) <= 0:
                raise ValueError(
                    f"group_by_window's window size for key {key} must be a positive integer, "
                    f"got {size!r}"
                )
            self.sizes[key] = int(size)
        return self.sizes[key]

    def _reduce(self, group: tuple[int, list[Any]], state: dict | None) -> Any:
        key, elements = group
        window = self.node.make(elements_node(elements))
        return dataset_cursor(lambda _: self.node.reduce_fn(np.int64(key), window), 0, state)

    def __next__(self) -> Any:
        while True:
            if self.inner is not None:
                try:
                    return next(self.inner)
                except StopIteration:
                    self.inner = None
            group = self._step()
            if group is not None:
                self.inner = self._reduce(group, None)

    def state(self) -> dict:
        inner = None if self.inner is None else self.inner.state()
        return {"read": self.read, "ended": self.ended, "flushed": self.flushed, "inner": inner}


def _key(value: Any) -> int:
    key = np.asarray(value)
    if key.shape != () or key.dtype.kind not in "iu":
        raise ValueError(
            f"group_by_window's key_func must return a scalar integer, got {value!r}; e.g. "
            "key_func=lambda x: x % 2"
        )
    return int(key)
