"""Streaming ops that carry something from element to element: scan, take_while, unique.

Each reads its parent in order (`stream`). What it carries is part of its iterator state,
so a restored iterator goes on exactly: `scan`'s state is saved with its values
(`tree_state`); `take_while` saves whether it stopped; `unique` saves how many elements it
has read, and a restore reads them again to rebuild the values seen (so its state stays a
few integers whatever their number, and a restore costs one re-read of that part of the
epoch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx._src.data import tree_state, validation
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.stream import Stream, _Cursor, _get, call, open_node


@dataclasses.dataclass(eq=False)
class Scan(Stream):
    """tf.data's scan: `fn(state, element) -> (new_state, output)`, from `initial_state`."""

    parent: Node
    initial_state: Any
    fn: Callable[[Any, Any], Any]

    @property
    def cardinality(self) -> float | None:
        return self.parent.cardinality

    def open(self, key: Key, state: dict | None) -> Any:
        return _ScanCursor(self, key, state)


class _ScanCursor(_Cursor):
    def __init__(self, node: Scan, key: Key, state: dict | None) -> None:
        super().__init__(node, key, state)
        saved = _get(state, "carry", None)
        self.carry = node.initial_state if saved is None else tree_state.decode(saved)

    def __next__(self) -> Any:
        element = next(self.parent)
        out = self.node.fn(self.carry, element)
        if not isinstance(out, tuple) or len(out) != 2:
            raise ValueError(
                "scan's function must return a pair (new_state, output_element), got "
                f"{type(out).__name__}; e.g. lambda state, x: (state + x, state)"
            )
        carry, output = out
        self.carry = validation.to_numpy_tree(carry, "scan state")
        return validation.to_numpy_tree(output, "scan output")

    def state(self) -> dict:
        return {**super().state(), "carry": tree_state.encode(self.carry)}


@dataclasses.dataclass(eq=False)
class TakeWhile(Stream):
    """The elements up to (not including) the first for which `predicate` is False."""

    parent: Node
    predicate: Callable[..., Any]

    def open(self, key: Key, state: dict | None) -> Any:
        return _TakeWhileCursor(self, key, state)


class _TakeWhileCursor(_Cursor):
    counters = ("stopped",)

    def __next__(self) -> Any:
        if self.stopped:
            raise StopIteration
        element = next(self.parent)
        if not scalar_bool(call(self.node.predicate, element), "take_while"):
            self.stopped = 1
            raise StopIteration
        return element


def scalar_bool(value: Any, op: str) -> bool:
    """A predicate's result as a bool, or a ValueError naming `op`."""
    array = np.asarray(value)
    if array.shape != ():
        raise ValueError(
            f"{op}'s predicate must return a scalar bool, got an array of shape "
            f"{array.shape}; reduce it (e.g. with np.all) before returning it"
        )
    return bool(array)


@dataclasses.dataclass(eq=False)
class Unique(Stream):
    """Each element the first time it occurs (scalars: integers, strings or bytes)."""

    parent: Node

    def open(self, key: Key, state: dict | None) -> Any:
        return _UniqueCursor(self, key, state)


class _UniqueCursor:
    def __init__(self, node: Unique, key: Key, state: dict | None) -> None:
        self.parent = open_node(node.parent, key, None)
        self.read = 0
        self.seen: set = set()
        for _ in range(int(_get(state, "read"))):  # a restore: the values seen, read again
            self._fresh(next(self.parent))

    def _fresh(self, element: Any) -> bool:
        self.read += 1
        value = element
        if isinstance(element, np.ndarray | np.generic) and np.ndim(element) == 0:
            value = element.item()
        if not isinstance(value, int | str | bytes) or isinstance(value, bool):
            raise TypeError(
                f"unique() takes scalar integers, strings or bytes, as tf.data does; got "
                f"{type(element).__name__} {element!r}"
            )
        if value in self.seen:
            return False
        self.seen.add(value)
        return True

    def __next__(self) -> Any:
        while True:
            element = next(self.parent)
            if self._fresh(element):
                return element

    def state(self) -> dict:
        return {"read": self.read}
