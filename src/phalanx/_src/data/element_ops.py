"""Nodes that compute elements: `map` (a user function) and `cache` (keep what was computed)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from phalanx._src.data import index_ops, plan, validation
from phalanx._src.data.plan import Key, Node
from phalanx._src.image import randomness


def map_words(node: Any, key: Sequence[int], position: int) -> tuple[int, ...]:
    """The stream key of element `position` of iteration `key` of a map node.

    The shuffle seeds below the map (recorded in iterator states, so a restored iterator
    draws alike) and the map's depth (two maps draw different numbers) are computed once
    per node.
    """
    base = node.__dict__.get("_stream_base")
    if base is None:
        below = plan.chain(node.parent)
        base = (len(below), *index_ops.seeds(node.parent))
        node.__dict__["_stream_base"] = base
    return (*base, len(key), *key, int(position))


@dataclasses.dataclass(eq=False)
class Map(Node):
    """`fn` applied to each row (level 0) or each batch (level 1); tuples are unpacked."""

    parent: Node
    fn: Callable[..., Any]
    workers: int  # 0: in the consuming thread; N; or -1 (AUTOTUNE)
    kind: str = "thread"  # or "process"

    def _call(self, element: Any, key: Key = (), position: int = 0) -> Any:
        # Random ops inside fn draw from the element's own stream (reproducible, resumable).
        with randomness.element_stream(map_words(self, key, position)):
            out = self.fn(*element) if type(element) is tuple else self.fn(element)
        return validation.to_numpy_tree(out, "map output")

    def get(self, key: Key, positions: np.ndarray) -> Any:
        if self.level == 1:
            batches = self.parent.get(key, positions)
            return [self._call(b, key, p) for b, p in zip(batches, positions, strict=True)]
        if len(positions) == 0:
            # The output structure of zero rows: map one row, keep none of it.
            probe = self.get(key, np.zeros(1, np.int64))
            return jax.tree.map(lambda a: a[:0], probe)
        leaves, treedef = jax.tree.flatten(self.parent.get(key, positions))
        rows = [
            self._call(treedef.unflatten([leaf[i] for leaf in leaves]), key, positions[i])
            for i in range(len(positions))
        ]
        return jax.tree.map(lambda *r: validation.stack(r), *rows)


@dataclasses.dataclass(eq=False)
class Cache(Node):
    """Keeps each element the first time it is computed (the first iteration's order)."""

    parent: Node
    _store: Any = dataclasses.field(default=None, init=False, repr=False)
    _filled: Any = dataclasses.field(default=None, init=False, repr=False)
    _lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    def __getstate__(self) -> dict:
        # Sent to a worker process: an empty cache there (the worker fills its own copy).
        return {"parent": self.parent}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def get(self, key: Key, positions: np.ndarray) -> Any:
        # Workers may fill different positions at once; a duplicate fill writes equal values.
        with self._lock:
            if self._filled is None:
                self._filled = np.zeros(self.length, bool)
            missing = np.unique(positions[~self._filled[positions]])
        if self.level == 1:
            values = self.parent.get((), missing) if len(missing) else []
            with self._lock:
                if self._store is None:
                    self._store = [None] * self.length
                for i, batch in zip(missing, values, strict=True):
                    self._store[i] = batch
                self._filled[missing] = True
                return [self._store[i] for i in positions]
        if len(missing) or self._store is None:
            values = self.parent.get((), missing)
            with self._lock:
                if self._store is None:
                    self._store = jax.tree.map(
                        lambda a: np.empty((self.length, *a.shape[1:]), a.dtype), values
                    )
                for store, value in zip(
                    jax.tree.leaves(self._store), jax.tree.leaves(values), strict=True
                ):
                    store[missing] = value
                self._filled[missing] = True
        return jax.tree.map(lambda a: a[positions], self._store)
