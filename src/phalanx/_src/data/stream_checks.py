"""Streaming ops that watch the elements go by: ignore_errors and assert_cardinality.

`ignore_errors` drops an element whose computation raised (a corrupt JPEG's decode) and
goes on with the next, which every cursor allows (`stream.RandomCursor` passes the element
that failed). tf.data drops silently unless `log_warning=True`; phalanx never does: the
drops are counted, the first of a pass is warned about at once (with its error) and the
count at the end of the pass, or each one is logged with `log_warning=True`. The count is
part of the iterator state, so a restored pass reports the same total.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from typing import Any

from phalanx._src.data.plan import Key, Node
from phalanx._src.data.stream import Stream, _Cursor

logger = logging.getLogger("phalanx.data")


class DroppedElementsWarning(UserWarning):
    """`ignore_errors()` dropped elements whose computation raised.

    Example:
      >>> warnings.simplefilter("error", phalanx.data.DroppedElementsWarning)  # fail instead
    """


@dataclasses.dataclass(eq=False)
class IgnoreErrors(Stream):
    parent: Node
    log_warning: bool

    def open(self, key: Key, state: dict | None) -> Any:
        return _IgnoreErrorsCursor(self, key, state)


class _IgnoreErrorsCursor(_Cursor):
    counters = ("kept", "dropped")

    def __next__(self) -> Any:
        while True:
            try:
                element = next(self.parent)
            except StopIteration:
                self._summary()
                raise
            except Exception as error:
                self.dropped += 1
                self._report(error)
                continue
            self.kept += 1
            return element

    def _report(self, error: Exception) -> None:
        what = f"{type(error).__name__}: {error}"
        if self.node.log_warning:
            logger.warning("ignore_errors() dropped an element: %s", what)
        elif self.dropped == 1:
            warnings.warn(
                f"ignore_errors() dropped an element whose computation raised {what}. The "
                "drops of this pass are counted and reported at its end; pass "
                "ignore_errors(log_warning=True) to log each one",
                DroppedElementsWarning,
                stacklevel=2,
            )

    def _summary(self) -> None:
        if not self.dropped:
            return
        message = (
            f"ignore_errors() dropped {self.dropped} of the {self.dropped + self.kept} "
            "elements of this pass (their computation raised)"
        )
        if self.node.log_warning:
            logger.warning(message)
        else:
            warnings.warn(message, DroppedElementsWarning, stacklevel=2)


@dataclasses.dataclass(eq=False)
class AssertCardinality(Stream):
    """The parent's elements, raising if there are not exactly `expected` (math.inf: the
    parent never ends); its cardinality is `expected`."""

    parent: Node
    expected: float

    @property
    def cardinality(self) -> float:
        return self.expected

    def open(self, key: Key, state: dict | None) -> Any:
        return _AssertCursor(self, key, state)


class _AssertCursor(_Cursor):
    counters = ("seen",)

    def __next__(self) -> Any:
        expected = self.node.expected
        try:
            element = next(self.parent)
        except StopIteration:
            if self.seen != expected:
                raise ValueError(
                    f"assert_cardinality: the dataset was expected to hold {_count(expected)} "
                    f"elements but held only {self.seen}"
                ) from None
            raise
        self.seen += 1
        if self.seen > expected:
            raise ValueError(
                f"assert_cardinality: the dataset was expected to hold {_count(expected)} "
                f"elements but held at least {self.seen}"
            )
        return element


def _count(expected: float) -> str:
    return "infinitely many" if expected == math.inf else str(int(expected))
