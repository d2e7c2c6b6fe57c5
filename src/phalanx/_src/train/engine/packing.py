"""The training state's leaves as the compiled calls take them: scalars packed by width.

A state has many scalars beside its arrays: metric sums and counts, the optimizer's step
count and injected hyperparameters, the accumulator's counters, the loss scale. Each
argument costs jit's dispatch a buffer on every device at every call, and each result
another: 10 scalars add ~33 us per call on one XLA:CPU device and ~130 us on 8 (issue 9), a
few percent of a small step. So between the compiled calls the state lives as its arrays
plus one flat vector per bit width holding every replicated scalar, in two segments: the
metric sums first (no call donates them, so `reset_metrics` puts in one set of zeros every
time), then the rest. The calls unpack the vectors inside jit, where a slice costs nothing,
and pack their results again (one small concatenation). Leaves of one width share a vector
of unsigned integers, bit for bit (an int32 step count beside a float32 loss scale: one
uint32 vector; zero bits are zero in every dtype, so zeroing a vector zeroes its leaves).

Arrays stay arguments of their own, as a hand-written loop passes them. Packing the small
ones too (biases, normalization scales and their moments, up to 4,096 elements) saved
~100-270 us a call on 8 fake CPU devices (benchmarks/bench_dispatch.py) but made XLA:CPU
compile a kernel for each leaf's bit cast in and out: keras.io's TabTransformer, ~300 small
leaves, took 15.8 s to its first step against Keras's 11.9 s, and 11.8 s with scalars only
(issue 23).

Example:
  >>> packing = Packing.of(treedef, leaves, metric_leaves=2)
  >>> packed = packing.pack(leaves)          # fewer arguments, same values
  >>> packing.unpack(packed)                 # the leaves again, inside or outside jit
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where one packed leaf sits in its vector."""

    leaf: int  # its index in the state's leaves
    start: int  # its first entry in the vector
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class _Segment:
    arrays: tuple[int, ...]  # leaf indices kept as they are
    vectors: tuple[tuple[_Slot, ...], ...]  # the leaves packed together, one vector per width

    @property
    def size(self) -> int:
        return len(self.arrays) + len(self.vectors)


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where each leaf of a state of structure `treedef` sits in its packed form."""

    treedef: Any
    segments: tuple[_Segment, ...]  # the metric leaves' segment, then the others'

    @classmethod
    def of(cls, treedef: Any, leaves: list, metric_leaves: int) -> Packing:
        """The packing of `leaves`, whose first `metric_leaves` are the metric sums."""
        bounds = ((0, metric_leaves), (metric_leaves, len(leaves)))
        return cls(treedef, tuple(_segment(leaves, lo, hi) for lo, hi in bounds))

    @functools.cached_property
    def metric_count(self) -> int:
        """How many packed entries hold the metric sums (they come first; asked every call)."""
        return self.segments[0].size

    def pack(self, leaves: list) -> list:
        """The packed entries of `leaves` (inside jit)."""
        out = []
        for seg in self.segments:
            out.extend(leaves[i] for i in seg.arrays)
            out.extend(_join([leaves[s.leaf] for s in slots]) for slots in seg.vectors)
        return out

    def pack_placed(self, leaves: list) -> list:
        """`pack` outside jit, for leaves on the devices: the scalars are joined on the
        host (a few bytes) and the vectors placed as the leaves were, with nothing compiled
        (op by op, the joins compiled ~14 programs before fit's first step: ~0.2-0.4 s)."""
        out = []
        for seg in self.segments:
            out.extend(leaves[i] for i in seg.arrays)
            for slots in seg.vectors:
                group = [leaves[s.leaf] for s in slots]
                host = _join_host(jax.device_get(group))
                sharding = getattr(group[0], "sharding", None)
                out.append(host if sharding is None else _place(host, sharding))
        return out

    def abstract(self, packed: list) -> list:
        """The leaves of `packed` as `jax.ShapeDtypeStruct`s (with the arrays' shardings),
        without splitting the vectors: what a trace needs of the state."""
        leaves: list = [None] * self.treedef.num_leaves
        at = 0
        for seg in self.segments:
            for i in seg.arrays:
                a = packed[at]
                sharding = getattr(a, "sharding", None)
                leaves[i] = jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
                at += 1
            for slots in seg.vectors:
                sharding = getattr(packed[at], "sharding", None)
                for slot in slots:
                    leaves[slot.leaf] = jax.ShapeDtypeStruct(
                        slot.shape, slot.dtype, sharding=sharding
                    )
                at += 1
        return leaves

    def unpack(self, packed: list) -> list:
        """The leaves of `packed`, in the state's order, with their own shapes and dtypes
        (inside jit, where splitting the vectors costs nothing)."""
        return self._assemble(packed, functools.partial(_entries, self._slots))

    def leaves(self, packed: list) -> list:
        """`unpack` outside jit: the arrays as they are, the vectors fetched in one copy,
        split on the host and each leaf placed as its vector was (no program to compile:
        a compiled split cost ~0.3-0.5 s at the end of a model's first `fit`)."""
        return self._assemble(packed, self._split_host)

    def _assemble(self, packed: list, split: Any) -> list:
        vectors = [packed[i] for i in self._vector_positions]
        entries = iter(split(vectors) if vectors else ())
        leaves: list = [None] * self.treedef.num_leaves
        at = 0
        for seg in self.segments:
            for i in seg.arrays:
                leaves[i] = packed[at]
                at += 1
            for slots in seg.vectors:
                for slot in slots:
                    leaves[slot.leaf] = next(entries)
                at += 1
        return leaves

    @functools.cached_property
    def _vector_positions(self) -> list[int]:
        positions, at = [], 0
        for seg in self.segments:
            at += len(seg.arrays)
            positions.extend(range(at, at + len(seg.vectors)))
            at += len(seg.vectors)
        return positions

    @functools.cached_property
    def _slots(self) -> tuple[tuple[_Slot, ...], ...]:
        """The slots of every vector, in the order of the packed entries."""
        return tuple(slots for seg in self.segments for slots in seg.vectors)

    def _split_host(self, vectors: list) -> list:
        hosts = jax.device_get(vectors)
        out = []
        for vector, host, slots in zip(vectors, hosts, self._slots, strict=True):
            sharding = getattr(vector, "sharding", None)
            for slot in slots:
                part = np.asarray(host)[slot.start : slot.start + slot.size]
                part = part.view(slot.dtype).reshape(slot.shape)
                out.append(part if sharding is None else _place(part, sharding))
        return out

    def shardings(self, leaf_shardings: list, replicated: Any) -> list:
        """The packed entries' shardings, given each leaf's (the vectors: replicated)."""
        out = []
        for seg in self.segments:
            out.extend(leaf_shardings[i] for i in seg.arrays)
            out.extend(replicated for _ in seg.vectors)
        return out


def _carrier(dtype: np.dtype) -> np.dtype:
    """The dtype of the vector that carries leaves of `dtype`: the unsigned integer of its
    width (bool stays bool: XLA does not bitcast it)."""
    return dtype if dtype == np.bool_ else np.dtype(f"uint{8 * dtype.itemsize}")


def _join(leaves: list) -> Any:
    """One flat vector of the leaves' bits, in order."""
    flat = []
    for leaf in leaves:
        carrier = _carrier(leaf.dtype)
        bits = leaf if leaf.dtype == carrier else lax.bitcast_convert_type(leaf, carrier)
        flat.append(jnp.ravel(bits))
    return flat[0] if len(flat) == 1 else jnp.concatenate(flat)


def _join_host(leaves: list) -> np.ndarray:
    """`_join` in NumPy: the leaves' bits (`.view` reinterprets them) in one flat vector."""
    flat = []
    for leaf in leaves:
        leaf = np.asarray(leaf)
        flat.append(np.ravel(leaf.view(_carrier(leaf.dtype))))
    return np.concatenate(flat)


def _place(host: np.ndarray, sharding: Any) -> jax.Array:
    """`host` on every device of the replicated `sharding` (any process count)."""
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _entries(vector_slots: tuple[tuple[_Slot, ...], ...], vectors: list) -> list:
    """Every leaf held by `vectors`, in order, in its own shape and dtype."""
    out = []
    for vector, slots in zip(vectors, vector_slots, strict=True):
        for slot in slots:
            part = vector[slot.start : slot.start + slot.size].reshape(slot.shape)
            if part.dtype != slot.dtype:
                part = lax.bitcast_convert_type(part, slot.dtype)
            out.append(part)
    return out


def _segment(leaves: list, lo: int, hi: int) -> _Segment:
    arrays, groups = [], {}
    for i in range(lo, hi):
        leaf = leaves[i]
        if _packable(leaf):
            groups.setdefault(_carrier(leaf.dtype), []).append(i)
        else:
            arrays.append(i)
    vectors = []
    for group in groups.values():
        slots, start = [], 0
        for i in group:
            slot = _Slot(i, start, tuple(np.shape(leaves[i])), np.dtype(leaves[i].dtype))
            slots.append(slot)
            start += slot.size
        vectors.append(tuple(slots))
    return _Segment(tuple(arrays), tuple(vectors))


def _packable(leaf: Any) -> bool:
    """A replicated scalar of a real NumPy dtype (not a PRNG key, not complex), not weakly
    typed (a vector's entries would lose that type)."""
    sharding = getattr(leaf, "sharding", None)
    dtype = getattr(leaf, "dtype", None)
    return (
        isinstance(dtype, np.dtype)
        and np.ndim(leaf) == 0
        and (
            dtype == np.bool_
            or jnp.issubdtype(dtype, jnp.integer)
            or jnp.issubdtype(dtype, jnp.floating)
        )
        and not getattr(leaf, "weak_type", False)
        and (sharding is None or sharding.is_fully_replicated)
    )
