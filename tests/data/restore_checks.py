"""The exact-resume check every op's state test makes: from every position of an epoch, a
state (through JSON, as checkpoints store it) restored in a new iterator gives the rest."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def epoch(iterator: Any) -> list[Any]:
    """The elements left in `iterator`, as NumPy."""
    return [jax.tree.map(np.asarray, e) for e in iterator]


def same(a: Any, b: Any) -> None:
    """Equal trees: structure, dtypes and values."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def assert_restores_exactly(make: Callable[[], Any], first: int = 0) -> None:
    """`make()` builds the pipeline: saved after k elements (k from `first` to the epoch's
    length), a fresh one restored gives the epoch's elements after k, and a new epoch is
    the same epoch again."""
    full = epoch(iter(make()))
    assert len(full) >= 3
    for k in range(first, len(full) + (first == 0)):
        it = iter(make())
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(it.get_state()))  # JSON-ready, as checkpoints store it
        restored = iter(make())
        restored.set_state(state)
        rest = epoch(restored)
        assert len(rest) == len(full) - k, k
        for got, want in zip(rest, full[k:], strict=True):
            same(got, want)
    same(epoch(iter(make())), full)  # deterministic: the same epoch again
