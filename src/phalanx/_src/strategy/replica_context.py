"""The replica context: what a function running under `strategy.run` knows and can do."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax import lax

from phalanx._src.strategy import state
from phalanx._src.strategy.reduce_op import ReduceOp

if TYPE_CHECKING:
    from phalanx._src.strategy.base import StrategyLike

_CURRENT: contextvars.ContextVar[ReplicaContext | None] = contextvars.ContextVar(
    "phalanx_replica_context", default=None
)


class ReplicaContext:
    """Handle to the replica that is running: its id, the replica count, and collectives.

    Inside `strategy.run(fn)`, `phalanx.get_replica_context()` returns one. Every collective
    (`all_reduce`, `all_gather`) must be called by all replicas with matching shapes, which is
    automatic since every replica runs the same traced `fn`.

    Example:
      >>> def step(x):
      ...     ctx = phalanx.get_replica_context()
      ...     return ctx.all_reduce("sum", x.sum())
      >>> strategy.run(step, args=(batch,))
    """

    def __init__(
        self, strategy: StrategyLike, axis_name: str | None, mask: jax.Array | None = None
    ) -> None:
        self._strategy = strategy
        self._axis_name = axis_name
        self._mask = mask
        self._active = True
        self.mask_read = False  # whether the step consulted the mask (padding.py)

    @property
    def strategy(self) -> StrategyLike:
        return self._strategy

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run `fn` in lockstep."""
        return self._strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> jax.Array:
        """This replica's index, 0 .. num_replicas_in_sync - 1 (a traced int32)."""
        self._check_active("replica_id_in_sync_group")
        if self._axis_name is None:
            return jnp.int32(0)
        return lax.axis_index(self._axis_name)

    @property
    def mask(self) -> jax.Array | None:
        """This replica's validity mask for the batch rows (True = real example), or None."""
        self.mask_read = True
        return self._mask

    def all_reduce(self, reduce_op: ReduceOp | str, value: Any) -> Any:
        """Combines `value` (any pytree) across replicas; every replica gets the result.

        All replicas must call it with matching shapes. A value that is the same on every
        replica is counted once per replica by SUM, as in tf.distribute.

        Args:
          reduce_op: `ReduceOp` or one of "sum", "mean", "max", "min".
          value: a pytree of arrays.

        Returns:
          The reduced pytree, identical on every replica.
        """
        op = ReduceOp.parse(reduce_op)
        self._check_active("all_reduce")
        if self._axis_name is None:
            return value
        collective = {
            ReduceOp.SUM: lax.psum,
            ReduceOp.MEAN: lax.pmean,
            ReduceOp.MAX: lax.pmax,
            ReduceOp.MIN: lax.pmin,
        }[op]
        return jax.tree.map(lambda v: collective(jnp.asarray(v), self._axis_name), value)

    def all_gather(self, value: Any, axis: int = 0) -> Any:
        """Concatenates every replica's `value` along `axis`, in replica order.

        All replicas must call it with matching shapes. Padded rows of a partial batch are
        included (read `mask` to drop them).
        """
        self._check_active("all_gather")
        if self._axis_name is None:
            return value
        return jax.tree.map(
            lambda v: lax.all_gather(jnp.asarray(v), self._axis_name, axis=axis, tiled=True),
            value,
        )

    def _check_active(self, what: str) -> None:
        if not self._active:
            raise RuntimeError(
                f"ReplicaContext.{what} was called after its strategy.run finished; call "
                "phalanx.get_replica_context() inside the function you pass to strategy.run"
            )

    def __repr__(self) -> str:
        return f"ReplicaContext(num_replicas_in_sync={self.num_replicas_in_sync})"


@contextlib.contextmanager
def replica_scope(context: ReplicaContext) -> Iterator[ReplicaContext]:
    """Makes `context` current while a replica function is traced."""
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        context._active = False
        _CURRENT.reset(token)


def get_replica_context() -> ReplicaContext | None:
    """The current replica context, as `tf.distribute.get_replica_context()` returns it.

    Inside `strategy.run`: that replica's context. Outside any strategy scope: a default
    one-replica context (collectives are identities). Inside `strategy.scope()` but outside
    `run` (cross-replica context): None.

    Example:
      >>> phalanx.get_replica_context().num_replicas_in_sync   # outside any scope
      1
    """
    current = _CURRENT.get()
    if current is not None:
        return current
    if state.STACK.current() is not None:
        return None
    return ReplicaContext(state.default_strategy(), axis_name=None)


def in_replica_fn() -> bool:
    """True while a function passed to `strategy.run` is being traced."""
    return _CURRENT.get() is not None


def current_example_mask(batch_size: int) -> jax.Array | None:
    """This replica's float32 validity mask when `batch_size` is its batch's row count.

    Losses and metrics call this to leave padded rows out by themselves. Returns None outside
    `strategy.run`, when the batch carried no mask, or when `batch_size` is not the number of
    rows each replica received (the value is then not per-example).
    """
    current = _CURRENT.get()
    if current is None or current.mask is None or current.mask.shape[0] != batch_size:
        return None
    return current.mask.astype(jnp.float32)
