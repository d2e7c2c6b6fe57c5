"""Gradient accumulation that equals one step on a k-times larger batch.

The step differentiates the batch's mean loss (Keras's scale, which keeps float16 loss
scaling in range) and passes the number of real examples as `example_count`. This wrapper
adds `mean gradient x count` and the counts of k consecutive batches and divides once, so
the update is the gradient of the mean over all k batches' examples, not a mean of k batch
means (which `optax.MultiSteps` computes, and which differs as soon as batches differ in
size, e.g. a partial last batch). With k = 1 the gradient goes straight to the optimizer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax


class AccumulationState(NamedTuple):
    """State of `accumulate_gradients`.

    Attributes:
      mini_step: int32, batches accumulated since the last update (0 .. k-1).
      grad_sum: the summed gradients of those batches (an empty tuple when k = 1).
      count: float32, the real examples in those batches.
      inner_state: the wrapped optimizer's state.
    """

    mini_step: jax.Array
    grad_sum: Any
    count: jax.Array
    inner_state: optax.OptState


def accumulate_gradients(
    inner: optax.GradientTransformation, every_k: int = 1
) -> optax.GradientTransformationExtraArgs:
    """Applies `inner` every `every_k` batches on the example-weighted mean gradient.

    `update(grads, state, params, example_count=n)` takes the gradient of a batch's mean loss
    and the number of examples it covers. On the k-th call it applies `inner` to
    `sum(grads_i * n_i) / sum(n_i)`; on the others it returns zero updates.

    Args:
      inner: the optimizer.
      every_k: batches per update, >= 1.

    Returns:
      An `optax.GradientTransformationExtraArgs` with `AccumulationState`.

    Raises:
      ValueError: for `every_k` < 1.

    Example:
      >>> tx = accumulate_gradients(optax.sgd(0.1), every_k=4)
      >>> grads = jax.grad(lambda p: jnp.mean(per_example_loss(p, x, y)))(params)
      >>> updates, state = tx.update(grads, state, params, example_count=x.shape[0])
    """
    if not isinstance(every_k, int) or every_k < 1:
        raise ValueError(
            f"gradient_accumulation_steps must be a positive int, got {every_k!r}; use 1 to "
            "update after every batch"
        )
    inner = optax.with_extra_args_support(inner)

    def init(params: optax.Params) -> AccumulationState:
        grad_sum = jax.tree.map(jnp.zeros_like, params) if every_k > 1 else ()
        return AccumulationState(
            jnp.zeros([], jnp.int32), grad_sum, jnp.zeros([], jnp.float32), inner.init(params)
        )

    def update(grads, state, params=None, *, example_count, **extra_args):
        if every_k == 1:
            updates, inner_state = inner.update(grads, state.inner_state, params, **extra_args)
            return updates, state._replace(inner_state=inner_state)
        n = jnp.asarray(example_count, jnp.float32)
        count = state.count + n
        total = jax.tree.map(lambda s, g: s + g * n.astype(g.dtype), state.grad_sum, grads)
        ready = state.mini_step == every_k - 1

        def apply(_):
            mean = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0).astype(g.dtype), total)
            updates, inner_state = inner.update(mean, state.inner_state, params, **extra_args)
            return updates, AccumulationState(
                jnp.zeros([], jnp.int32),
                jax.tree.map(jnp.zeros_like, total),
                jnp.zeros([], jnp.float32),
                inner_state,
            )

        def hold(_):
            zeros = jax.tree.map(jnp.zeros_like, grads)
            return zeros, AccumulationState(state.mini_step + 1, total, count, state.inner_state)

        return lax.cond(ready, apply, hold, None)

    return optax.GradientTransformationExtraArgs(init, update)
