"""A Keras 3 optimizer as an `optax.GradientTransformation`, through `stateless_apply`.

The update is Keras's own code (`optimizer.apply` in a `StatelessScope`), so every Keras
optimizer, with its clipping, weight decay, EMA and schedules, gives Keras's numbers. The
state is a pytree of arrays (checkpointable, shardable): an `optax.InjectHyperparamsState`
whose `hyperparams['learning_rate']` is Keras's learning-rate variable (so
`phalanx.optimizers.learning_rate` / `set_learning_rate`, LearningRateScheduler and
ReduceLROnPlateau work) and whose `inner_state` is the tuple of Keras's other optimizer
variables (iteration count, moments...), in Keras's order.

The user's optimizer object is left untouched: a copy (`from_config`) is built on
placeholder variables shaped like the parameters. Because those placeholders do not carry
the model's variable names, `exclude_from_weight_decay(var_names=...)` does not apply.

An optimizer already built on variables of the parameters' shapes (restored from a
checkpoint, or trained before) starts from its current state: its slots, `iterations`
(which drives a learning-rate schedule) and learning rate, as Keras's `compile` keeps a
built optimizer's variables. A run restored from TensorFlow's checkpoint then continues.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def _keras() -> Any:
    import keras  # optional dependency: imported only for a Keras optimizer

    return keras


def _learning_rate_index(optimizer: Any) -> int | None:
    """Position of the learning-rate variable in `optimizer.variables`, or None (schedule)."""
    lr = getattr(optimizer, "_learning_rate", None)
    for index, variable in enumerate(optimizer.variables):
        if variable is lr:
            return index
    return None


def from_keras(optimizer: Any) -> optax.GradientTransformation:
    """`optimizer` (a `keras.optimizers.Optimizer`) as an optax transformation.

    Args:
      optimizer: any Keras 3 optimizer object, e.g. `keras.optimizers.Adam(1e-3)`.

    Returns:
      An `optax.GradientTransformation` whose `update(grads, state, params)` returns
      `new_params - params` for Keras's step (`params` is required).

    Raises:
      TypeError: `optimizer` is a Keras `LossScaleOptimizer` (use phalanx's
        `precision='mixed_float16'`, which scales the loss itself).

    Example:
      >>> tx = from_keras(keras.optimizers.Adam(learning_rate=1e-3))
      >>> state = tx.init(params)
      >>> updates, state = tx.update(grads, state, params)
    """
    keras = _keras()
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise TypeError(
            "a keras LossScaleOptimizer cannot be used by phalanx; pass its inner optimizer "
            "and compile with precision='mixed_float16', which scales the loss dynamically"
        )
    config = optimizer.get_config()
    built: dict[tuple, Any] = {}

    def keras_copy(params: Any) -> Any:
        leaves = jax.tree.leaves(params)
        key = tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in leaves)
        if key not in built:
            copy = type(optimizer).from_config(config)
            placeholders = [
                keras.Variable(initializer="zeros", shape=shape, dtype=dtype, name=f"param_{i}")
                for i, (shape, dtype) in enumerate(key)
            ]
            copy.build(placeholders)
            built[key] = copy
        return built[key]

    def init(params: Any) -> optax.InjectHyperparamsState:
        copy = keras_copy(params)
        values = [jnp.asarray(v.value) for v in _current(optimizer, copy)]
        index = _learning_rate_index(copy)
        hyper = {} if index is None else {"learning_rate": values.pop(index)}
        return optax.InjectHyperparamsState(
            count=jnp.zeros([], jnp.int32), hyperparams=hyper, inner_state=tuple(values)
        )

    def update(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        if params is None:
            raise ValueError(
                "a Keras optimizer needs the parameters in update(grads, state, params); "
                "pass params (phalanx's fit always does)"
            )
        copy = keras_copy(params)
        values = list(state.inner_state)
        index = _learning_rate_index(copy)
        if index is not None:
            lr = state.hyperparams["learning_rate"]
            values.insert(index, jnp.asarray(lr, copy.variables[index].dtype))
        param_leaves, treedef = jax.tree.flatten(params)
        new_params, new_values = copy.stateless_apply(values, jax.tree.leaves(grads), param_leaves)
        updates = [jnp.asarray(n) - p for n, p in zip(new_params, param_leaves, strict=True)]
        hyper = dict(state.hyperparams)
        if index is not None:
            hyper["learning_rate"] = new_values.pop(index)
        new_state = optax.InjectHyperparamsState(
            count=optax.safe_increment(state.count),
            hyperparams=hyper,
            inner_state=tuple(jnp.asarray(v) for v in new_values),
        )
        return jax.tree.unflatten(treedef, updates), new_state

    return optax.GradientTransformation(init, update)


def _current(optimizer: Any, copy: Any) -> list[Any]:
    """The variables to start from: the user's optimizer's, when it is built on variables
    of the copy's shapes and dtypes (so its state is this model's), else the fresh copy's."""
    if not optimizer.built:
        return list(copy.variables)
    mine = [(tuple(v.shape), str(v.dtype)) for v in optimizer.variables]
    fresh = [(tuple(v.shape), str(v.dtype)) for v in copy.variables]
    return list(optimizer.variables) if mine == fresh else list(copy.variables)
