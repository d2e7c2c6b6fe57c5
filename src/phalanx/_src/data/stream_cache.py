"""`cache()` after a streaming op (filter, flat_map, interleave, unbatch, ...).

A stream's elements have no positions to keep them by, so the cache holds the elements of
the first pass that reads the parent from its start to its end, in order, and every later
pass reads that list (as tf.data's cache fills on the first complete pass). A pass that
starts mid-way (a restored iterator), that is cut short, or in which an element's
computation raised, does not fill it: the next complete pass does. The parent is always
read as iteration `()`, as `element_ops.Cache` reads it, so every pass sees the elements of
the first. With a filename, the complete list also goes to a file (`cache_files`), which
later pipelines read instead of computing.

The state: the index of the next element, plus the parent's state while the pass reads the
parent. A state saved while reading the list restores, in a process whose cache is empty,
by reading the parent again up to that index.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from phalanx._src.data import cache_files
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.stream import Stream, _get, open_node


@dataclasses.dataclass(eq=False)
class StreamCache(Stream):
    parent: Node
    path: str | None = None
    _elements: list | None = dataclasses.field(default=None, init=False, repr=False)
    _lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    def __getstate__(self) -> dict:
        return {"parent": self.parent, "path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def cardinality(self) -> float | None:
        return self.parent.cardinality

    def held(self) -> list | None:
        """The complete pass's elements, from memory or the file; None before one."""
        with self._lock:
            if self._elements is None and self.path is not None:
                self._elements = cache_files.read(self.path, None)
            return self._elements

    def publish(self, elements: list) -> None:
        """Keeps a complete pass (the first one to finish, if two filled at once)."""
        with self._lock:
            if self._elements is not None:
                return
            self._elements = elements
        if self.path is not None:
            cache_files.write(self.path, elements, len(elements))

    def open(self, key: Key, state: dict | None) -> Any:
        return _CacheCursor(self, state)


class _CacheCursor:
    def __init__(self, node: StreamCache, state: dict | None) -> None:
        self.node = node
        self.index = int(_get(state, "index"))
        self.held = node.held()
        self.parent: Any = None
        self.filling: list | None = None
        if self.held is not None:
            return
        saved = _get(state, "parent", None)
        self.parent = open_node(node.parent, (), saved)
        if saved is None:
            for _ in range(self.index):  # a state of a pass that read the list
                next(self.parent)
        if self.index == 0:  # a pass from the start fills the cache
            self.filling = []

    def __next__(self) -> Any:
        if self.parent is None:
            if self.index >= len(self.held):
                raise StopIteration
            self.index += 1
            return self.held[self.index - 1]
        try:
            element = next(self.parent)
        except StopIteration:
            if self.filling is not None:
                self.node.publish(self.filling)
                self.filling = None
            raise
        except Exception:
            self.filling = None  # a pass missing an element must not be kept
            raise
        if self.filling is not None:
            self.filling.append(element)
        self.index += 1
        return element

    def state(self) -> dict:
        return {"index": self.index, "parent": None if self.parent is None else self.parent.state()}
