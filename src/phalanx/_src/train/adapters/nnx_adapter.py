"""Flax NNX modules under the model protocol: stateful layers, modes and precision.

- **State.** `params` are the module's `nnx.Param`s; `state` is every other variable
  (`nnx.BatchStat`, the `nnx.Rngs` keys and counters, user counters and caches). Each step
  merges them into a fresh copy of the module (`nnx.merge(..., copy=True)`), so layers that
  write state (BatchNorm, Dropout's RNG counter) work inside `jax.grad` and `lax.scan`, and
  returns the updated `state`.
- **Modes.** Two structures are fixed once: training (`deterministic=False`,
  `use_running_average=False` on every layer that has them, as `module.train()` sets) and
  inference (`True`, as `module.eval()`). The user's module is never switched.
- **Batch statistics.** Under the data-parallel jit a BatchNorm sees the global batch, so its
  statistics are those of the global batch whatever the replica count. The padded rows of a
  partial batch are excluded: in training mode every BatchNorm whose input is batch-major
  receives the batch's validity mask (flax's `mask=`), giving a mask-weighted mean and
  variance.
- **Randomness.** Dropout and every layer that draws from `nnx.Rngs` use the streams held in
  `state`: the counter advances every step, so masks are new every step, reproducible from
  the seed, and part of every checkpoint. Random bits do not depend on how the batch is
  sharded (`jax_threefry_partitionable`), so N replicas draw the masks one device draws.
- **Precision.** Under a mixed policy every layer with a compute dtype (`Linear`, `Einsum`,
  `Embed`, `Conv`, attention, normalisation...) computes in the policy's compute dtype,
  including layers whose `dtype` defaults to float32 (`nnx.Embed`). A layer built with an
  explicit half-precision or float64 `dtype` keeps it. Normalisation statistics stay float32
  (flax computes them in at least float32); parameters are cast for the forward pass only.
- **Extra losses.** `compile(extra_losses=fn)` adds `fn(module)` (a scalar or a list of
  scalars, e.g. an L2 penalty on the weights) to the loss once per global batch, as Keras
  adds its regularizers; `fn` sees the module holding the step's float32 parameters.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from phalanx._src.strategy import missing_keys

# The batch mask of the step being traced, read by the BatchNorms of the merged module.
_BATCH_MASK: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar(
    "phalanx_batch_mask", default=None
)
_MASKED_CLASSES: dict[type, type] = {}


@contextlib.contextmanager
def _batch_mask(mask: jax.Array | None) -> Iterator[None]:
    token = _BATCH_MASK.set(mask)
    try:
        yield
    finally:
        _BATCH_MASK.reset(token)


def _masked_class(cls: type) -> type:
    """`cls` (a BatchNorm class) whose call passes the step's batch mask to flax."""
    masked = _MASKED_CLASSES.get(cls)
    if masked is None:

        def __call__(self, x, use_running_average=None, *, mask=None):
            batch_mask = _BATCH_MASK.get()
            if mask is None and batch_mask is not None and x.shape[:1] == batch_mask.shape:
                mask = (batch_mask > 0).reshape((-1,) + (1,) * (x.ndim - 1))
            return cls.__call__(self, x, use_running_average, mask=mask)

        masked = type(cls)(cls.__name__, (cls,), {"__call__": __call__})
        _MASKED_CLASSES[cls] = masked
    return masked


def _has_compute_dtype(path: Any, node: Any) -> bool:
    return isinstance(node, nnx.Module) and hasattr(node, "dtype") and hasattr(node, "param_dtype")


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _host_view(x: Any) -> Any:
    """A variable as NumPy sees it: RNG keys as their raw key data (uint32)."""
    return jax.random.key_data(x) if _is_key(x) else x


def _like(weight: Any, old: Any) -> Any:
    """`weight` (from `get_weights`) in the dtype of the variable it replaces."""
    if _is_key(old):
        return jax.random.wrap_key_data(np.asarray(weight), impl=jax.random.key_impl(old))
    return np.asarray(weight, dtype=np.asarray(old).dtype)


class NNXAdapter:
    """A Flax NNX module as pure functions of `(params, state)`; see the module docstring.

    Example:
      >>> adapter = NNXAdapter(MLP(rngs=nnx.Rngs(0)))
      >>> adapter.set_policy(phalanx.mixed_precision.Policy("float32"))
      >>> params, state = adapter.variables()
      >>> y, state = adapter.apply(params, state, x, training=True, mask=jnp.ones(len(x)))
    """

    resolves_keras_names = False

    def __init__(self, model: Any) -> None:
        if not self.accepts(model):
            raise TypeError(f"NNXAdapter wraps an nnx.Module, got {type(model).__name__}")
        self.model = model
        self._policy: Any = None
        self._graphdefs: dict[bool, Any] = {}
        self._extra_losses: Any = None

    overrides_loss = False

    @classmethod
    def accepts(cls, model: Any) -> bool:
        return isinstance(model, nnx.Module)

    def set_policy(self, policy: Any) -> None:
        self._policy = policy
        for training in (True, False):
            view = nnx.with_attributes(
                self.model,
                raise_if_not_found=False,
                deterministic=not training,
                use_running_average=not training,
            )
            if policy.compute_dtype != jnp.float32:
                view = self._with_compute_dtype(view, policy.compute_dtype)
            self._graphdefs[training] = nnx.graphdef(view)

    @staticmethod
    def _with_compute_dtype(view: Any, dtype: Any) -> Any:
        def follows_policy(path: Any, node: Any) -> bool:
            if not _has_compute_dtype(path, node):
                return False
            return node.dtype is None or jnp.dtype(node.dtype) == jnp.float32

        return nnx.with_attributes(view, only=follows_policy, raise_if_not_found=False, dtype=dtype)

    def variables(self) -> tuple[Any, Any]:
        _, params, state = nnx.split(self.model, nnx.Param, ...)
        return params, state

    def set_extra_losses(self, fn: Any) -> None:
        if fn is not None and not callable(fn):
            raise TypeError(
                f"extra_losses must be a function module -> scalar (or list of scalars), got "
                f"{fn!r}; e.g. extra_losses=lambda m: 1e-4 * jnp.sum(m.linear.kernel[...] ** 2)"
            )
        self._extra_losses = fn

    def compile_arguments(self, arguments: dict[str, Any], custom: dict[str, Any]) -> None:
        if custom:
            raise TypeError(
                f"compile() got unexpected keyword arguments {sorted(custom)}; an NNX module "
                "takes compile's own arguments only (extra loss terms: extra_losses=fn)"
            )

    def current_losses(self, params: Any, state: Any) -> list[jax.Array]:
        if self._extra_losses is None:
            return []
        module = nnx.merge(nnx.graphdef(self.model), params, state, copy=True)
        found = self._extra_losses(module)
        terms = list(found) if isinstance(found, list | tuple) else [found]
        for term in terms:
            if jnp.size(term) != 1:
                raise ValueError(
                    f"extra_losses returned a term of shape {jnp.shape(term)}; return scalars "
                    "(e.g. jnp.sum(w ** 2)), one per term"
                )
        return [jnp.asarray(t, jnp.float32).reshape(()) for t in terms]

    def apply_with_losses(
        self, params: Any, state: Any, inputs: Any, *, training: bool, mask: jax.Array
    ) -> tuple[Any, Any, list[jax.Array]]:
        outputs, new_state = self.apply(params, state, inputs, training=training, mask=mask)
        return outputs, new_state, self.current_losses(params, state)

    def apply(
        self, params: Any, state: Any, inputs: Any, *, training: bool, mask: jax.Array
    ) -> tuple[Any, Any]:
        if self._policy is None:
            raise RuntimeError("NNXAdapter.apply before set_policy; call model.compile() first")
        policy = self._policy
        module = nnx.merge(
            self._graphdefs[training], policy.cast_to_compute(params), state, copy=True
        )
        reading = missing_keys.naming_keys(inputs, f"the model ({type(self.model).__name__})")
        if not training:
            with reading:
                return module(policy.cast_to_compute(inputs)), state
        for _, sub in nnx.iter_modules(module):
            if isinstance(sub, nnx.BatchNorm):
                sub.__class__ = _masked_class(type(sub))
        with _batch_mask(mask), reading:
            outputs = module(policy.cast_to_compute(inputs))
        return outputs, nnx.state(module, nnx.Not(nnx.Param))

    def assign(self, params: Any, state: Any) -> None:
        nnx.update(self.model, params, state)

    def get_weights(self, params: Any, state: Any) -> list[np.ndarray]:
        self.assign(params, state)
        return [np.array(_host_view(x)) for x in jax.tree.leaves(nnx.state(self.model))]

    def set_weights(self, weights: Sequence[Any]) -> tuple[Any, Any]:
        current = nnx.state(self.model)
        leaves, treedef = jax.tree.flatten(current)
        if len(weights) != len(leaves):
            raise ValueError(
                f"set_weights got {len(weights)} arrays but the model has {len(leaves)} "
                "variables; pass the list model.get_weights() returned"
            )
        for index, (old, new) in enumerate(zip(leaves, weights, strict=True)):
            if np.shape(_host_view(old)) != np.shape(new):
                raise ValueError(
                    f"set_weights: weight {index} has shape {np.shape(new)} where the model has "
                    f"{np.shape(old)}; pass the list model.get_weights() returned"
                )
        new_state = jax.tree.unflatten(
            treedef, [_like(w, o) for w, o in zip(weights, leaves, strict=True)]
        )
        nnx.update(self.model, new_state)
        return self.variables()
