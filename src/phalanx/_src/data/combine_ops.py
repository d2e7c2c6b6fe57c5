"""Random-access nodes for skip, enumerate, zip and concatenate: still index arithmetic.

`Skip` only shifts positions (so `row_indices` keeps working); `Enumerate` adds the position
as a computed leaf; `Zip` and `Concatenate` read several parents at the same positions (or
at positions past the first parent). See `plan` for the node protocol.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from phalanx._src.data.plan import Key, Node, concat, pick


@dataclasses.dataclass(eq=False)
class Skip(Node):
    """Every element after the first `count` of each iteration."""

    parent: Node
    count: int

    @property
    def length(self) -> int | None:
        n = self.parent.length
        return None if n is None else max(0, n - self.count)

    def get(self, key: Key, positions: np.ndarray) -> Any:
        return self.parent.get(key, positions + self.count)


@dataclasses.dataclass(eq=False)
class Enumerate(Node):
    """`(start + position, element)`: the position is an int64 leaf (a scalar per batch)."""

    parent: Node
    start: int

    def get(self, key: Key, positions: np.ndarray) -> Any:
        elements = self.parent.get(key, positions)
        counters = positions.astype(np.int64) + self.start
        if self.level == 1:
            return [(np.int64(c), e) for c, e in zip(counters, elements, strict=True)]
        return (counters, elements)


@dataclasses.dataclass(eq=False)
class Zip(Node):
    """A tuple of the parents' elements at each position; as long as the shortest."""

    parents: tuple[Node, ...]

    @property
    def level(self) -> int:
        return self.parents[0].level

    @property
    def length(self) -> int | None:
        lengths = [p.length for p in self.parents if p.length is not None]
        return min(lengths) if lengths else None

    def get(self, key: Key, positions: np.ndarray) -> Any:
        parts = [p.get(key, positions) for p in self.parents]
        if self.level == 1:
            return [tuple(batch) for batch in zip(*parts, strict=True)]
        return tuple(parts)


@dataclasses.dataclass(eq=False)
class Concatenate(Node):
    """The first parent's elements, then the second's (the first must be finite)."""

    parents: tuple[Node, Node]

    @property
    def level(self) -> int:
        return self.parents[0].level

    @property
    def length(self) -> int | None:
        first, second = (p.length for p in self.parents)
        return None if second is None else first + second

    def get(self, key: Key, positions: np.ndarray) -> Any:
        first, second = self.parents
        n = first.length
        in_first = positions < n
        if in_first.all():
            return first.get(key, positions)
        if not in_first.any():
            return second.get(key, positions - n)
        order = np.concatenate([np.flatnonzero(in_first), np.flatnonzero(~in_first)])
        joined = concat(
            self.level,
            [first.get(key, positions[in_first]), second.get(key, positions[~in_first] - n)],
        )
        return pick(self.level, joined, np.argsort(order, kind="stable"))
