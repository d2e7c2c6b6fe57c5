"""Nodes that compute elements: `map` (a user function) and `cache` (keep what was computed)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from phalanx._src.data import cache_files, index_ops, plan, validation
from phalanx._src.data.plan import Key, Node
from phalanx._src.image import randomness
from phalanx._src.strategy.device_batch import host_array


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


def stack(values: tuple[Any, ...]) -> np.ndarray:
    """Mapped elements' leaves stacked; `plan.ragged` when their shapes differ."""
    try:
        return validation.stack(values)
    except ValueError:  # shapes differ: tf.data's map allows it; batch() will say so
        return plan.ragged([host_array(v) for v in values])


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
        return jax.tree.map(lambda *r: stack(r), *rows)


@dataclasses.dataclass(eq=False)
class Cache(Node):
    """Keeps each element the first time it is computed (the first iteration's order).

    With `path`, the elements also go to a file once every one is held, and a later
    pipeline with the same path reads them from there (`cache_files`). Worker processes
    each fill a copy of their own, so a file is written only from threads or inline.
    """

    parent: Node
    path: str | None = None
    _leaves: Any = dataclasses.field(default=None, init=False, repr=False)
    _treedef: Any = dataclasses.field(default=None, init=False, repr=False)
    _filled: Any = dataclasses.field(default=None, init=False, repr=False)
    _written: bool = dataclasses.field(default=False, init=False, repr=False)
    _ragged: set = dataclasses.field(default_factory=set, init=False, repr=False)
    _lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    def __getstate__(self) -> dict:
        # Sent to a worker process: an empty cache there (the worker fills its own copy).
        return {"parent": self.parent, "path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _open(self) -> None:
        """The store, empty or read from `path` (under the lock, once)."""
        self._filled = np.zeros(self.length, bool)
        held = None if self.path is None else cache_files.read(self.path, self.length)
        if held is not None:
            self._leaves, self._treedef = held
            self._ragged = {i for i, leaf in enumerate(self._leaves) if plan.is_ragged(leaf)}
            self._filled[:] = self._written = True
        elif self.level == 1:
            self._leaves = [None] * self.length

    def get(self, key: Key, positions: np.ndarray) -> Any:
        # Workers may fill different positions at once; a duplicate fill writes equal values.
        with self._lock:
            if self._filled is None:
                self._open()
            missing = np.unique(positions[~self._filled[positions]])
        # At level 0 the first call learns the structure, even with nothing missing.
        if len(missing) or (self.level == 0 and self._treedef is None):
            self._fill(missing, self.parent.get((), missing))
        if self.level == 1:
            return [self._leaves[i] for i in positions]
        return self._treedef.unflatten([leaf[positions] for leaf in self._leaves])

    def _fill(self, missing: np.ndarray, values: Any) -> None:
        with self._lock:
            if self.level == 1:
                for i, element in zip(missing, values, strict=True):
                    self._leaves[i] = element
            else:
                leaves, treedef = jax.tree.flatten(values)
                if self._leaves is None:
                    self._treedef = treedef
                    self._leaves = [np.empty((self.length, *a.shape[1:]), a.dtype) for a in leaves]
                for i, value in enumerate(leaves):
                    self._put(i, missing, value)
            self._filled[missing] = True
            full = self.path is not None and not self._written and self._filled.all()
            self._written = self._written or full
        if full:  # outside the lock: the other workers read on while the file is written
            cache_files.write(self.path, (self._leaves, self._treedef), self.length)

    def _put(self, leaf: int, positions: np.ndarray, values: np.ndarray) -> None:
        """Stores leaf `leaf` of the elements at `positions`; the leaf's store becomes
        `plan.ragged` rows from the first values whose shape differs (and stays so)."""
        store = self._leaves[leaf]
        if leaf not in self._ragged:
            if store.shape[1:] == values.shape[1:] and not plan.is_ragged(values):
                store[positions] = values
                return
            store = self._leaves[leaf] = plan.ragged(list(store))
            self._ragged.add(leaf)
        store[positions] = plan.as_rows(values)
