"""Streaming nodes: ops whose elements cannot be computed from a position.

`filter` cannot know where its k-th element is without running the predicate on everything
before it, and a generator has no positions at all. These nodes are read in order through a
*cursor*: `next(cursor)` gives the next element, `cursor.state()` a small JSON-ready dict
from which `open_node(node, key, state)` rebuilds a cursor that continues exactly there. A
streaming node's state is its own counters plus its parent's state, so a whole pipeline's
position stays a few integers (the random-access part below a stream is read through a
`RandomCursor`, whose state is its step). Once a pipeline holds a streaming node, every op
after it streams too (`Dataset` picks the streaming form); `shuffle` and `cache` need
random access and must come before the first streaming op.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from phalanx._src.data import validation
from phalanx._src.data.options import check_signature
from phalanx._src.data.plan import Key, Node

_ROW_CHUNK = 256  # rows a RandomCursor fetches at once: one gather instead of 256


class Stream(Node):
    """A node read in order through `open(key, state)`; `get` is not available."""

    @property
    def length(self) -> int | None:
        return None  # unknown: Dataset reports tf.data's UNKNOWN cardinality

    @property
    def cardinality(self) -> float | None:
        """None (unknown) unless the op knows; the ops that keep or compute their parent's
        count say so, with tf.data's rules (`Dataset.cardinality`)."""
        return None

    def get(self, key: Key, positions: np.ndarray) -> Any:
        raise TypeError(f"{type(self).__name__} streams; it has no random access")

    def open(self, key: Key, state: dict | None) -> Any:
        raise NotImplementedError


class RandomCursor:
    """Reads a random-access node in order; its state is the number of elements read.

    An element whose computation raised (a `map` function's error) is passed: the error
    is raised in its place and the next call reads the element after it, as a tf.data
    iterator goes on after an error (and `ignore_errors` drops it). A chunk that raised is
    read again element by element, to raise at the element that fails and only there.
    """

    def __init__(self, node: Node, key: Key, state: dict | None) -> None:
        self.node, self.key = node, key
        self.step = 0 if state is None else int(state["step"])
        self._ahead: list[Any] = []
        self._single_until = 0  # read one element at a time up to this step (see above)

    def __next__(self) -> Any:
        if not self._ahead:
            n = self.node.length
            chunk = 1 if self.node.level == 1 or self.step < self._single_until else _ROW_CHUNK
            stop = self.step + chunk if n is None else min(self.step + chunk, n)
            if stop <= self.step:
                raise StopIteration
            try:
                got = self.node.get(self.key, np.arange(self.step, stop, dtype=np.int64))
            except Exception:
                if chunk == 1:
                    self.step += 1  # the failing element is passed
                    raise
                self._single_until = stop
                return next(self)
            if self.node.level == 1:
                self._ahead = list(got)
            else:
                leaves, treedef = jax.tree.flatten(got)
                self._ahead = [
                    treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(stop - self.step)
                ]
            self._ahead.reverse()
        self.step += 1
        return self._ahead.pop()

    def state(self) -> dict:
        return {"step": self.step}


def open_node(node: Node, key: Key, state: dict | None) -> Any:
    """A cursor over `node`'s elements of iteration `key`, at `state` (None: the start)."""
    if isinstance(node, Stream):
        return node.open(key, state)
    return RandomCursor(node, key, state)


def call(fn: Callable[..., Any], element: Any) -> Any:
    """`fn(element)`, a tuple unpacked into positional arguments as in tf.data."""
    return fn(*element) if type(element) is tuple else fn(element)


def _get(state: dict | None, name: str, default: Any = 0) -> Any:
    return default if state is None else state[name]


class _Cursor:
    """A cursor over one parent, with integer counters saved beside the parent's state."""

    counters: tuple[str, ...] = ()

    def __init__(self, node: Any, key: Key, state: dict | None) -> None:
        self.node, self.key = node, key
        self.parent = open_node(node.parent, key, _get(state, "parent", None))
        for name in self.counters:
            setattr(self, name, int(_get(state, name)))

    def state(self) -> dict:
        return {"parent": self.parent.state(), **{n: getattr(self, n) for n in self.counters}}


# -- sources ----------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class FromGenerator(Stream):
    """A Python generator's elements; state: how many it has produced this iteration."""

    generator: Callable[..., Any]
    args: tuple
    output_signature: Any = None  # a structure of TensorSpecs every element must match

    level = 0

    @property
    def takes_start(self) -> bool:
        try:
            return "start" in inspect.signature(self.generator).parameters
        except (TypeError, ValueError):
            return False

    def open(self, key: Key, state: dict | None) -> Any:
        return _GeneratorCursor(self, key, state)


class _GeneratorCursor:
    def __init__(self, node: FromGenerator, key: Key, state: dict | None) -> None:
        self.signature = node.output_signature
        self.produced = int(_get(state, "produced"))
        if node.takes_start:
            self._it = iter(node.generator(*node.args, start=self.produced))
        else:
            self._it = iter(node.generator(*node.args))
            for _ in range(self.produced):  # replay: exact only for a repeatable generator
                next(self._it)

    def __next__(self) -> Any:
        element = next(self._it)
        if self.signature is not None:
            element = check_signature(self.signature, element)
        element = validation.to_numpy_tree(element, "generator output")
        self.produced += 1
        return element

    def state(self) -> dict:
        return {"produced": self.produced}


# -- one element in, at most one out ----------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Filter(Stream):
    parent: Node
    predicate: Callable[..., Any]

    def open(self, key: Key, state: dict | None) -> Any:
        return _FilterCursor(self, key, state)


class _FilterCursor(_Cursor):
    counters = ("seen", "kept")

    def __next__(self) -> Any:
        while True:
            element = next(self.parent)
            self.seen += 1
            keep = np.asarray(call(self.node.predicate, element))
            if keep.shape != ():
                raise ValueError(
                    f"filter's predicate must return a scalar bool, got an array of shape "
                    f"{keep.shape}; reduce it (e.g. with np.all) before returning it"
                )
            if bool(keep):
                self.kept += 1
                return element


@dataclasses.dataclass(eq=False)
class StreamTake(Stream):
    parent: Node
    count: int

    @property
    def cardinality(self) -> float | None:
        n = self.parent.cardinality
        if self.count == 0:
            return 0
        return None if n is None else min(n, self.count)

    def open(self, key: Key, state: dict | None) -> Any:
        return _TakeCursor(self, key, state)


class _TakeCursor(_Cursor):
    counters = ("taken",)

    def __next__(self) -> Any:
        if self.taken >= self.node.count:
            raise StopIteration
        element = next(self.parent)
        self.taken += 1
        return element


@dataclasses.dataclass(eq=False)
class StreamSkip(Stream):
    parent: Node
    count: int

    @property
    def cardinality(self) -> float | None:
        n = self.parent.cardinality
        return None if n is None else max(0, n - self.count)

    def open(self, key: Key, state: dict | None) -> Any:
        return _SkipCursor(self, key, state)


class _SkipCursor(_Cursor):
    counters = ("skipped",)

    def __next__(self) -> Any:
        while self.skipped < self.node.count:
            next(self.parent)
            self.skipped += 1
        return next(self.parent)


@dataclasses.dataclass(eq=False)
class StreamEnumerate(Stream):
    parent: Node
    start: int

    @property
    def cardinality(self) -> float | None:
        return self.parent.cardinality

    def open(self, key: Key, state: dict | None) -> Any:
        return _EnumerateCursor(self, key, state)


class _EnumerateCursor(_Cursor):
    counters = ("index",)

    def __next__(self) -> Any:
        element = next(self.parent)
        self.index += 1
        return (np.int64(self.node.start + self.index - 1), element)


@dataclasses.dataclass(eq=False)
class StreamShard(Stream):
    parent: Node
    num_shards: int
    index: int

    @property
    def cardinality(self) -> float | None:
        n = self.parent.cardinality
        if n is None or n == math.inf:
            return n
        return max(0, -(-(n - self.index) // self.num_shards))

    def open(self, key: Key, state: dict | None) -> Any:
        return _ShardCursor(self, key, state)


class _ShardCursor(_Cursor):
    counters = ("seen",)

    def __next__(self) -> Any:
        while True:
            element = next(self.parent)
            self.seen += 1
            if (self.seen - 1) % self.node.num_shards == self.node.index:
                return element
