"""`ReduceOp`: how values from several replicas combine."""

from __future__ import annotations

import enum


class ReduceOp(enum.Enum):
    """How `strategy.reduce` and `ReplicaContext.all_reduce` combine per-replica values.

    Strings are accepted wherever a `ReduceOp` is, case-insensitively: `"sum"`, `"mean"`,
    `"max"`, `"min"`.

    Example:
      >>> ReduceOp.parse("mean") is ReduceOp.MEAN
      True
    """

    SUM = "SUM"
    MEAN = "MEAN"
    MAX = "MAX"
    MIN = "MIN"

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        """Returns `op` as a `ReduceOp`; raises ValueError naming the legal values otherwise."""
        if isinstance(op, cls):
            return op
        if isinstance(op, str) and op.upper() in cls.__members__:
            return cls[op.upper()]
        legal = ", ".join(f"ReduceOp.{name}" for name in cls.__members__)
        raise ValueError(
            f"unknown reduce op {op!r}; use one of {legal} (or the strings 'sum', 'mean', "
            "'max', 'min'), e.g. strategy.reduce('sum', value, axis=None)"
        )
