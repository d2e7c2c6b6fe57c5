"""`strategy.reduce`: per-replica values to one value, tf.distribute's semantics, pads excluded."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from phalanx._src.strategy.reduce_op import ReduceOp
from phalanx._src.strategy.values import DISTRIBUTED, MIRRORED, PerReplica, unmask

if TYPE_CHECKING:
    from phalanx._src.strategy.base import StrategyLike


def _safe_div(total: jax.Array, count: jax.Array) -> jax.Array:
    return jnp.where(count == 0, 0.0, total / jnp.where(count == 0, 1, count))


@functools.partial(jax.jit, static_argnames=("op", "axis"))
def _reduce_stacked(stacked: jax.Array, mask: jax.Array | None, op: ReduceOp, axis: int | None):
    """Reduces `stacked` (replicas, *value) over replicas and, if given, value axis `axis`."""
    x = (
        stacked.astype(jnp.promote_types(stacked.dtype, jnp.float32))
        if op is ReduceOp.MEAN
        else stacked
    )
    valid = None
    if mask is not None:
        valid = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        valid = jnp.broadcast_to(valid, x.shape)
    if op in (ReduceOp.MAX, ReduceOp.MIN):
        # Padded rows take the value that can never win.
        limits = jnp.finfo(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype)
        fill = limits.min if op is ReduceOp.MAX else limits.max
        if valid is not None:
            x = jnp.where(valid, x, fill)
        axes = (0,) if axis is None else (0, axis + 1)
        return (jnp.max if op is ReduceOp.MAX else jnp.min)(x, axis=axes)
    if valid is not None:
        x = jnp.where(valid, x, jnp.zeros_like(x))
    axes = (0,) if axis is None else (0, axis + 1)
    total = jnp.sum(x, axis=axes)
    if op is ReduceOp.SUM:
        return total
    if valid is None:
        count = jnp.asarray(x.shape[0] * (1 if axis is None else x.shape[axis + 1]), x.dtype)
    else:
        count = jnp.sum(valid, axis=axes).astype(x.dtype)
    return _safe_div(total, count)


def _as_per_replica(strategy: StrategyLike, value: Any) -> PerReplica | None:
    if isinstance(value, PerReplica):
        return value
    mask = DISTRIBUTED.mask_of(value)
    if mask is None:
        return None
    replicas = strategy.num_replicas_in_sync
    stacked = value.reshape(replicas, value.shape[0] // replicas, *value.shape[1:])
    return PerReplica(stacked, mask.reshape(replicas, -1))


def reduce(strategy: StrategyLike, reduce_op: ReduceOp | str, value: Any, axis: int | None) -> Any:
    """See `Strategy.reduce`."""
    op = ReduceOp.parse(reduce_op)
    if axis is not None and not isinstance(axis, int):
        raise TypeError(f"axis must be None or an int, got {axis!r}")
    value = unmask(value)

    def one(leaf: Any) -> Any:
        per_replica = _as_per_replica(strategy, leaf)
        if per_replica is not None:
            stacked = per_replica.stacked
            local_axis = None if axis is None else axis % (stacked.ndim - 1)
            mask = per_replica.mask
            return _reduce_stacked(stacked, mask, op, local_axis)
        mirrored = MIRRORED.get(leaf) is not None
        return _reduce_mirrored(strategy, op, jnp.asarray(leaf), axis, mirrored)

    return jax.tree.map(one, value, is_leaf=lambda x: isinstance(x, PerReplica))


def _reduce_mirrored(
    strategy: StrategyLike, op: ReduceOp, value: jax.Array, axis: int | None, mirrored: bool
) -> Any:
    """A value that is not per-replica is the same on every replica.

    A mirrored result of `strategy.run` has one identical copy per replica, so SUM counts it
    num_replicas_in_sync times (tf.distribute's semantics). Any other plain array has no
    replica copies to sum: MEAN returns it and SUM is an error, as in tf.distribute.
    """
    replicas = strategy.num_replicas_in_sync
    if op is ReduceOp.SUM and replicas > 1 and not mirrored:
        raise ValueError(
            "strategy.reduce(SUM, ...) got a plain array that is neither a strategy.run result "
            f"nor a distributed batch (shape {value.shape}), so it has no per-replica parts to "
            "sum; reduce the PerReplica result of strategy.run or a distributed batch, or use "
            "ReduceOp.MEAN for a replicated value"
        )
    if axis is not None:
        if op is ReduceOp.MEAN:
            return jnp.mean(value.astype(jnp.promote_types(value.dtype, jnp.float32)), axis=axis)
        value = {ReduceOp.SUM: jnp.sum, ReduceOp.MAX: jnp.max, ReduceOp.MIN: jnp.min}[op](
            value, axis=axis
        )
    return value * replicas if op is ReduceOp.SUM else value
