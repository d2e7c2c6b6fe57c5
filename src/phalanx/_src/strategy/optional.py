"""`Optional`: what `get_next_as_optional` returns, for phalanx.data's iterators and the
strategy's distributed iterators alike (tf.experimental.Optional)."""

from __future__ import annotations

from typing import Any

import numpy as np


class Optional:
    """A value that may be absent, as tf.experimental.Optional (from `get_next_as_optional`).

    Example:
      >>> optional = iter(phalanx.data.Dataset.range(1)).get_next_as_optional()
      >>> optional.has_value(), optional.get_value()   # (True, 0)
    """

    def __init__(self, present: bool, value: Any) -> None:
        self._present = present
        self._value = value

    @classmethod
    def next_of(cls, iterator: Any) -> Optional:
        """`iterator`'s next item, or an empty Optional at its end (`get_next_as_optional`)."""
        try:
            return cls(True, next(iterator))
        except StopIteration:
            return cls(False, None)

    def has_value(self) -> np.bool_:
        """Whether a value is present (a NumPy bool, as TF returns a bool tensor)."""
        return np.bool_(self._present)

    def get_value(self) -> Any:
        """The value; raises ValueError when there is none (the iterator had ended)."""
        if not self._present:
            raise ValueError(
                "this Optional holds no value: the iterator had reached its end; check "
                "has_value() first"
            )
        return self._value

    def __repr__(self) -> str:
        return f"Optional({self._value!r})" if self._present else "Optional(<empty>)"
