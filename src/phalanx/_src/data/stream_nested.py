"""Streaming nodes that change the nesting: batch / padded_batch, unbatch, rebatch, flat_map,
interleave.

A cursor that is partway through one upstream element (a batch being unbatched, a dataset
made by `flat_map`'s function) saves the upstream state from *before* that element plus its
position inside it; restoring re-reads that one element and continues (see `stream`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from phalanx._src.data import index_ops, validation
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.recycle import Recycler
from phalanx._src.data.stream import Stream, _Cursor, _get, call, open_node
from phalanx._src.strategy import device_batch
from phalanx._src.strategy.layout import ceil_split


@dataclasses.dataclass(eq=False)
class StreamBatch(Stream):
    """Consecutive elements stacked into batches; with `pad`, padded to a common shape."""

    parent: Node
    size: int
    drop_remainder: bool
    pad: bool = False
    padded_shapes: Any = None
    padding_values: Any = None
    split: tuple[int, int] | None = None  # (index, count): one process's rows

    level = 1

    @property
    def cardinality(self) -> float | None:
        n = self.parent.cardinality
        if n is None or n == math.inf:
            return n
        return n // self.size if self.drop_remainder else -(-n // self.size)

    def open(self, key: Key, state: dict | None) -> Any:
        return _BatchCursor(self, key, state)

    def stack(self, elements: list[Any], recycler: Any = None) -> Any:
        leaves0, treedef = jax.tree.flatten(elements[0])
        if any(isinstance(getattr(leaf, "_node", None), Node) for leaf in leaves0):
            raise TypeError(
                "batch() got datasets (window() and group_by_window's windows are datasets); "
                "flat_map them first, e.g. ds.window(3).flat_map(lambda w: w.batch(3))"
            )
        columns = [treedef.flatten_up_to(e) for e in elements]
        shapes = self._shapes(treedef) if self.pad else [None] * len(leaves0)
        values = self._values(treedef) if self.pad else [0] * len(leaves0)
        out = []
        for i, (shape, value) in enumerate(zip(shapes, values, strict=True)):
            rows = [device_batch.host_array(column[i]) for column in columns]
            if not self.pad:
                found = sorted({r.shape for r in rows})
                if len(found) > 1:
                    raise ValueError(
                        f"batch() got elements of different shapes {found} in leaf {i}; use "
                        "padded_batch() to pad them to a common shape"
                    )
                out.append(validation.stack(rows, recycler))
                continue
            padded = [self._pad(r, shape, value, rows) for r in rows]
            out.append(validation.stack(padded, recycler))
        batch = treedef.unflatten(out)
        if self.split is not None:
            index, count = self.split
            lo, hi = ceil_split(len(elements), count)[index]
            batch = jax.tree.map(lambda a: a[lo:hi], batch)
        return batch

    def _shapes(self, treedef: Any) -> list[Any]:
        if self.padded_shapes is None:
            return [None] * treedef.num_leaves
        return treedef.flatten_up_to(self.padded_shapes)

    def _values(self, treedef: Any) -> list[Any]:
        if self.padding_values is None or np.ndim(self.padding_values) == 0:
            return [0 if self.padding_values is None else self.padding_values] * treedef.num_leaves
        return treedef.flatten_up_to(self.padding_values)

    @staticmethod
    def _pad(row: np.ndarray, shape: Any, value: Any, rows: list[np.ndarray]) -> np.ndarray:
        longest = [max(r.shape[d] for r in rows) for d in range(row.ndim)]
        if shape is not None:
            if len(shape) != row.ndim:
                raise ValueError(
                    f"padded_shapes entry {tuple(shape)} has {len(shape)} dimensions but the "
                    f"element has {row.ndim} (shape {row.shape}); give one size (or None) per "
                    "dimension"
                )
            longest = [
                m if s is None or s == -1 else int(s) for s, m in zip(shape, longest, strict=True)
            ]
        if any(t < n for t, n in zip(longest, row.shape, strict=True)):
            raise ValueError(
                f"padded_batch: an element of shape {row.shape} is larger than the padded "
                f"shape {tuple(longest)}; raise padded_shapes or use None to pad to the longest"
            )
        if row.ndim == 0:
            return row
        if row.dtype.kind == "O":
            # Strings pad with "" (b"" for bytes), as tf.data pads tf.string; np.pad would
            # turn the padding into NumPy scalars.
            if value == 0:
                value = b"" if row.size and isinstance(row.flat[0], bytes) else ""
            out = np.full(tuple(longest), value, dtype=object)
            out[tuple(slice(0, n) for n in row.shape)] = row
            return out
        widths = [(0, t - n) for t, n in zip(longest, row.shape, strict=True)]
        return np.pad(row, widths, constant_values=np.asarray(value, row.dtype))


class _BatchCursor(_Cursor):
    """State: the parent's, taken between batches (a batch is read all at once). Large
    batches go into arrays reused once the consumer has let them go (`recycle`)."""

    def __init__(self, node: Any, key: Key, state: dict | None) -> None:
        super().__init__(node, key, state)
        self._recycler = Recycler()

    def __next__(self) -> Any:
        elements = []
        for _ in range(self.node.size):
            try:
                elements.append(next(self.parent))
            except StopIteration:
                break
        if not elements or (self.node.drop_remainder and len(elements) < self.node.size):
            raise StopIteration
        return self.node.stack(elements, self._recycler)


@dataclasses.dataclass(eq=False)
class Unbatch(Stream):
    parent: Node

    level = 0

    @property
    def cardinality(self) -> float | None:
        # Known where tf.data knows the rows of an element: right after a batch of a fixed
        # size (drop_remainder=True), whose elements all hold `size` rows.
        n, parent = self.parent.cardinality, self.parent
        fixed = isinstance(parent, index_ops.Batch | StreamBatch) and parent.drop_remainder
        if n is None or not fixed or parent.split is not None:
            return None
        if isinstance(parent, Rebatch) and len(set(parent.sizes)) > 1:
            return None
        return n * parent.size

    def open(self, key: Key, state: dict | None) -> Any:
        return _UnbatchCursor(self, key, state)


class _Inside:
    """Shared by cursors that walk inside one upstream element at a time."""

    def __init__(self, node: Any, key: Key, state: dict | None) -> None:
        self.node, self.key = node, key
        self.before = _get(state, "before", None)  # parent state before the current element
        self.inner: Any = None
        if state is not None and state["inner"] is not None:
            self.parent = open_node(node.parent, key, self.before)
            self.inner = self.enter(next(self.parent), state["inner"])
        else:
            self.parent = open_node(node.parent, key, _get(state, "parent", None))

    def __next__(self) -> Any:
        while True:
            if self.inner is None:
                self.before = self.parent.state()
                self.inner = self.enter(next(self.parent), None)
            try:
                return next(self.inner)
            except StopIteration:
                self.inner = None

    def state(self) -> dict:
        if self.inner is None:
            return {"parent": self.parent.state(), "before": None, "inner": None}
        return {"parent": None, "before": self.before, "inner": self.inner.state()}

    def enter(self, element: Any, state: dict | None) -> Any:
        raise NotImplementedError


class _Rows:
    def __init__(self, batch: Any, row: int, op: str = "unbatch") -> None:
        self.leaves, self.treedef = jax.tree.flatten(batch)
        self.row = row
        sizes = sorted({np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in self.leaves})
        if None in sizes or len(sizes) > 1:
            shapes = [np.shape(leaf) for leaf in self.leaves]
            raise ValueError(
                f"{op}() splits every leaf of an element along its first axis, so they "
                f"need one common first dimension; got leaf shapes {shapes}"
            )
        self.rows = sizes[0] if sizes else 0

    def take(self, count: int) -> tuple[int, Any]:
        """Up to `count` next rows as one batch, and how many (0: none was left)."""
        first, self.row = self.row, min(self.row + count, self.rows)
        return self.row - first, self.treedef.unflatten(
            [leaf[first : self.row] for leaf in self.leaves]
        )

    def __next__(self) -> Any:
        if self.row >= self.rows:
            raise StopIteration
        self.row += 1
        return self.treedef.unflatten([leaf[self.row - 1] for leaf in self.leaves])

    def state(self) -> dict:
        return {"row": self.row}


class _UnbatchCursor(_Inside):
    def enter(self, element: Any, state: dict | None) -> Any:
        return _Rows(element, int(_get(state, "row")))


@dataclasses.dataclass(eq=False)
class Rebatch(StreamBatch):
    """tf.data's rebatch: the rows of the parent's batches regrouped in batches of `sizes`
    rows, cycling through `sizes` (one size: unbatch().batch(n), without a row at a time).
    A batch: `size` is the first size, and `split` keeps one process's rows."""

    sizes: tuple[int, ...] = ()

    @property
    def cardinality(self) -> None:
        return None  # the rows per input batch are known only by reading them

    def open(self, key: Key, state: dict | None) -> Any:
        return _RebatchCursor(self, key, state)


class _RebatchCursor(_Inside):
    """The state: `_Inside`'s (the parent's batch being split, the row in it) and the
    number of batches made, which picks the next size."""

    def __init__(self, node: Rebatch, key: Key, state: dict | None) -> None:
        super().__init__(node, key, state)
        self.made = int(_get(state, "made"))

    def enter(self, element: Any, state: dict | None) -> Any:
        return _Rows(element, int(_get(state, "row")), "rebatch")

    def __next__(self) -> Any:
        want = self.node.sizes[self.made % len(self.node.sizes)]
        pieces, have = [], 0
        while have < want:
            if self.inner is None:
                self.before = self.parent.state()
                try:
                    self.inner = self.enter(next(self.parent), None)
                except StopIteration:
                    break
            rows, piece = self.inner.take(want - have)
            if not rows:
                self.inner = None
                continue
            pieces.append(piece)
            have += rows
        if not pieces or (self.node.drop_remainder and have < want):
            raise StopIteration
        self.made += 1
        batch = jax.tree.map(lambda *parts: np.concatenate(parts), *pieces)
        if self.node.split is not None:
            index, count = self.node.split
            lo, hi = ceil_split(have, count)[index]
            batch = jax.tree.map(lambda a: a[lo:hi], batch)
        return batch

    def state(self) -> dict:
        return {**super().state(), "made": self.made}


def dataset_cursor(fn: Callable[..., Any], element: Any, state: dict | None) -> Any:
    dataset = call(fn, element)
    # A Dataset is known by its plan, not by its class: this module is one of the nodes the
    # Dataset builder imports, so it must not import the builder back.
    if not isinstance(getattr(dataset, "_node", None), Node):
        raise TypeError(
            f"the function must return a phalanx.data.Dataset, got {type(dataset).__name__}; "
            "wrap arrays with Dataset.from_tensor_slices"
        )
    return open_node(dataset._node, (0,), state)


@dataclasses.dataclass(eq=False)
class FlatMap(Stream):
    parent: Node
    fn: Callable[..., Any]

    def open(self, key: Key, state: dict | None) -> Any:
        return _FlatMapCursor(self, key, state)


class _FlatMapCursor(_Inside):
    def enter(self, element: Any, state: dict | None) -> Any:
        return dataset_cursor(self.node.fn, element, state)


@dataclasses.dataclass(eq=False)
class Interleave(Stream):
    """tf.data's interleave, transcribed from its sequential (deterministic) algorithm.

    The order follows `cycle_length` and `block_length`, which iterator states record
    (`order_state`): a restore with others is an error naming them, except that a
    `cycle_length` left to phalanx (`auto`: None or AUTOTUNE, the CPU count) takes the
    saved one, so the order continues on a machine with another CPU count.
    """

    parent: Node
    fn: Callable[..., Any]
    cycle_length: int
    block_length: int
    auto: bool = False

    def open(self, key: Key, state: dict | None) -> Any:
        return _InterleaveCursor(self, key, state)

    def order_state(self) -> dict:
        return {"cycle_length": self.cycle_length, "block_length": self.block_length}

    def restore_order(self, saved: Any) -> Node:
        """This node, or one at the saved cycle length; raises if the order cannot be the
        saved one."""
        mine = self.order_state()
        if not isinstance(saved, dict) or set(saved) != set(mine):
            raise ValueError(
                f"expected the state of an interleave with keys {sorted(mine)}, got "
                f"{saved!r}; restore a state saved from the same pipeline"
            )
        if saved == mine:
            return self
        cycle, block = int(saved["cycle_length"]), int(saved["block_length"])
        if self.auto and block == self.block_length:
            return dataclasses.replace(self, cycle_length=cycle)
        raise ValueError(
            "cannot restore this iterator state exactly: the order of interleave depends on "
            f"its cycle_length and block_length, and they differ (cycle_length "
            f"{cycle} -> {self.cycle_length}, block_length {block} -> {self.block_length}). "
            f"Build the dataset as it was saved: interleave(f, cycle_length={cycle}, "
            f"block_length={block}) (cycle_length=None takes the saved one)"
        )


class _InterleaveCursor(_Cursor):
    counters = ("cycle_index", "block_index", "end_of_input")

    def __init__(self, node: Interleave, key: Key, state: dict | None) -> None:
        super().__init__(node, key, state)
        self.slots: list[Any] = [None] * node.cycle_length  # (before, cursor) or None
        for i, saved in enumerate(_get(state, "slots", [None] * node.cycle_length)):
            if saved is not None:
                element = next(open_node(node.parent, key, saved["before"]))
                cursor = dataset_cursor(node.fn, element, saved["inner"])
                self.slots[i] = (saved["before"], cursor)

    def _advance_cycle(self) -> None:
        self.block_index = 0
        self.cycle_index = (self.cycle_index + 1) % self.node.cycle_length

    def __next__(self) -> Any:
        while not self.end_of_input or any(s is not None for s in self.slots):
            slot = self.slots[self.cycle_index]
            if slot is not None:
                try:
                    element = next(slot[1])
                except StopIteration:
                    self.slots[self.cycle_index] = None
                    self._advance_cycle()
                    continue
                self.block_index += 1
                if self.block_index == self.node.block_length:
                    self._advance_cycle()
                return element
            if not self.end_of_input:
                before = self.parent.state()
                try:
                    element = next(self.parent)
                except StopIteration:
                    self.end_of_input = 1
                    continue
                self.slots[self.cycle_index] = (
                    before,
                    dataset_cursor(self.node.fn, element, None),
                )
            else:
                self._advance_cycle()
        raise StopIteration

    def state(self) -> dict:
        slots = [None if s is None else {"before": s[0], "inner": s[1].state()} for s in self.slots]
        return {**super().state(), "slots": slots}
