"""`snapshot`: elements computed on a first complete pass, read back on later passes and runs.

The snapshot of a pipeline lives in `<path>/<fingerprint>` (`fingerprint`), a saved
dataset (`codec`): a pipeline whose ops, functions' code, seeds or options change gets
another directory, and never the old elements. While it is incomplete, the elements the
pipeline computes are also written (`writer`: to `<path>/<fingerprint>.partial`,
checkpointed every `CHECKPOINT_SECONDS`, so a killed run's work is kept); once every
position has been written it is published by one rename and from then on read, in this
run and the next ones. A half-written snapshot is never read.

Every pass computes the parent's elements of one fixed iteration (`KEY`, as `cache`), so
the positions a pass, a later epoch or a resumed run writes always belong together, and a
snapshot serves the same elements every epoch: a shuffle or a random augmentation *before*
the snapshot is frozen into it, as in tf.data. Over a random-access pipeline the snapshot
is random access (a `shuffle` after it permutes the snapshot's elements); over a streaming
one (TFRecordDataset, filter, ...) it streams, and is read in order once complete.

Writing happens in this process, in whichever thread computes the elements; worker
processes (`map(..., workers="process")`) read a complete snapshot but never write one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import warnings
import weakref
from typing import Any

import jax

from phalanx._src.data.plan import Key, Node
from phalanx._src.data.saved.fingerprint import fingerprint
from phalanx._src.data.saved.reader import Saved
from phalanx._src.data.saved.writer import Busy, Writer, is_saved
from phalanx._src.data.stream import Stream, open_node

KEY: Key = ()  # the iteration every pass computes (see the module docstring)
CHECKPOINT_SECONDS = 30.0
_stores: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_stores_lock = threading.Lock()


class _Store:
    """One snapshot directory in this process: its reader once published, else its writer
    (None where another writer holds it or in a worker process: elements are then only
    computed)."""

    def __init__(self, directory: str, print_: str, compression: str, write: bool) -> None:
        self.directory, self.lock = directory, threading.Lock()
        self.reader = Saved(directory) if is_saved(directory) else None
        self.writer: Writer | None = None
        if self.reader is None and write:
            with contextlib.suppress(Busy):  # another writer: compute without writing
                self.writer = Writer(directory, print_, compression, resume=True)
        self._saved_at = time.monotonic()

    def offer(self, rows: list[tuple[int, Any]], level: int, length: int | None) -> None:
        """Writes the rows (position, element) not yet written; publishes once all
        `length` are."""
        with self.lock:
            writer = self.writer
            if writer is None:
                return
            for position, element in rows:
                writer.add(position, element)
            if length is not None and writer.count == length:
                self._publish(length, level)
            elif time.monotonic() - self._saved_at > CHECKPOINT_SECONDS:
                writer.checkpoint()
                self._saved_at = time.monotonic()

    def finish(self, count: int, level: int) -> None:
        """A pass over a stream ended after `count` elements: publish if all are written."""
        with self.lock:
            if self.writer is not None and self.writer.count == count:
                self._publish(count, level)

    def _publish(self, count: int, level: int) -> None:
        self.writer.publish(count, level)  # type: ignore[union-attr]
        self.writer = None
        self.reader = Saved(self.directory)


def _store(node: Any) -> _Store:
    if node._store is None:
        print_ = fingerprint(node.parent, node.options)
        directory = os.path.join(node.path, print_)
        with _stores_lock:
            store = _stores.get(directory)
            if store is None or (store.writer is None and store.reader is None and not node.remote):
                store = _Store(directory, print_, node.compression, not node.remote)
                _stores[directory] = store
        node._store = store
    return node._store


def _for_worker(node: Any) -> dict:
    """The node's fields for a worker process, which reads but never writes the snapshot."""
    store = node._store
    if not node.remote and (store is None or store.reader is None):
        warnings.warn(
            f"snapshot({node.path!r}) runs in worker processes (map(..., "
            "workers='process')), which do not write snapshots, and it is not complete: "
            "its elements are computed and not saved; map in threads, or write it once "
            "with Dataset.save and read it with Dataset.load",
            RuntimeWarning,
            stacklevel=2,
        )
    names = ("parent", "path", "compression", "options")
    return {**{n: getattr(node, n) for n in names}, "remote": True}


def _rows(level: int, values: Any, count: int) -> list[Any]:
    """The elements of one `get` result, one by one."""
    if level == 1:
        return list(values)
    leaves, treedef = jax.tree.flatten(values)
    return [treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(count)]


@dataclasses.dataclass(eq=False)
class Snapshot(Node):
    """`snapshot` over a random-access pipeline (see the module docstring)."""

    parent: Node
    path: str
    compression: str
    options: Any = None
    remote: bool = False  # a worker process's copy
    _store: Any = dataclasses.field(default=None, init=False, repr=False)

    def __getstate__(self) -> dict:
        return _for_worker(self)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def get(self, key: Key, positions: Any) -> Any:
        store = _store(self)
        if store.reader is not None:
            return store.reader.get(KEY, positions)
        values = self.parent.get(KEY, positions)
        if store.writer is not None:
            rows = _rows(self.level, values, len(positions))
            store.offer(list(zip(positions.tolist(), rows, strict=True)), self.level, self.length)
        return values


@dataclasses.dataclass(eq=False)
class StreamSnapshot(Stream):
    """`snapshot` over a streaming pipeline; its state: the step and the parent's state."""

    parent: Node
    path: str
    compression: str
    options: Any = None
    remote: bool = False
    _store: Any = dataclasses.field(default=None, init=False, repr=False)

    @property
    def level(self) -> int:
        return self.parent.level

    def __getstate__(self) -> dict:
        return _for_worker(self)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def open(self, key: Key, state: dict | None) -> Any:
        store = _store(self)
        if store.reader is not None:
            return _ReadCursor(store.reader, state)
        return _WriteCursor(self, store, state)


class _ReadCursor:
    """Reads a complete snapshot in order, one element at a time (a batch after it
    gathers them: no larger chunk is read and split again)."""

    def __init__(self, reader: Saved, state: dict | None) -> None:
        self.reader = reader
        self.step = 0 if state is None else int(state["step"])

    def __next__(self) -> Any:
        if self.step >= self.reader.length:
            raise StopIteration
        element = self.reader.element(self.step)
        self.step += 1
        return element

    def state(self) -> dict:
        return {"step": self.step, "parent": None}


class _WriteCursor:
    def __init__(self, node: StreamSnapshot, store: _Store, state: dict | None) -> None:
        self.node, self.store = node, store
        self.step = 0 if state is None else int(state["step"])
        parent = None if state is None else state["parent"]
        self.parent = open_node(node.parent, KEY, parent)
        if parent is None:  # a reading cursor's state: replay the parent up to the step
            for _ in range(self.step):
                next(self.parent)

    def __next__(self) -> Any:
        try:
            element = next(self.parent)
        except StopIteration:
            self.store.finish(self.step, self.node.level)
            raise
        self.store.offer([(self.step, element)], self.node.level, None)
        self.step += 1
        return element

    def state(self) -> dict:
        return {"step": self.step, "parent": self.parent.state()}
