"""`compute_average_loss` and `scale_regularization_loss`, with tf.nn's semantics."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from phalanx._src.strategy.replica_context import _CURRENT, current_example_mask


def compute_average_loss(
    per_example_loss: Any,
    sample_weight: Any = None,
    global_batch_size: int | jax.Array | None = None,
) -> jax.Array:
    """Sums `per_example_loss * sample_weight` and divides by the global batch size.

    tf.nn.compute_average_loss's semantics: inside `strategy.run`, each replica returns its
    share, so the SUM over replicas (which gradients of replicated parameters get) is the
    mean over the global batch. Padded rows of a partial batch never count: they are masked
    out, and the default denominator counts only real examples (tf.distribute would divide
    by local batch x replicas). Outside `strategy.run`, the loss is the global batch's and
    the denominator is its size.

    Args:
      per_example_loss: losses with a leading batch dimension (any trailing dimensions are
        summed, as tf does).
      sample_weight: optional weights broadcastable to `per_example_loss`.
      global_batch_size: the denominator. Default: the number of real examples in the global
        batch (local batch x num_replicas_in_sync when no row is padded). 0 gives a loss of 0.

    Returns:
      A float32 scalar.

    Raises:
      ValueError: for a scalar `per_example_loss`.

    Example:
      >>> phalanx.compute_average_loss(jnp.array([1., 2., 3., 4., 5.]), global_batch_size=10)
      Array(1.5, dtype=float32)
    """
    loss = jnp.asarray(per_example_loss)
    if loss.ndim == 0:
        raise ValueError(
            "compute_average_loss needs per-example losses with a batch dimension, but got a "
            "scalar; pass the unreduced losses (e.g. optax.softmax_cross_entropy(...) of shape "
            "(batch,)), not their mean"
        )
    loss = loss.astype(jnp.promote_types(loss.dtype, jnp.float32))
    if sample_weight is not None:
        loss = loss * jnp.asarray(sample_weight, loss.dtype)
    mask = current_example_mask(loss.shape[0])
    if mask is not None:
        loss = loss * mask.reshape((-1,) + (1,) * (loss.ndim - 1))
    if global_batch_size is None:
        global_batch_size = _default_global_batch(loss.shape[0], mask)
    denominator = jnp.asarray(global_batch_size, loss.dtype)
    total = jnp.sum(loss)
    return jnp.where(denominator == 0, 0.0, total / jnp.where(denominator == 0, 1, denominator))


def _default_global_batch(local_rows: int, mask: jax.Array | None) -> Any:
    context = _CURRENT.get()
    if context is None:
        return local_rows
    if mask is not None:
        return context.all_reduce("sum", jnp.sum(mask))
    return local_rows * context.num_replicas_in_sync


def scale_regularization_loss(regularization_loss: Any) -> jax.Array:
    """Divides a regularization loss by the replica count inside `strategy.run`.

    Every replica adds the same regularization term; summed over replicas it would count
    num_replicas_in_sync times, so each replica contributes its share (tf.nn's semantics).
    Outside `strategy.run` the loss is returned unchanged.

    Example:
      >>> phalanx.scale_regularization_loss(jnp.float32(0.8))   # outside run
      Array(0.8, dtype=float32)
    """
    loss = jnp.asarray(regularization_loss)
    context = _CURRENT.get()
    if context is None:
        return loss
    return loss / context.num_replicas_in_sync
