"""Mixing datasets and counting: choose_from_datasets, sample_from_datasets, Dataset.random,
Dataset.counter.

`Choose` streams: it reads the next index from a choice dataset and the next element from
that input; its state holds every input's. `sample_from_datasets` is `Choose` over a
`Categorical` choice, the random-access infinite sequence of input indices drawn with the
weights: element i is a pure function of (seed, i), and of the iteration too when
`rerandomize` asks, so a sampled mix is reproducible and resumes exactly. `Random` and
`Counter` are random-access infinite sources.

The draws hash (seed words, position) with SplitMix64's finalizer, vectorized over the
positions: counter-based, so a position is drawn without the ones before it. The values
differ from tf.data's (Philox streams seeded another way); their distribution does not.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from phalanx._src.data.plan import Key, Node
from phalanx._src.data.stream import Stream, _get, open_node

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def draws(seed: int, key: Key, positions: np.ndarray) -> np.ndarray:
    """64 random bits for each position (uint64), a pure function of its arguments."""
    words = (seed, len(key), *key)  # the key's length keeps (1,) and (1, 0) apart
    base = np.random.SeedSequence(words).generate_state(1, np.uint64)[0]
    with np.errstate(over="ignore"):
        z = base + (positions.astype(np.uint64) + np.uint64(1)) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclasses.dataclass(eq=False)
class Random(Node):
    """tf.data's `Dataset.random`: int64 values in [0, 2**32), forever."""

    seed: int
    rerandomize: bool

    level = 0
    length = None
    seeded = True  # its seed is part of an iterator state (`index_ops.seeds`)

    def get(self, key: Key, positions: np.ndarray) -> Any:
        bits = draws(self.seed, key if self.rerandomize else (), positions)
        return (bits >> np.uint64(32)).astype(np.int64)


@dataclasses.dataclass(eq=False)
class Counter(Node):
    """tf.data's `Dataset.counter`: start, start + step, ... forever."""

    start: int
    step: int
    dtype: Any

    level = 0
    length = None

    def get(self, key: Key, positions: np.ndarray) -> Any:
        return (self.start + self.step * positions).astype(self.dtype)


@dataclasses.dataclass(eq=False)
class Categorical(Node):
    """Input indices drawn with probabilities `weights` (normalized), forever."""

    weights: tuple[float, ...]
    seed: int
    rerandomize: bool

    level = 0
    length = None
    seeded = True

    def get(self, key: Key, positions: np.ndarray) -> Any:
        bits = draws(self.seed, key if self.rerandomize else (), positions)
        uniform = (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53
        edges = np.cumsum(self.weights) / math.fsum(self.weights)
        return np.minimum(np.searchsorted(edges, uniform, side="right"), len(edges) - 1)


@dataclasses.dataclass(eq=False)
class Choose(Stream):
    """Element i: the next element of input `choice[i]` (parents: the choice, the inputs).

    An input that ends stops the mix with `stop_on_empty`; otherwise its later choices are
    passed over, until every input has ended or the choices do."""

    parents: tuple[Node, ...]
    stop_on_empty: bool

    @property
    def cardinality(self) -> float | None:
        counts = [p.cardinality for p in self.parents]
        if counts[0] == 0:
            return 0
        return math.inf if all(c == math.inf for c in counts) else None

    def open(self, key: Key, state: dict | None) -> Any:
        return _ChooseCursor(self, key, state)


class _ChooseCursor:
    def __init__(self, node: Choose, key: Key, state: dict | None) -> None:
        self.node = node
        states = _get(state, "parents", [None] * len(node.parents))
        self.parents = [open_node(p, key, s) for p, s in zip(node.parents, states, strict=True)]
        self.ended = [bool(e) for e in _get(state, "ended", [False] * (len(node.parents) - 1))]

    def __next__(self) -> Any:
        choice, *inputs = self.parents
        while not all(self.ended):
            index = _index(next(choice), len(inputs))
            if self.ended[index]:
                continue
            try:
                return next(inputs[index])
            except StopIteration:
                self.ended[index] = True
                if self.node.stop_on_empty:  # ended for good: later calls end too
                    self.ended = [True] * len(inputs)
        raise StopIteration

    def state(self) -> dict:
        return {"parents": [p.state() for p in self.parents], "ended": self.ended}


def _index(value: Any, count: int) -> int:
    index = np.asarray(value)
    if index.shape != () or index.dtype.kind not in "iu" or not 0 <= int(index) < count:
        raise ValueError(
            f"choose_from_datasets: the choice dataset yielded {index.tolist()!r}; its elements "
            f"must be scalar integers in [0, {count}), one index into `datasets` each"
        )
    return int(index)
