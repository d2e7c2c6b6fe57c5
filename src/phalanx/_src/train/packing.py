"""The training state's leaves as the compiled calls take them: scalars packed by dtype.

A state has many scalar leaves: metric sums and counts, the optimizer's step count and
injected hyperparameters, the accumulator's counters, the loss scale. Each argument costs
jit's dispatch a buffer on every device at every call: 10 scalars add ~33 us per call on one
XLA:CPU device and ~130 us on 8 (issue 9), a few percent of a small step. So between the
compiled calls the state lives as its array leaves plus one vector per dtype holding its
scalars, in two segments (the metric sums first, which evaluation donates and
`reset_metrics` zeroes, then the rest); the calls unpack them inside jit, where that costs
nothing, and pack their results again.

Example:
  >>> packing = Packing.of(treedef, leaves, metric_leaves=2)
  >>> packed = packing.pack(leaves)          # fewer arguments, same values
  >>> packing.unpack(packed)                 # the leaves again, inside or outside jit
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class _Segment:
    arrays: tuple[int, ...]  # leaf indices kept as they are
    scalars: tuple[tuple[int, ...], ...]  # leaf indices packed together, one group per dtype

    @property
    def size(self) -> int:
        return len(self.arrays) + len(self.scalars)


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

    @property
    def metric_count(self) -> int:
        """How many packed entries hold the metric sums (they come first)."""
        return self.segments[0].size

    def pack(self, leaves: list) -> list:
        """The packed entries of `leaves` (inside jit, or eagerly once)."""
        out = []
        for seg in self.segments:
            out.extend(leaves[i] for i in seg.arrays)
            out.extend(jnp.stack([leaves[i] for i in group]) for group in seg.scalars)
        return out

    def unpack(self, packed: list) -> list:
        """The leaves of `packed`, in the state's order, with their original dtypes (inside
        jit, where splitting the vectors costs nothing)."""
        return self._assemble(packed, _entries)

    def leaves(self, packed: list) -> list:
        """`unpack` outside jit: the arrays as they are, the scalars split in one call."""
        return self._assemble(packed, self._split)

    def _assemble(self, packed: list, split: Any) -> list:
        vectors = [packed[i] for i in self._vector_positions]
        scalars = iter(split(vectors) if vectors else ())
        leaves: list = [None] * self.treedef.num_leaves
        at = 0
        for seg in self.segments:
            for i in seg.arrays:
                leaves[i] = packed[at]
                at += 1
            for group in seg.scalars:
                for i in group:
                    leaves[i] = next(scalars)
                at += 1
        return leaves

    @functools.cached_property
    def _vector_positions(self) -> list[int]:
        positions, at = [], 0
        for seg in self.segments:
            at += len(seg.arrays)
            positions.extend(range(at, at + len(seg.scalars)))
            at += len(seg.scalars)
        return positions

    @functools.cached_property
    def _split(self) -> Any:
        return jax.jit(_entries)

    def shardings(self, leaf_shardings: list, replicated: Any) -> list:
        """The packed entries' shardings, given each leaf's (packed scalars: replicated)."""
        out = []
        for seg in self.segments:
            out.extend(leaf_shardings[i] for i in seg.arrays)
            out.extend(replicated for _ in seg.scalars)
        return out


def _entries(vectors: list) -> list:
    """Every entry of every vector, in order."""
    return [x for vector in vectors for x in vector]


def _segment(leaves: list, lo: int, hi: int) -> _Segment:
    arrays, groups = [], {}
    for i in range(lo, hi):
        leaf = leaves[i]
        if _packable(leaf):
            groups.setdefault(leaf.dtype, []).append(i)
        else:
            arrays.append(i)
    return _Segment(tuple(arrays), tuple(tuple(group) for group in groups.values()))


def _packable(leaf: Any) -> bool:
    """A replicated scalar of a NumPy dtype (not a PRNG key), not weakly typed (a vector's
    entries would lose that type)."""
    sharding = getattr(leaf, "sharding", None)
    return (
        np.ndim(leaf) == 0
        and isinstance(getattr(leaf, "dtype", None), np.dtype)
        and not getattr(leaf, "weak_type", False)
        and (sharding is None or sharding.is_fully_replicated)
    )
