"""How `strategy.run` combines each replica's new value of an `nnx.Variable`: one registry.

tf.distribute decides per variable (`synchronization`, `aggregation`); phalanx decides per
`nnx.Variable` type, looked up along the type's MRO, so a subclass inherits its base's rule:

| type                         | aggregation            | why                                      |
|------------------------------|------------------------|------------------------------------------|
| `nnx.Variable` (Param, ...)  | `"only_first_replica"` | tf's mirrored variables: replica 0 wins  |
| `nnx.BatchStat`              | `"mean"`               | tf's ON_READ non-trainables, MEAN        |
| `nnx.metrics.MetricState`    | `"sum"`                | every replica's increments are added     |
| `nnx.RngKey`                 | `"per_replica_rng"`    | never reduced; each replica its stream   |
| `nnx.RngCount`               | `"only_first_replica"` | advances identically on every replica    |

A user type declares its own rule with `register_variable_aggregation`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

AGGREGATIONS = ("only_first_replica", "mean", "sum", "per_replica_rng")

_REGISTRY: dict[type, str] = {
    nnx.Variable: "only_first_replica",
    nnx.BatchStat: "mean",
    nnx.metrics.MetricState: "sum",
    nnx.RngKey: "per_replica_rng",
    nnx.RngCount: "only_first_replica",
}


def register_variable_aggregation(var_type: type, aggregation: str) -> type:
    """Declares how `strategy.run` combines the replicas' new values of `var_type`.

    Subclasses inherit the rule unless they register their own.

    Args:
      var_type: an `nnx.Variable` subclass.
      aggregation: one of
        * "only_first_replica": every replica takes replica 0's value (tf's mirrored rule);
        * "mean": the mean of the replicas' new values (tf's ON_READ / MEAN);
        * "sum": the old value plus the sum of every replica's change (metric counters);
        * "per_replica_rng": a JAX PRNG key; inside `run` each replica uses the key folded
          with its replica index, and the stored key is never changed or reduced.

    Returns:
      `var_type`, so that the call can follow a class definition.

    Raises:
      TypeError: `var_type` is not an `nnx.Variable` subclass.
      ValueError: an unknown aggregation.

    Example:
      >>> class RunningMax(nnx.Variable): ...
      >>> phalanx.register_variable_aggregation(RunningMax, "mean")
    """
    if not (isinstance(var_type, type) and issubclass(var_type, nnx.Variable)):
        raise TypeError(f"var_type must be an nnx.Variable subclass, got {var_type!r}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"unknown aggregation {aggregation!r} for {var_type.__name__}; use one of "
            f"{AGGREGATIONS}"
        )
    _REGISTRY[var_type] = aggregation
    return var_type


def variable_aggregation(var_type: type) -> str:
    """The aggregation registered for `var_type` or its nearest registered base class."""
    for base in var_type.__mro__:
        if base in _REGISTRY:
            return _REGISTRY[base]
    return "only_first_replica"


def per_replica_key(key: jax.Array, axis: str) -> jax.Array:
    """`key` folded with this replica's index: one reproducible stream per replica."""
    return jax.random.fold_in(key, lax.axis_index(axis))


def combine(aggregation: str, before: jax.Array, after: jax.Array, axis: str) -> jax.Array:
    """The value every replica keeps after `run`, from its entry value and its new value."""
    if aggregation == "per_replica_rng":
        return before  # the folded key lived only inside run; the stored key is unchanged
    if aggregation == "sum":
        return before + lax.psum(after - before, axis)
    if aggregation == "mean":
        return lax.pmean(after, axis).astype(after.dtype)
    first = lax.axis_index(axis) == 0
    return lax.psum(jnp.where(first, after, jnp.zeros_like(after)), axis)
