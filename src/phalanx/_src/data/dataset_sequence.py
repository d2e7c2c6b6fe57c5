"""`Dataset`'s ops over the sequence of elements: scan, reduce, take_while, unique, apply,
get_single_element, ignore_errors, and `experimental.assert_cardinality`.

Mixed into `Dataset`. The ops that yield elements stream (`stream_scan`, `stream_checks`);
`reduce` and `get_single_element` iterate and return values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx._src.data import element_ops, executors, plan, stream_checks, stream_scan, validation


class DatasetSequence:
    """Mixed into `Dataset`; see the module docstring."""

    _node: plan.Node
    _streaming: bool

    def _then(self, node: plan.Node) -> Any:
        raise NotImplementedError

    def scan(self, initial_state: Any, scan_func: Callable[[Any, Any], Any]) -> Any:
        """A running state over the elements, as tf.data's `scan`.

        `scan_func(state, element)` returns `(new_state, output)`; the outputs are the
        elements. The state is part of the iterator state (saved exactly), so it must be a
        tuple, list or dict of NumPy arrays, numbers and strings.

        Example:
          >>> Dataset.range(4).scan(np.int64(0), lambda s, x: (s + x, s + x))   # 0, 1, 3, 6
        """
        if not callable(scan_func):
            raise TypeError(
                f"scan() needs a function (state, element) -> (state, output), got {scan_func!r}"
            )
        state = validation.to_numpy_tree(initial_state, "scan's initial_state")
        return self._then(stream_scan.Scan(self._node, state, scan_func))

    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        """`reduce_func(state, element)` folded over one epoch, as tf.data's `reduce`.

        Returns:
          The final state (NumPy values).

        Example:
          >>> Dataset.range(5).reduce(np.int64(0), lambda total, x: total + x)   # 10
        """
        state = validation.to_numpy_tree(initial_state, "reduce's initial_state")
        for element in self:  # type: ignore[attr-defined]
            state = validation.to_numpy_tree(reduce_func(state, element), "reduce's state")
        return state

    def take_while(self, predicate: Callable[..., Any]) -> Any:
        """The elements up to the first for which `predicate` is False, as tf.data's.

        Example:
          >>> Dataset.range(10).take_while(lambda x: x < 3)   # 0, 1, 2
        """
        if not callable(predicate):
            raise TypeError(f"take_while() needs a function element -> bool, got {predicate!r}")
        return self._then(stream_scan.TakeWhile(self._node, predicate))

    def unique(self) -> Any:
        """Each element the first time it occurs, as tf.data's `unique`.

        Elements must be scalar integers, strings or bytes. A restored iterator reads the
        epoch's elements again up to its position, to know which it has seen.

        Example:
          >>> Dataset.from_tensor_slices([1, 2, 1, 3]).unique()   # 1, 2, 3
        """
        return self._then(stream_scan.Unique(self._node))

    def apply(self, transformation_func: Callable[[Any], Any]) -> Any:
        """`transformation_func(self)`, which must return a Dataset, as tf.data's `apply`.

        Example:
          >>> ds.apply(lambda d: d.filter(keep).batch(32))
        """
        out = transformation_func(self)
        if not isinstance(getattr(out, "_node", None), plan.Node):
            raise TypeError(
                f"apply()'s function must return a phalanx.data.Dataset, got {type(out).__name__}"
            )
        return out

    def get_single_element(self) -> Any:
        """The dataset's one element, as tf.data's `get_single_element`.

        Raises:
          ValueError: the dataset is empty or holds more than one element.

        Example:
          >>> Dataset.range(5).batch(5).get_single_element()   # array([0, 1, 2, 3, 4])
        """
        iterator = iter(self)  # type: ignore[call-overload]
        try:
            element = next(iterator)
        except StopIteration:
            raise ValueError("get_single_element(): the dataset is empty") from None
        for _ in iterator:
            raise ValueError(
                "get_single_element(): the dataset holds more than one element; e.g. take(1) "
                "or batch() it first"
            )
        return element

    def ignore_errors(self, log_warning: bool = False) -> Any:
        """Drops the elements whose computation raised (a corrupt file's decode), as tf.data's.

        Unlike tf.data, never silently: the first drop of a pass is warned about at once,
        with its error, and the pass's count at its end (a `DroppedElementsWarning`); with
        `log_warning=True` each drop is logged on the "phalanx.data" logger instead. A
        `map` with `num_parallel_calls` right before keeps its threads.

        Example:
          >>> images = files.map(decode, num_parallel_calls=AUTOTUNE).ignore_errors()
        """
        node = self._node
        if isinstance(node, element_ops.Map) and node.workers and node.kind == "thread":
            # Its threads compute positions ahead; dropping needs them in order, which a
            # streaming map gives, with the same values and random streams.
            node = executors.ParallelStreamMap(node.parent, node.fn, node.workers)
        return self._then(stream_checks.IgnoreErrors(node, bool(log_warning)))


def assert_cardinality(expected_cardinality: int) -> Callable[[Any], Any]:
    """A transformation (for `Dataset.apply`) asserting the number of elements, as
    `tf.data.experimental.assert_cardinality`.

    The dataset's `cardinality` becomes `expected_cardinality` (so `len` and Keras progress
    bars know it after a `filter`); iterating raises if the count differs. A known count is
    checked at once.

    Args:
      expected_cardinality: the number of elements; `math.inf` (or -1, tf.data's
        INFINITE_CARDINALITY) for a dataset that never ends.

    Raises:
      ValueError: a known count that differs; while iterating, one found to differ.

    Example:
      >>> ds = ds.filter(keep).apply(phalanx.data.experimental.assert_cardinality(900))
    """
    expected = expected_cardinality
    if expected == -1 or expected == math.inf:
        expected = math.inf
    elif isinstance(expected, bool) or not isinstance(expected, int | np.integer) or expected < 0:
        raise ValueError(
            f"assert_cardinality takes a count >= 0 (or math.inf), got {expected_cardinality!r}"
        )

    def apply(dataset: Any) -> Any:
        known = dataset._node.cardinality
        if known is None:
            return dataset._then(stream_checks.AssertCardinality(dataset._node, expected))
        if known != expected:
            raise ValueError(
                f"assert_cardinality({expected_cardinality}): the dataset has {known} elements"
            )
        return dataset

    return apply
