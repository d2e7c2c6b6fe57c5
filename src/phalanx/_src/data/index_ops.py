"""Index arithmetic nodes: shuffle, repeat, shard, take and batch map positions to positions.

None of them touches data: each turns the positions it is asked for into positions of its
parent (and, for repeat, the repetition), so the rows of a batch reach the source as one
index array. See `plan` for the node protocol.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import jax
import numpy as np

from phalanx._src.data.plan import Key, Node, chain, concat, is_ragged, pick, rebuild
from phalanx._src.strategy.layout import ceil_split


@dataclasses.dataclass(eq=False)
class Shuffle(Node):
    """A uniform permutation per iteration (finite parent) or per block of `buffer_size`."""

    parent: Node
    seed: int
    buffer_size: int
    reshuffle: bool

    seeded = True  # its seed is part of an iterator state (`seeds`)
    _perms: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    _lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    def __getstate__(self) -> dict:
        # Sent to a worker process without the lock and the cached permutations.
        names = ("parent", "seed", "buffer_size", "reshuffle")
        return {name: getattr(self, name) for name in names}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _permutation(self, key: Key, block: int, n: int) -> np.ndarray:
        key = key if self.reshuffle else ()
        # The key's length is part of the entropy so (1,) and (1, 0) never collide.
        words = (self.seed, len(key), *key, block)
        with self._lock:
            perm = self._perms.get(words)
        if perm is None:
            perm = np.random.default_rng(words).permutation(n)
            with self._lock:
                if len(self._perms) >= 4:  # Workers may straddle an epoch; keep a few.
                    self._perms.pop(next(iter(self._perms)))
                self._perms[words] = perm
        return perm

    def get(self, key: Key, positions: np.ndarray) -> Any:
        n = self.parent.length
        if n is not None:
            return self.parent.get(key, self._permutation(key, 0, n)[positions])
        # An infinite parent (repeat() before shuffle()) is shuffled block by block.
        size = self.buffer_size
        blocks = positions // size
        source = np.empty_like(positions)
        for block in np.unique(blocks):
            mask = blocks == block
            perm = self._permutation(key, int(block), size)
            source[mask] = block * size + perm[positions[mask] - block * size]
        return self.parent.get(key, source)


@dataclasses.dataclass(eq=False)
class Repeat(Node):
    """The parent `count` times (forever when None); each repetition is a new iteration.

    An empty parent repeated is empty, as in tf.data (forever included)."""

    parent: Node
    count: int | None

    @property
    def length(self) -> int | None:
        n = self.parent.length
        if n == 0:
            return 0
        return None if n is None or self.count is None else n * self.count

    def get(self, key: Key, positions: np.ndarray) -> Any:
        n = self.parent.length
        if n is None or n == 0:
            return self.parent.get(key, positions)
        rounds = positions // n
        if len(positions) == 0 or rounds[0] == rounds[-1]:
            first = int(rounds[0]) if len(positions) else 0
            return self.parent.get((*key, first), positions - first * n)
        # A batch straddling repetitions: fetch each repetition's part, then restore the order.
        order = np.argsort(rounds, kind="stable")
        parts = []
        for r in np.unique(rounds):
            parts.append(self.parent.get((*key, int(r)), positions[rounds == r] - r * n))
        joined = concat(self.level, parts)
        if np.all(order[:-1] < order[1:]):
            return joined
        return pick(self.level, joined, np.argsort(order, kind="stable"))


@dataclasses.dataclass(eq=False)
class Shard(Node):
    """Every `num_shards`-th element starting at `index` (tf.data's shard)."""

    parent: Node
    num_shards: int
    index: int

    @property
    def length(self) -> int | None:
        n = self.parent.length
        return None if n is None else max(0, -(-(n - self.index) // self.num_shards))

    def get(self, key: Key, positions: np.ndarray) -> Any:
        return self.parent.get(key, positions * self.num_shards + self.index)


@dataclasses.dataclass(eq=False)
class Take(Node):
    """The first `count` elements of each iteration."""

    parent: Node
    count: int

    @property
    def length(self) -> int:
        n = self.parent.length
        return self.count if n is None else min(n, self.count)

    def get(self, key: Key, positions: np.ndarray) -> Any:
        return self.parent.get(key, positions)


@dataclasses.dataclass(eq=False)
class Batch(Node):
    """Consecutive elements grouped into batches; `split` keeps one process's share."""

    parent: Node
    size: int
    drop_remainder: bool
    split: tuple[int, int] | None = None  # (index, count)

    level = 1

    @property
    def length(self) -> int | None:
        n = self.parent.length
        if n is None:
            return None
        return n // self.size if self.drop_remainder else -(-n // self.size)

    def rows(self, step: int) -> np.ndarray:
        """Positions in the parent of global batch `step`, or of this process's share of it."""
        start = step * self.size
        stop = start + self.size
        if self.parent.length is not None:
            stop = min(stop, self.parent.length)
        positions = np.arange(start, stop, dtype=np.int64)
        if self.split is not None:
            index, count = self.split
            lo, hi = ceil_split(len(positions), count)[index]
            positions = positions[lo:hi]
        return positions

    def get(self, key: Key, positions: np.ndarray) -> Any:
        if self.parent.level == 1:  # elements held in a list (batches: batch() nests them)
            return [self._stack(key, self.rows(int(s))) for s in positions]
        batches = self._gather(key, positions)
        # One parent call made every batch, so they are all ragged or none is.
        if batches and any(is_ragged(leaf) for leaf in jax.tree.leaves(batches[0])):
            return [dense(batch) for batch in batches]
        return batches

    def _stack(self, key: Key, rows: np.ndarray) -> Any:
        if len(rows):
            return stack_batches(self.parent.get(key, rows))
        # A process's empty share of a batch: the elements' structure with no rows.
        probe = stack_batches(self.parent.get(key, np.zeros(1, np.int64)))
        return jax.tree.map(lambda a: a[:0], probe)

    def _gather(self, key: Key, positions: np.ndarray) -> list[Any]:
        n = self.parent.length
        if (
            len(positions) > 1
            and self.split is None
            and (n is None or positions[-1] < n // self.size)
        ):
            # Full batches only: every batch's positions in one array operation.
            rows = positions[:, None] * self.size + np.arange(self.size)
            joined = self.parent.get(key, rows.reshape(-1))
            leaves, treedef = jax.tree.flatten(joined)
            shaped = [leaf.reshape(len(positions), self.size, *leaf.shape[1:]) for leaf in leaves]
            return [treedef.unflatten([s[i] for s in shaped]) for i in range(len(positions))]
        parts = [self.rows(int(step)) for step in positions]
        if len(parts) <= 1:
            return [self.parent.get(key, rows) for rows in parts]
        # Many batches: one parent call for all their rows (index arithmetic is vectorised,
        # a Python call per batch is not), then split.
        joined = self.parent.get(key, np.concatenate(parts))
        leaves, treedef = jax.tree.flatten(joined)
        bounds = np.cumsum([len(rows) for rows in parts])[:-1]
        pieces = [np.split(leaf, bounds) for leaf in leaves]
        return [treedef.unflatten([p[i] for p in pieces]) for i in range(len(parts))]


def stack_batches(batches: list[Any]) -> Any:
    """Elements of equal shapes (batches: a nested batch) stacked along a new first axis."""
    shapes = sorted({tuple(np.shape(leaf) for leaf in jax.tree.leaves(b)) for b in batches})
    if len(shapes) > 1:
        raise ValueError(
            f"batch() needs elements of one shape, got leaf shapes {shapes}; use "
            "padded_batch() to pad them, or drop_remainder=True on an inner batch() to drop "
            "its short last batch"
        )
    return jax.tree.map(lambda *leaves: np.stack(leaves), *batches)


def dense(batch: Any) -> Any:
    """A batch gathered from a level-0 parent, its `ragged` leaves stacked (or refused)."""
    leaves, treedef = jax.tree.flatten(batch)
    out = []
    for i, leaf in enumerate(leaves):
        if is_ragged(leaf):
            found = sorted({row.shape for row in leaf})
            if len(found) > 1:
                raise ValueError(
                    f"batch() got elements of different shapes {found} in leaf {i}; use "
                    "padded_batch() to pad them to a common shape"
                )
            leaf = np.stack(list(leaf)) if len(leaf) else np.asarray(leaf)
        out.append(leaf)
    return treedef.unflatten(out)


def seeds(root: Node) -> list[int]:
    """The seeds of the chain's random nodes (shuffles, `Dataset.random`, sampling), source
    first: an iterator state records them, so a seed drawn when none was given replays."""
    return [node.seed for node in chain(root) if getattr(node, "seeded", False)]


def with_seeds(root: Node, new_seeds: list[int]) -> Node:
    """The chain with its random nodes' seeds replaced, source first."""
    if len(new_seeds) != len(seeds(root)):
        raise ValueError(
            f"the state holds {len(new_seeds)} seeds but this dataset has {len(seeds(root))} "
            "seeded ops (shuffle, random, sample_from_datasets); restore a state saved from "
            "the same pipeline."
        )
    remaining = iter(new_seeds)

    def change(node: Node) -> Node:
        if getattr(node, "seeded", False):
            return dataclasses.replace(node, seed=int(next(remaining)))
        return node

    return rebuild(root, change)
