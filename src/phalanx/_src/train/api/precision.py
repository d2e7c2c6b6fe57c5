"""Mixed precision: dtype policies and Keras's dynamic loss scaling as an optax wrapper.

Policies (Keras's names):

| policy | parameters | forward compute | loss | loss scaling |
| --- | --- | --- | --- | --- |
| 'float32' | float32 | float32 | float32 | no |
| 'mixed_bfloat16' | float32 | bfloat16 | float32 | no (bf16 has float32's range) |
| 'mixed_float16' | float32 | float16 | float32 | dynamic (float16 underflows) |

The step casts the float parameters and inputs to `compute_dtype` for the forward pass
(`policy.cast_to_compute`), computes the loss in float32 (phalanx losses always return
float32), and differentiates with respect to the float32 parameters, so gradients and the
optimizer update stay float32.

Loss scaling (`loss_scale_optimizer`) behaves exactly as Keras's `LossScaleOptimizer`: the
loss is multiplied by the current scale before differentiation (`scale_loss`); the wrapper
divides the gradients by that scale, and if any gradient is inf/NaN it skips the update
(zero updates, inner optimizer state unchanged), halves the scale and resets the counter;
otherwise it applies the inner update and doubles the scale after `dynamic_growth_steps`
consecutive finite steps. Because data-parallel gradients are all-reduced before the update,
every replica makes the same skip decision.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

_POLICIES: dict[str, tuple[Any, Any]] = {
    # name: (compute dtype, parameter dtype)
    "float32": (jnp.float32, jnp.float32),
    "mixed_bfloat16": (jnp.bfloat16, jnp.float32),
    "mixed_float16": (jnp.float16, jnp.float32),
}


def _cast_floats(tree: Any, dtype: Any) -> Any:
    def cast(x: Any) -> Any:
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return jnp.asarray(x).astype(dtype)
        return x

    return jax.tree.map(cast, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """A dtype policy: which dtype parameters are stored in and which the forward pass uses.

    Args:
      name: 'float32', 'mixed_bfloat16' (TPU/GPU: bfloat16 compute, no loss scaling) or
        'mixed_float16' (GPU: float16 compute with dynamic loss scaling).

    Raises:
      ValueError: for any other name.

    Example:
      >>> policy = Policy("mixed_bfloat16")
      >>> policy.compute_dtype, policy.param_dtype
      (dtype(bfloat16), dtype('float32'))
      >>> logits = model_apply(policy.cast_to_compute(params), policy.cast_to_compute(x))
    """

    name: str = "float32"

    def __post_init__(self) -> None:
        if self.name not in _POLICIES:
            raise ValueError(
                f"unknown dtype policy {self.name!r}; legal names are {sorted(_POLICIES)}, e.g. "
                "Policy('mixed_bfloat16') on TPU or Policy('mixed_float16') on GPU"
            )

    @property
    def compute_dtype(self) -> jnp.dtype:
        """The dtype of the forward pass (activations, and parameters as used)."""
        return jnp.dtype(_POLICIES[self.name][0])

    @property
    def param_dtype(self) -> jnp.dtype:
        """The dtype parameters, gradients and optimizer state are stored in."""
        return jnp.dtype(_POLICIES[self.name][1])

    @property
    def variable_dtype(self) -> jnp.dtype:
        """Keras's name for `param_dtype`."""
        return self.param_dtype

    @property
    def loss_scaling(self) -> bool:
        """True when this policy needs dynamic loss scaling (mixed_float16)."""
        return self.compute_dtype == jnp.float16

    def cast_to_compute(self, tree: Any) -> Any:
        """Casts the floating-point leaves of `tree` to `compute_dtype`; others are untouched.

        Differentiable: gradients flow back to the original float32 leaves as float32.
        """
        return _cast_floats(tree, self.compute_dtype)

    def cast_to_param(self, tree: Any) -> Any:
        """Casts the floating-point leaves of `tree` to `param_dtype`."""
        return _cast_floats(tree, self.param_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        """Casts floating-point leaves to float32, for losses and metrics."""
        return _cast_floats(tree, jnp.float32)

    def wrap_optimizer(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
        """`loss_scale_optimizer(tx)` when the policy needs loss scaling, else `tx`."""
        return loss_scale_optimizer(tx) if self.loss_scaling else tx


class _GlobalPolicy:
    """The process-wide default policy (Keras's `set_global_policy`)."""

    def __init__(self) -> None:
        self.policy = Policy("float32")


_GLOBAL = _GlobalPolicy()


def get(policy: str | Policy | None) -> Policy:
    """A `Policy` from a name, a `Policy`, or None (the global policy).

    Example:
      >>> get("mixed_bfloat16").compute_dtype
      dtype(bfloat16)
    """
    if policy is None:
        return _GLOBAL.policy
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return Policy(policy)
    raise TypeError(
        f"a dtype policy must be a name or a Policy, got {policy!r} of type "
        f"{type(policy).__name__}; e.g. 'mixed_bfloat16'"
    )


def set_global_policy(policy: str | Policy) -> None:
    """Sets the default policy for models built afterwards (Keras's `set_global_policy`).

    Example:
      >>> set_global_policy("mixed_bfloat16")
    """
    _GLOBAL.policy = get(policy)


def global_policy() -> Policy:
    """The default policy ('float32' unless `set_global_policy` changed it)."""
    return _GLOBAL.policy


# ---------------------------------------------------------------------------------------------
# Dynamic loss scaling.


class LossScaleState(NamedTuple):
    """State of `loss_scale_optimizer`.

    Attributes:
      loss_scale: float32 scalar, the factor the loss is multiplied by this step.
      good_steps: int32 scalar, consecutive finite steps since the scale last changed
        (Keras's `step_counter`).
      inner_state: the wrapped optimizer's state (unchanged by a skipped step).
    """

    loss_scale: jax.Array
    good_steps: jax.Array
    inner_state: optax.OptState


def all_finite(tree: Any) -> jax.Array:
    """A boolean scalar: True when no leaf of `tree` holds inf or NaN."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def unscale_grads(grads: Any, loss_scale: jax.Array | float) -> Any:
    """Divides every gradient by `loss_scale` (keeping each gradient's dtype)."""
    return jax.tree.map(lambda g: (g / loss_scale).astype(g.dtype), grads)


def _is_loss_scale_state(x: Any) -> bool:
    return isinstance(x, LossScaleState)


def current_loss_scale(opt_state: Any) -> jax.Array | None:
    """The loss scale stored in `opt_state` (nested anywhere), or None without loss scaling."""
    for leaf in jax.tree.leaves(opt_state, is_leaf=_is_loss_scale_state):
        if _is_loss_scale_state(leaf):
            scale = leaf.loss_scale
            return scale.get_value() if hasattr(scale, "get_value") else scale
    return None


def scale_loss(loss: jax.Array, opt_state: Any) -> jax.Array:
    """`loss * loss_scale` when `opt_state` holds a `LossScaleState`, else `loss` unchanged.

    Call it on the loss you differentiate, so one step function serves every policy.

    Example:
      >>> def loss_fn(params):
      ...     loss = compute_loss(params)
      ...     return scale_loss(loss, opt_state), loss
    """
    scale = current_loss_scale(opt_state)
    return loss if scale is None else loss * scale.astype(loss.dtype)


def loss_scale_optimizer(
    inner: optax.GradientTransformation,
    initial_scale: float = 2.0**15,
    dynamic_growth_steps: int = 2000,
) -> optax.GradientTransformationExtraArgs:
    """Wraps `inner` with Keras's dynamic loss scaling.

    `update` receives gradients of the *scaled* loss (see `scale_loss`), divides them by the
    current scale and:

    * all finite: applies `inner`; after `dynamic_growth_steps` consecutive finite steps the
      scale doubles and the counter restarts;
    * any inf/NaN: returns zero updates, leaves `inner`'s state untouched (so its step count
      does not advance), halves the scale and restarts the counter.

    `optax.apply_if_finite` skips non-finite steps but has no scale; flax's `DynamicScale`
    wraps the gradient computation rather than the optimizer; neither has Keras's exact rule,
    hence this wrapper.

    Args:
      inner: the optimizer to wrap.
      initial_scale: the first loss scale (Keras: 2**15).
      dynamic_growth_steps: finite steps between doublings (Keras: 2000).

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is a `LossScaleState`.

    Raises:
      ValueError: for a non-positive scale or growth period.

    Example:
      >>> tx = loss_scale_optimizer(phalanx.optimizers.get("adam"))
      >>> state = tx.init(params)
      >>> grads = jax.grad(lambda p: scale_loss(loss_fn(p), state))(params)
      >>> updates, state = tx.update(grads, state, params)
    """
    if not initial_scale > 0:
        raise ValueError(f"initial_scale must be > 0, got {initial_scale!r}; Keras uses 2**15")
    if not isinstance(dynamic_growth_steps, int) or dynamic_growth_steps < 1:
        raise ValueError(
            f"dynamic_growth_steps must be a positive int, got {dynamic_growth_steps!r}; "
            "Keras uses 2000"
        )
    inner = optax.with_extra_args_support(inner)

    def init(params: optax.Params) -> LossScaleState:
        return LossScaleState(
            loss_scale=jnp.asarray(initial_scale, jnp.float32),
            good_steps=jnp.zeros([], jnp.int32),
            inner_state=inner.init(params),
        )

    def update(updates, state, params=None, **extra_args):
        finite = all_finite(updates)
        grads = unscale_grads(updates, state.loss_scale)
        new_updates, new_inner = inner.update(grads, state.inner_state, params, **extra_args)
        new_updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)
        new_inner = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old), new_inner, state.inner_state
        )
        grow = finite & (state.good_steps >= dynamic_growth_steps - 1)
        scale = state.loss_scale
        new_scale = jnp.where(finite, jnp.where(grow, scale * 2.0, scale), scale / 2.0)
        good_steps = jnp.where(finite & ~grow, state.good_steps + 1, 0).astype(jnp.int32)
        return new_updates, LossScaleState(new_scale, good_steps, new_inner)

    return optax.GradientTransformationExtraArgs(init, update)
