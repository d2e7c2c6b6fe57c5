"""Optimizers by Keras name, with Keras's defaults and update rules, as optax transformations.

`get('adam')` returns an `optax.GradientTransformation` whose update equals Keras 3's
`keras.optimizers.Adam()` step for step. Where optax's built-in differs from Keras, the Keras
rule is used:

* adam / adamw: Keras puts epsilon outside the *uncorrected* root,
  `lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`; `optax.adam` adds eps to the
  bias-corrected root. Same for large gradients, different for gradients near eps.
* sgd: Keras folds the learning rate into the momentum buffer (`m = momentum * m - lr * g`),
  which differs from `optax.sgd` once the learning rate changes during training.
* rmsprop: `optax.rmsprop(eps_in_sqrt=True)` already matches Keras (`g / sqrt(v + eps)`).
* weight_decay (any optimizer): Keras's decoupled decay, `w -= lr * weight_decay * w`.

Clipping (`clipnorm` per tensor, `global_clipnorm`, `clipvalue`) runs first, on the raw
gradients; Keras accepts only one of the three, and so does `get`.

The learning rate lives in the optimizer state so it can be read and changed at run time
(LearningRateScheduler): every named optimizer is built with `optax.inject_hyperparams`, and
`learning_rate(opt_state)` / `set_learning_rate(opt_state, value)` find it wherever the state
is nested (inside a loss-scale wrapper, `optax.MultiSteps`, an `nnx.Optimizer`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

ScalarOrSchedule = float | optax.Schedule


# ---------------------------------------------------------------------------------------------
# Transformations optax lacks in Keras's form.


class ScaleByKerasAdamState(NamedTuple):
    """State of `scale_by_keras_adam`: step count and the two moment estimates."""

    count: jax.Array  # int32 scalar: steps taken
    mu: optax.Updates  # first moment, m
    nu: optax.Updates  # second moment, v
    nu_max: optax.Updates  # running max of v (amsgrad), else an empty tuple


def scale_by_keras_adam(
    beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7, amsgrad: bool = False
) -> optax.GradientTransformation:
    """Adam's direction as Keras computes it (no learning rate, no sign flip).

    `sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)`, with `v` replaced by its
    running maximum when `amsgrad`. Chain `optax.scale_by_learning_rate(lr)` after it.

    Args:
      beta_1: decay of the first moment.
      beta_2: decay of the second moment.
      epsilon: added to `sqrt(v)` (the uncorrected root, as in Keras and the Adam paper's
        "epsilon hat").
      amsgrad: use the running maximum of `v`.

    Returns:
      An `optax.GradientTransformation` with `ScaleByKerasAdamState`.

    Example:
      >>> tx = optax.chain(scale_by_keras_adam(), optax.scale_by_learning_rate(1e-3))
    """

    def init(params: optax.Params) -> ScaleByKerasAdamState:
        zeros = optax.tree.zeros_like(params)
        return ScaleByKerasAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros,
            nu=optax.tree.zeros_like(params),
            nu_max=optax.tree.zeros_like(params) if amsgrad else (),
        )

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        mu = optax.tree.update_moment(updates, state.mu, beta_1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, beta_2, 2)
        nu_max = jax.tree.map(jnp.maximum, state.nu_max, nu) if amsgrad else ()
        t = count.astype(jnp.float32)
        alpha = jnp.sqrt(1.0 - jnp.asarray(beta_2, jnp.float32) ** t) / (
            1.0 - jnp.asarray(beta_1, jnp.float32) ** t
        )
        denom_source = nu_max if amsgrad else nu
        new_updates = jax.tree.map(
            lambda m, v: (alpha * m / (jnp.sqrt(v) + epsilon)).astype(m.dtype), mu, denom_source
        )
        return new_updates, ScaleByKerasAdamState(count=count, mu=mu, nu=nu, nu_max=nu_max)

    return optax.GradientTransformation(init, update)


def clip_by_norm(max_norm: float) -> optax.GradientTransformation:
    """Keras's `clipnorm`: rescales each tensor separately to L2 norm at most `max_norm`.

    `g * max_norm / max(||g||, max_norm)`, per leaf (optax's `clip_by_global_norm` uses one
    norm for the whole tree).

    Example:
      >>> tx = optax.chain(clip_by_norm(1.0), optax.sgd(0.1))
    """

    def update(updates, state, params=None):
        del params

        def clip(g: jax.Array) -> jax.Array:
            norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
            return (g * (max_norm / jnp.maximum(norm, max_norm))).astype(g.dtype)

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


# ---------------------------------------------------------------------------------------------
# Named optimizers (Keras 3 defaults).


def _decay(weight_decay: float | None, learning_rate: jax.Array) -> optax.GradientTransformation:
    """Keras's decoupled decay on top of a finished update: adds `-lr * wd * w`."""
    if weight_decay is None:
        return optax.identity()
    return optax.add_decayed_weights(-learning_rate * weight_decay)


def _adam(learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False, weight_decay=None):
    return optax.chain(
        scale_by_keras_adam(beta_1, beta_2, epsilon, amsgrad),
        optax.scale_by_learning_rate(learning_rate),
        _decay(weight_decay, learning_rate),
    )


def _adamw(
    learning_rate, weight_decay=0.004, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False
):
    return _adam(learning_rate, beta_1, beta_2, epsilon, amsgrad, weight_decay)


def _sgd(learning_rate, momentum=0.0, nesterov=False, weight_decay=None):
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"sgd momentum must be in [0, 1], got {momentum!r}")
    return optax.chain(
        optax.scale_by_learning_rate(learning_rate),
        optax.trace(decay=momentum, nesterov=nesterov) if momentum else optax.identity(),
        _decay(weight_decay, learning_rate),
    )


def _rmsprop(learning_rate, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False, weight_decay=None):
    return optax.chain(
        optax.rmsprop(
            learning_rate,
            decay=rho,
            eps=epsilon,
            eps_in_sqrt=True,
            centered=centered,
            momentum=momentum or None,
        ),
        _decay(weight_decay, learning_rate),
    )


# name -> (factory, default learning rate, hyperparameters injected into the state)
_OPTIMIZERS: dict[str, tuple[Callable[..., optax.GradientTransformation], float, tuple]] = {
    "adam": (_adam, 1e-3, ("beta_1", "beta_2", "epsilon")),
    "adamw": (_adamw, 1e-3, ("beta_1", "beta_2", "epsilon", "weight_decay")),
    "sgd": (_sgd, 0.01, ()),
    "rmsprop": (_rmsprop, 1e-3, ("rho", "epsilon")),
}


def _clipping(
    clipnorm: float | None, global_clipnorm: float | None, clipvalue: float | None
) -> optax.GradientTransformation | None:
    given = {
        k: v
        for k, v in (
            ("clipnorm", clipnorm),
            ("global_clipnorm", global_clipnorm),
            ("clipvalue", clipvalue),
        )
        if v is not None
    }
    if len(given) > 1:
        raise ValueError(
            f"only one of clipnorm, global_clipnorm and clipvalue can be set (as in Keras), got "
            f"{given}; keep only one of them"
        )
    for key, value in given.items():
        if not value > 0:
            raise ValueError(f"{key} must be > 0, got {value!r}")
    if clipnorm is not None:
        return clip_by_norm(clipnorm)
    if global_clipnorm is not None:
        return optax.clip_by_global_norm(global_clipnorm)
    if clipvalue is not None:
        return optax.clip(clipvalue)
    return None


def get(
    identifier: str | optax.GradientTransformation,
    learning_rate: ScalarOrSchedule | None = None,
    *,
    clipnorm: float | None = None,
    global_clipnorm: float | None = None,
    clipvalue: float | None = None,
    **kwargs: Any,
) -> optax.GradientTransformation:
    """Resolves an optimizer identifier to an optax transformation with Keras's behaviour.

    Named optimizers and their Keras 3 defaults: 'adam' (learning_rate=1e-3, beta_1=0.9,
    beta_2=0.999, epsilon=1e-7, amsgrad=False), 'adamw' (1e-3, weight_decay=0.004, otherwise
    as adam), 'sgd' (0.01, momentum=0.0, nesterov=False), 'rmsprop' (1e-3, rho=0.9,
    momentum=0.0, epsilon=1e-7, centered=False). All accept `weight_decay`. The learning rate
    (and the floats listed above) sit in the state's `hyperparams`, see `learning_rate`.

    Args:
      identifier: a name above (case-insensitive), or any `optax.GradientTransformation`,
        returned unchanged (with clipping chained in front if asked).
      learning_rate: a float or an optax schedule `step -> lr`; default: Keras's for the name.
      clipnorm: clip each gradient tensor to this L2 norm.
      global_clipnorm: clip all gradients jointly to this global L2 norm.
      clipvalue: clip each gradient element to [-clipvalue, clipvalue].
      **kwargs: the named optimizer's own arguments (beta_1, momentum, rho, ...).

    Returns:
      An `optax.GradientTransformation`. For a named optimizer its state is an
      `optax.InjectStatefulHyperparamsState`.

    Raises:
      ValueError: unknown name (lists the legal ones), several clip options, or a
        learning_rate / kwargs given with a ready-made transformation.
      TypeError: an unknown keyword argument for the named optimizer.

    Example:
      >>> tx = get("adam", learning_rate=3e-4, global_clipnorm=1.0)
      >>> state = tx.init(params)
      >>> round(learning_rate(state), 6)
      0.0003
    """
    clip = _clipping(clipnorm, global_clipnorm, clipvalue)
    keras_tx = _from_keras(identifier, learning_rate, kwargs)
    if keras_tx is not None:
        return keras_tx if clip is None else optax.chain(clip, keras_tx)
    if isinstance(identifier, optax.GradientTransformation):
        if learning_rate is not None or kwargs:
            raise ValueError(
                "learning_rate and optimizer arguments only apply to an optimizer given by name; "
                "got them with a ready-made optax transformation. Build it with the rate, e.g. "
                "optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)"
            )
        return identifier if clip is None else optax.chain(clip, identifier)
    if not isinstance(identifier, str):
        raise TypeError(
            f"optimizer must be a name or an optax.GradientTransformation, got {identifier!r} "
            f"of type {type(identifier).__name__}; e.g. optimizer='adam' or optax.adam(1e-3)"
        )
    entry = _OPTIMIZERS.get(identifier.lower())
    if entry is None:
        raise ValueError(
            f"unknown optimizer {identifier!r}; legal names are {sorted(_OPTIMIZERS)}, or pass "
            "any optax.GradientTransformation, e.g. optimizer='adam' or optax.lion(1e-4)"
        )
    factory, default_lr, injected = entry
    lr = default_lr if learning_rate is None else learning_rate
    defaults = _defaults(factory)
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise TypeError(
            f"optimizer {identifier!r} got unknown argument(s) {unknown}; its arguments are "
            f"{['learning_rate', *defaults]}, e.g. get({identifier!r}, learning_rate=1e-3)"
        )
    factory(0.0, **kwargs)  # checks the values eagerly, before anything is traced
    statics = {k: v for k, v in kwargs.items() if k not in injected}
    numeric = {k: kwargs.get(k, defaults[k]) for k in injected}

    def build(learning_rate, **hyper):
        inner = factory(learning_rate, **statics, **hyper)
        return inner if clip is None else optax.chain(clip, inner)

    build.__signature__ = _signature(("learning_rate", *injected))  # type: ignore[attr-defined]
    return optax.inject_hyperparams(build)(learning_rate=lr, **numeric)


def _from_keras(identifier: Any, learning_rate: Any, kwargs: dict) -> Any:
    """A Keras 3 optimizer object, or a name only Keras knows (when keras is imported), as
    optax through `keras_bridge.optimizer`; None for anything else."""
    from phalanx._src.train.api import keras_bridge

    if isinstance(identifier, str) and identifier.lower() not in _OPTIMIZERS:
        found = keras_bridge.keras_by_name("optimizers", identifier)
        if found is None:
            return None
        if learning_rate is not None:
            kwargs = {**kwargs, "learning_rate": learning_rate}
        identifier = type(found)(**kwargs)
    elif not keras_bridge.is_keras_object(identifier, "optimizers.Optimizer"):
        return None
    elif learning_rate is not None or kwargs:
        raise ValueError(
            "learning_rate and optimizer arguments only apply to an optimizer given by name; "
            "got them with a Keras optimizer object. Build it with them, e.g. "
            "keras.optimizers.Adam(learning_rate=1e-3)"
        )
    from phalanx._src.train.api.keras_bridge.optimizer import from_keras

    return from_keras(identifier)


def _defaults(fn: Callable) -> dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def _signature(names: tuple[str, ...]) -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(n, kind) for n in names])


# ---------------------------------------------------------------------------------------------
# The learning rate inside an optimizer state.


def _is_inject_state(x: Any) -> bool:
    return isinstance(x, optax.InjectStatefulHyperparamsState | optax.InjectHyperparamsState)


def _find_inject_state(opt_state: Any) -> Any:
    found = [
        s
        for s in jax.tree.leaves(opt_state, is_leaf=_is_inject_state)
        if _is_inject_state(s) and "learning_rate" in s.hyperparams
    ]
    if not found:
        raise ValueError(
            "this optimizer state has no injected learning rate; build the optimizer with "
            "phalanx.optimizers.get('adam', ...) or optax.inject_hyperparams(optax.adam)"
            "(learning_rate=...) to read or change it at run time"
        )
    return found[0]


def _unwrap(value: Any) -> Any:
    return value.get_value() if isinstance(value, nnx.Variable) else value


def learning_rate(opt_state: Any) -> float:
    """The current learning rate stored in an optimizer state, as a Python float.

    For a scheduled rate this is the value used by the most recent update (the schedule at
    step 0 before any update). Fetches one scalar from the device.

    Args:
      opt_state: the state of a transformation built by `get` (or any
        `optax.inject_hyperparams` one), possibly nested in wrappers or an `nnx.Optimizer`.

    Returns:
      The learning rate.

    Raises:
      ValueError: the state holds no injected learning rate.

    Example:
      >>> round(learning_rate(get("sgd").init(params)), 6)   # stored as float32
      0.01
    """
    return float(_unwrap(_find_inject_state(opt_state).hyperparams["learning_rate"]))


def set_learning_rate(opt_state: Any, value: float) -> Any:
    """Sets the learning rate used by the next updates.

    The hyperparams dict inside the state is updated in place (and, for `nnx.Optimizer`
    state, the Variable holding it), keeping the stored dtype. The state is also returned, so
    `opt_state = set_learning_rate(opt_state, 1e-4)` reads naturally. Do not call it on a
    state that is being traced; set it between compiled steps.

    Args:
      opt_state: as for `learning_rate`.
      value: the new learning rate.

    Returns:
      `opt_state`, updated.

    Raises:
      ValueError: the state holds no injected learning rate.
      TypeError: the learning rate is a schedule (it would be overwritten every step), as
        Keras raises for a `LearningRateSchedule`.

    Example:
      >>> state = set_learning_rate(state, 1e-4)
    """
    inject = _find_inject_state(opt_state)
    if "learning_rate" in getattr(inject, "hyperparams_states", {}):
        raise TypeError(
            "this optimizer's learning rate is a schedule, so it cannot be set; give the "
            "optimizer a float learning rate to change it at run time (e.g. from "
            "LearningRateScheduler), or put the change into the schedule"
        )
    current = inject.hyperparams["learning_rate"]
    if isinstance(current, nnx.Variable):
        old = current.get_value()
        current.set_value(jnp.asarray(value, dtype=old.dtype))
    else:
        inject.hyperparams["learning_rate"] = jnp.asarray(value, dtype=jnp.asarray(current).dtype)
    return opt_state
