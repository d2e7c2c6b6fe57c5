"""Streaming repeat, zip and concatenate: cursors over several parents or repetitions."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from phalanx._src.data.plan import Key, Node
from phalanx._src.data.stream import Stream, _get, open_node


@dataclasses.dataclass(eq=False)
class StreamRepeat(Stream):
    """Each round is a new iteration of the parent (key + round), as `Repeat` keys it."""

    parent: Node
    count: int | None

    @property
    def cardinality(self) -> float | None:
        n = self.parent.cardinality
        if self.count == 0 or n == 0:
            return 0
        if self.count is None:
            return math.inf  # tf.data's rule, even over an unknown count
        return None if n is None else n * self.count

    def open(self, key: Key, state: dict | None) -> Any:
        return _RepeatCursor(self, key, state)


class _RepeatCursor:
    def __init__(self, node: StreamRepeat, key: Key, state: dict | None) -> None:
        self.node, self.key = node, key
        self.round = int(_get(state, "round"))
        self.fresh = bool(_get(state, "fresh", True))  # nothing read yet in this round
        self.parent = open_node(node.parent, (*key, self.round), _get(state, "parent", None))

    def __next__(self) -> Any:
        while True:
            if self.node.count is not None and self.round >= self.node.count:
                raise StopIteration
            try:
                element = next(self.parent)
            except StopIteration:
                if self.fresh:  # an empty round: every later round is empty too
                    raise
                self.round += 1
                self.fresh = True
                self.parent = open_node(self.node.parent, (*self.key, self.round), None)
                continue
            self.fresh = False
            return element

    def state(self) -> dict:
        return {"round": self.round, "fresh": self.fresh, "parent": self.parent.state()}


# -- several parents --------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class StreamZip(Stream):
    parents: tuple[Node, ...]

    @property
    def level(self) -> int:
        return self.parents[0].level

    @property
    def cardinality(self) -> float | None:
        counts = [p.cardinality for p in self.parents]
        return None if None in counts else min(counts)

    def open(self, key: Key, state: dict | None) -> Any:
        return _ZipCursor(self, key, state)


class _ZipCursor:
    def __init__(self, node: StreamZip, key: Key, state: dict | None) -> None:
        states = _get(state, "parents", [None] * len(node.parents))
        self.parents = [open_node(p, key, s) for p, s in zip(node.parents, states, strict=True)]

    def __next__(self) -> Any:
        # A list, not a generator: a parent's StopIteration must end the zip, and inside a
        # generator expression Python turns it into a RuntimeError.
        return tuple([next(parent) for parent in self.parents])

    def state(self) -> dict:
        return {"parents": [parent.state() for parent in self.parents]}


@dataclasses.dataclass(eq=False)
class StreamConcatenate(Stream):
    parents: tuple[Node, Node]

    @property
    def level(self) -> int:
        return self.parents[0].level

    @property
    def cardinality(self) -> float | None:
        counts = [p.cardinality for p in self.parents]
        return None if None in counts else sum(counts)

    def open(self, key: Key, state: dict | None) -> Any:
        return _ConcatenateCursor(self, key, state)


class _ConcatenateCursor:
    def __init__(self, node: StreamConcatenate, key: Key, state: dict | None) -> None:
        self.node, self.key = node, key
        self.part = int(_get(state, "part"))
        self.parent = open_node(node.parents[self.part], key, _get(state, "parent", None))

    def __next__(self) -> Any:
        try:
            return next(self.parent)
        except StopIteration:
            if self.part == 1:
                raise
            self.part = 1
            self.parent = open_node(self.node.parents[1], self.key, None)
            return next(self.parent)

    def state(self) -> dict:
        return {"part": self.part, "parent": self.parent.state()}
