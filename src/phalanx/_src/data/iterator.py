"""`DatasetIterator`: one epoch of a Dataset, with a position that checkpoints restore."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import jax
import numpy as np

from phalanx._src.data import executors, index_ops, plan, stream
from phalanx._src.strategy.optional import Optional

_STATE_KEYS = frozenset({"epoch", "step", "seeds"})
_STREAM_STATE_KEYS = _STATE_KEYS | {"cursor"}  # a streaming pipeline's counters (stream.py)
_ORDER_KEY = "order"  # what decides a record source's order (records/fingerprint.py)


def take(iterator: Any, count: int) -> list[Any]:
    """Up to `count` next items of `iterator`: with its `next_many` when it has one."""
    many = getattr(iterator, "next_many", None)
    if many is not None:
        return many(count)
    return list(itertools.islice(iterator, count))


class DatasetIterator:
    """Iterates one epoch of a `Dataset`; `get_state`/`set_state` save and restore it.

    Without map workers or prefetch, elements are computed in the calling thread. With
    them, an executor (`executors`: threads, worker processes, or AUTOTUNE's measured
    choice) computes elements in order, a few ahead. Either way the position is simply the
    epoch and the number of elements already returned, because every element is a pure
    function of (seeds, epoch, step): a restored iterator yields exactly what the original
    would have.

    Example:
      >>> it = iter(ds)
      >>> first = next(it)
      >>> state = it.get_state()  # {"epoch": 0, "step": 1, "seeds": [...]}, JSON-ready
      >>> it2 = iter(ds); it2.set_state(state)
      >>> next(it2)  # the same batch `next(it)` returns
    """

    checkpointable = True

    def __init__(self, dataset: Any, epoch: int):
        # `dataset`: the `Dataset` (not imported: the builder imports this module).
        self._dataset = dataset
        self._node = dataset._node
        self._epoch = epoch
        self._step = 0
        self._executor: Any = None
        # A streaming pipeline (filter, from_generator, ...) is read in order by a cursor.
        self._streaming = isinstance(self._node, stream.Stream)
        self._cursor: Any = None
        self._cursor_state: Any = None
        self._seeds_of: Any = None  # the node whose seeds `_seed_values` holds
        self._seed_values: list[int] = []
        self._order: list[dict] = []  # `plan.order_states` of `_seeds_of`
        # Read once: walking the chain on every next() would cost more than the check.
        self._threaded = not self._streaming and (dataset.num_workers > 0 or dataset._prefetch != 0)

    @property
    def epoch(self) -> int:
        """The epoch this iterator walks (the number of earlier `iter()` calls)."""
        return self._epoch

    @property
    def step(self) -> int:
        """The number of elements returned so far in this epoch."""
        return self._step

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        if self._streaming:
            if self._cursor is None:
                self._cursor = stream.open_node(self._node, (self._epoch,), self._cursor_state)
            element = next(self._cursor)
            self._step += 1
            return element
        length = self._node.length
        if length is not None and self._step >= length:
            self._finish()
            raise StopIteration
        if not self._threaded:
            element = plan.element(self._node, (self._epoch,), self._step)
        else:
            if self._executor is None:
                stop = sys.maxsize if length is None else length
                key = (self._epoch,)
                self._executor = executors.for_pipeline(
                    self._dataset, self._node, key, self._step, stop
                ) or executors.Inline(lambda step: plan.element(self._node, key, step), 0, 0)
            try:
                element = self._executor.next()
            except BaseException:
                self.close()  # stop workers at once; iterating again restarts them here
                raise
        self._step += 1
        return element

    @property
    def worker_pids(self) -> list[int]:
        """The ids of the worker processes computing elements now (empty without any)."""
        return list(getattr(self._executor, "pids", []))

    def get_next(self) -> Any:
        """The next element, as tf.data's `iterator.get_next()` (StopIteration at the end)."""
        return next(self)

    def get_next_as_optional(self) -> Optional:
        """The next element in an `Optional`, empty at the end instead of raising.

        Example:
          >>> optional = it.get_next_as_optional()
          >>> if optional.has_value():
          ...     batch = optional.get_value()
        """
        return Optional.next_of(self)

    @property
    def element_spec(self) -> Any:
        """The dataset's `element_spec`."""
        return self._dataset.element_spec

    def next_many(self, count: int) -> list[Any]:
        """Up to `count` next elements (fewer at the end of the epoch), computed together.

        For a pipeline of index arithmetic over in-memory arrays (shuffle, repeat, batch...)
        one call computes every element's rows at once: ~100x less Python per batch than
        `next()`, which is what feeding row numbers to the devices needs (issue 9).

        Example:
          >>> it = iter(ds)
          >>> batches = it.next_many(50)   # == [next(it) for _ in range(50)]
        """
        if self._streaming or self._threaded:
            return list(itertools.islice(self, count))
        length = self._node.length
        stop = self._step + count if length is None else min(self._step + count, length)
        if stop <= self._step:
            self.close()
            return []
        steps = np.arange(self._step, stop, dtype=np.int64)
        elements = self._node.get((self._epoch,), steps)
        if self._node.level == 0:
            elements = [jax.tree.map(lambda a, i=i: a[i], elements) for i in range(len(steps))]
        self._step = stop
        return list(elements)

    def get_state(self, back: int = 0) -> dict[str, Any]:
        """The position: a small JSON-serialisable dict (epoch, step, shuffle seeds).

        Over record files it also holds what decides their order (`"order"`: the files'
        count, a hash of their names and sizes, the interleave width), which `set_state`
        checks, so a restore continues exactly or raises an error saying what differs.

        `back`: the position that many elements earlier in this epoch (for a consumer that
        took several elements with `next_many` and uses them one by one).
        """
        if not 0 <= back <= self._step or (back and self._streaming):
            raise ValueError(f"cannot go back {back} elements from step {self._step}")
        state = {"epoch": self._epoch, "step": self._step - back, "seeds": self._seeds()}
        if self._order:
            state[_ORDER_KEY] = [dict(order) for order in self._order]
        if self._streaming:
            cursor = self._cursor
            state["cursor"] = self._cursor_state if cursor is None else cursor.state()
        return state

    def _seeds(self) -> list[int]:
        """The pipeline's shuffle seeds (a fresh list), read from the chain once per node:
        a loop that saves the position of every batch asks for them at every step."""
        if self._seeds_of is not self._node:
            self._seeds_of = self._node
            self._seed_values = [int(s) for s in index_ops.seeds(self._node)]
            self._order = plan.order_states(self._node)
        return list(self._seed_values)

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves to a position saved by `get_state`, possibly from another process.

        The dataset adopts the state's shuffle seeds (so later epochs replay too) and its
        next `iter()` starts at the following epoch.

        Over record files, the sources adopt the state's interleave width where it was
        AUTOTUNE's (so the order continues on a machine with another CPU count); any other
        difference in what decides their order is an error naming it.

        Raises:
          ValueError: the state does not come from this pipeline, or it cannot continue
            exactly here (other record files, another num_parallel_reads).
        """
        keys = _STREAM_STATE_KEYS if self._streaming else _STATE_KEYS
        self._seeds()
        if self._order:
            keys = keys | {_ORDER_KEY}
        if not isinstance(state, dict) or set(state) != keys:
            raise ValueError(
                f"expected a state from DatasetIterator.get_state() with keys "
                f"{sorted(keys)}, got {state!r}."
            )
        if self._order:  # checked first: an error leaves the dataset as it was
            ordered = plan.with_order_states(self._dataset._node, state[_ORDER_KEY])
        epoch, step = int(state["epoch"]), int(state["step"])
        length = self._node.length
        if epoch < 0 or step < 0 or (length is not None and step > length):
            raise ValueError(
                f"state {state!r} is out of range for a dataset of {length} elements per "
                "epoch; restore a state saved from the same pipeline."
            )
        if self._order:
            self._dataset._node = ordered
        self._dataset._reseed([int(s) for s in state["seeds"]])
        self._dataset._continue_after(epoch)
        self.close()
        self._node = self._dataset._node
        self._epoch, self._step = epoch, step
        if self._streaming:
            self._cursor, self._cursor_state = None, state["cursor"]

    def _finish(self) -> None:
        """At the epoch's end: idle worker processes go to the dataset for its next epoch."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.release(self._dataset._park)

    def close(self) -> None:
        """Stops the worker threads or processes, if any; iterating again restarts them at
        this position."""
        executor, self._executor = getattr(self, "_executor", None), None
        if executor is not None:
            executor.close()

    def __enter__(self) -> DatasetIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
