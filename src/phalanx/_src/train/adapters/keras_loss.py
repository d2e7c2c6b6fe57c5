"""A subclassed Keras model's own `compute_loss`, run on phalanx's padded global batches.

Keras's `fit` calls `model.compute_loss(x, y, y_pred, sample_weight, training=...)` inside a
`StatelessScope` that maps every model variable to the step's values, with the losses of the
forward pass (`add_loss`, regularizers) in `model.losses`; so does phalanx, under the
strategy's data-parallel jit, so the result is the loss of the global batch on any number
of replicas.

A padded batch (the last, partial one) must not count its padding rows, but
`compute_loss` returns one scalar for the whole batch. On a batch whose rows are all real it
is called once, on the batch, exactly as Keras calls it. On a batch with padding it is
called on each row as a batch of one (`jax.vmap`) and the real rows' values are averaged:
that equals Keras's loss of the real rows whenever the loss is a mean over examples plus
terms that do not depend on the batch (every loss Keras builds from `compile(loss=...)`,
`sum_over_batch_size` reductions, regularizers, the knowledge-distillation `Distiller`). A
loss that couples the examples of a batch (contrastive losses over the batch) differs from
Keras's on that one partial batch; drop it (`drop_remainder=True`) to train on full batches
only.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def _keras() -> Any:
    import keras  # optional dependency: imported only for a Keras model

    return keras


def overridden(net: Any, method: str) -> bool:
    """Whether `net`'s class overrides Keras's `keras.Model.<method>`."""
    return getattr(type(net), method, None) is not getattr(_keras().Model, method, None)


def _call(net: Any, params: Any, state: Any, losses: list, x, y, y_pred, sw, training: bool):
    """`net.compute_loss` once, on the given batch, in a stateless scope: `(loss, state)`."""
    keras = _keras()
    mapping = list(zip(net.trainable_variables, params, strict=True))
    mapping += list(zip(net.non_trainable_variables, state, strict=True))
    kwargs = {}
    if "training" in inspect.signature(net.compute_loss).parameters:
        kwargs["training"] = training
    # What Keras's trainer does: the forward pass's losses are `net.losses` in compute_loss.
    net._losses_override = list(losses)
    try:
        with keras.StatelessScope(state_mapping=mapping) as scope:
            loss = net.compute_loss(x, y, y_pred, sw, **kwargs)
        new_state = [scope.get_current_value(v) for v in net.non_trainable_variables]
    finally:
        net._losses_override = []
    if loss is None:
        raise ValueError(
            f"{type(net).__name__}.compute_loss returned None; return the total loss as a "
            "scalar (or compile(loss=...) and call super().compute_loss)"
        )
    return jnp.asarray(loss, jnp.float32).reshape(()), new_state


def per_example(
    net: Any,
    params: Any,
    state: Any,
    losses: list,
    batch: tuple[Any, Any, Any],
    y_pred: Any,
    mask: jax.Array | None,
    training: bool,
) -> tuple[jax.Array, Any]:
    """`compute_loss` as per-row values whose mean over the real rows is the model's loss
    of those rows, and the state it leaves; see the module docstring."""
    x, y, sw = batch
    rows = jax.tree.leaves(y_pred)[0].shape[0]

    def whole(_: Any) -> tuple[jax.Array, Any]:
        loss, new_state = _call(net, params, state, losses, x, y, y_pred, sw, training)
        return jnp.broadcast_to(loss, (rows,)), new_state

    if mask is None:
        return whole(None)

    def each(_: Any) -> tuple[jax.Array, Any]:
        def one(xi: Any, yi: Any, pi: Any, wi: Any) -> jax.Array:
            one_row = jax.tree.map(lambda a: a[None], (xi, yi, pi, wi))
            return _call(net, params, state, losses, *one_row, training)[0]

        return jax.vmap(one)(x, y, y_pred, sw), list(state)

    return lax.cond(jnp.all(mask > 0), whole, each, None)


def compile_model(net: Any, arguments: dict[str, Any], custom: dict[str, Any]) -> None:
    """Hands `compile`'s arguments to the Keras model where its own code needs them.

    - A class that overrides `compile` (the `Distiller`'s `compile(optimizer, metrics,
      student_loss_fn, alpha, temperature, ...)`) gets its own call: the standard arguments
      its signature takes, and every custom one, so the attributes its `compute_loss`
      reads are set.
    - A class that overrides only `compute_loss`, compiled with a loss, gets Keras's
      `compile(loss=...)`, so `super().compute_loss(...)` finds the compiled loss.

    Raises:
      TypeError: custom arguments for a model whose class does not override `compile`.
    """
    if overridden(net, "compile"):
        parameters = inspect.signature(net.compile).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        given = {
            name: value
            for name, value in arguments.items()
            if value is not None and (takes_any or name in parameters)
        }
        net.compile(**given, **custom)
        return
    if custom:
        raise TypeError(
            f"compile() got unexpected keyword arguments {sorted(custom)}; custom compile "
            f"arguments go to a subclassed keras.Model that overrides compile(), and "
            f"{type(net).__name__} does not"
        )
    if overridden(net, "compute_loss") and arguments.get("loss") is not None:
        keras = _keras()
        optimizer = arguments.get("optimizer")
        is_keras = isinstance(optimizer, str | keras.optimizers.Optimizer)
        keras.Model.compile(
            net,
            optimizer=optimizer if is_keras else "rmsprop",
            loss=arguments["loss"],
            loss_weights=arguments.get("loss_weights"),
        )
