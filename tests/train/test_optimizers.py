"""Named optimizers: Keras's defaults and Keras's update rules, step for step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from phalanx import optimizers

PARAMS = {"w": np.array([1.0, -2.0, 0.5], np.float32), "b": np.array(0.25, np.float32)}
# One gradient element near epsilon, where Keras's and optax's Adam differ most.
GRADS = [
    {"w": np.array([1e-6, 3.0, -0.2], np.float32), "b": np.array(-0.1, np.float32)},
    {"w": np.array([2e-6, -1.0, 0.4], np.float32), "b": np.array(0.3, np.float32)},
]


def run(tx, steps=2):
    params = jax.tree.map(jnp.asarray, PARAMS)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for grads in GRADS[:steps]:
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


# Keras 3's update_step code, transcribed to NumPy float64, one variable at a time.
def keras_adam(lr=1e-3, b1=0.9, b2=0.999, eps=1e-7, wd=None, amsgrad=False):
    out = {}
    for key, var in PARAMS.items():
        var = var.astype(np.float64)
        m = v = v_hat = np.zeros_like(var)
        for t, grads in enumerate(GRADS, start=1):
            g = grads[key].astype(np.float64)
            if wd:
                var = var - var * wd * lr
            alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
            m = m + (g - m) * (1 - b1)
            v = v + (g * g - v) * (1 - b2)
            v_hat = np.maximum(v_hat, v)
            var = var - m * alpha / (np.sqrt(v_hat if amsgrad else v) + eps)
        out[key] = var
    return out


def keras_sgd(lr=0.01, momentum=0.0, nesterov=False):
    out = {}
    for key, var in PARAMS.items():
        var = var.astype(np.float64)
        m = np.zeros_like(var)
        for grads in GRADS:
            g = grads[key].astype(np.float64)
            if momentum:
                m = m * momentum - g * lr
                var = var + (m * momentum - g * lr if nesterov else m)
            else:
                var = var - g * lr
        out[key] = var
    return out


def keras_rmsprop(lr=1e-3, rho=0.9, momentum=0.0, eps=1e-7, centered=False):
    out = {}
    for key, var in PARAMS.items():
        var = var.astype(np.float64)
        vel = avg = mom = np.zeros_like(var)
        for grads in GRADS:
            g = grads[key].astype(np.float64)
            vel = rho * vel + (1 - rho) * g * g
            if centered:
                avg = rho * avg + (1 - rho) * g
                denominator = vel - avg * avg + eps
            else:
                denominator = vel + eps
            increment = lr * g / np.sqrt(denominator)
            if momentum:
                mom = momentum * mom + increment
                var = var - mom
            else:
                var = var - increment
        out[key] = var
    return out


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("adam", {"learning_rate": 1e-3, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}),
        (
            "adamw",
            {
                "learning_rate": 1e-3,
                "beta_1": 0.9,
                "beta_2": 0.999,
                "epsilon": 1e-7,
                "weight_decay": 0.004,
            },
        ),
        ("sgd", {"learning_rate": 0.01}),
        ("rmsprop", {"learning_rate": 1e-3, "rho": 0.9, "epsilon": 1e-7}),
    ],
)
def test_named_optimizers_take_keras_defaults(name, expected):
    state = optimizers.get(name).init(PARAMS)
    assert set(state.hyperparams) == set(expected)
    for key, value in expected.items():
        assert float(state.hyperparams[key]) == pytest.approx(value, rel=1e-6)
    assert optimizers.learning_rate(state) == pytest.approx(expected["learning_rate"], rel=1e-6)


@pytest.mark.parametrize(
    ("name", "kwargs", "reference"),
    [
        ("adam", {}, keras_adam()),
        ("adam", {"amsgrad": True, "beta_1": 0.5}, keras_adam(b1=0.5, amsgrad=True)),
        ("adamw", {}, keras_adam(wd=0.004)),
        ("adamw", {"learning_rate": 0.1, "weight_decay": 0.5}, keras_adam(lr=0.1, wd=0.5)),
        ("sgd", {}, keras_sgd()),
        ("sgd", {"momentum": 0.9}, keras_sgd(momentum=0.9)),
        ("sgd", {"momentum": 0.9, "nesterov": True}, keras_sgd(momentum=0.9, nesterov=True)),
        ("rmsprop", {}, keras_rmsprop()),
        (
            "rmsprop",
            {"momentum": 0.5, "centered": True},
            keras_rmsprop(momentum=0.5, centered=True),
        ),
    ],
)
def test_two_steps_match_keras_update_rules(name, kwargs, reference):
    params, _ = run(optimizers.get(name, **kwargs))
    for key in PARAMS:
        np.testing.assert_allclose(params[key], reference[key], rtol=1e-6, atol=1e-9)


def test_keras_adam_differs_from_optax_adam_near_epsilon():
    """The reason for a custom Adam: optax puts eps on the bias-corrected root."""
    ours, _ = run(optimizers.get("adam"), steps=1)
    theirs, _ = run(optax.adam(1e-3, eps=1e-7), steps=1)
    step_ours = PARAMS["w"][0] - float(ours["w"][0])
    step_theirs = PARAMS["w"][0] - float(theirs["w"][0])
    # Keras: lr * sqrt(1-b2) g / (sqrt(1-b2) |g| + eps) with g = 1e-6.
    keras = 1e-3 * np.sqrt(1e-3) * 1e-6 / (np.sqrt(1e-3) * 1e-6 + 1e-7)
    assert step_ours == pytest.approx(keras, rel=1e-4)
    assert step_theirs == pytest.approx(1e-3 * 1e-6 / (1e-6 + 1e-7), rel=1e-4)


def test_clipping_options():
    grads = {"w": np.array([3.0, 4.0], np.float32), "b": np.array([0.3], np.float32)}
    params = jax.tree.map(np.zeros_like, grads)

    def first_update(**clip):
        tx = optimizers.get("sgd", learning_rate=1.0, **clip)
        updates, _ = tx.update(grads, tx.init(params), params)
        return jax.tree.map(lambda u: -np.asarray(u), updates)

    per_tensor = first_update(clipnorm=1.0)
    np.testing.assert_allclose(per_tensor["w"], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(per_tensor["b"], [0.3], rtol=1e-6)  # already below the norm
    joint = first_update(global_clipnorm=1.0)
    total = np.sqrt(25 + 0.09)
    np.testing.assert_allclose(joint["w"], [3 / total, 4 / total], rtol=1e-6)
    np.testing.assert_allclose(joint["b"], [0.3 / total], rtol=1e-6)
    by_value = first_update(clipvalue=0.5)
    np.testing.assert_allclose(by_value["w"], [0.5, 0.5])
    np.testing.assert_allclose(by_value["b"], [0.3], rtol=1e-6)
    with pytest.raises(ValueError, match="only one of clipnorm, global_clipnorm and clipvalue"):
        optimizers.get("adam", clipnorm=1.0, clipvalue=1.0)
    with pytest.raises(ValueError, match="clipnorm must be > 0"):
        optimizers.get("adam", clipnorm=0.0)


def test_optax_transformations_pass_through_with_clipping_in_front():
    tx = optax.sgd(1.0)
    assert optimizers.get(tx) is tx
    clipped = optimizers.get(tx, clipvalue=0.1)
    updates, _ = clipped.update({"w": jnp.array([5.0])}, clipped.init({"w": jnp.zeros(1)}))
    np.testing.assert_allclose(updates["w"], [-0.1])
    with pytest.raises(ValueError, match="only apply to an optimizer given by name"):
        optimizers.get(tx, learning_rate=0.1)


def test_learning_rate_is_readable_and_settable_at_run_time():
    tx = optimizers.get("sgd", learning_rate=0.5)
    _, state = run(tx, steps=1)
    assert optimizers.learning_rate(state) == 0.5
    state = optimizers.set_learning_rate(state, 0.25)
    assert optimizers.learning_rate(state) == 0.25
    params = jax.tree.map(jnp.asarray, PARAMS)
    updates, state = jax.jit(tx.update)(GRADS[0], state, params)  # the new rate is used
    np.testing.assert_allclose(updates["b"], 0.25 * 0.1, rtol=1e-6)
    assert state.hyperparams["learning_rate"].dtype == jnp.float32


def test_schedules_are_readable_but_not_settable():
    tx = optimizers.get("adam", learning_rate=optax.linear_schedule(1.0, 0.0, 10))
    _, state = run(tx, steps=2)
    assert optimizers.learning_rate(state) == pytest.approx(0.9)  # used by the second step
    with pytest.raises(TypeError, match="is a schedule, so it cannot be set"):
        optimizers.set_learning_rate(state, 0.1)


def test_learning_rate_inside_nnx_optimizer_and_wrappers():
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.MultiSteps(optimizers.get("adam"), 2), wrt=nnx.Param)
    assert optimizers.learning_rate(optimizer.opt_state) == pytest.approx(1e-3)
    optimizers.set_learning_rate(optimizer.opt_state, 0.5)
    assert optimizers.learning_rate(optimizer.opt_state) == 0.5
    with pytest.raises(ValueError, match="no injected learning rate"):
        optimizers.learning_rate(optax.adam(1e-3).init(PARAMS))


def test_get_errors_name_the_legal_values():
    with pytest.raises(ValueError, match=r"legal names are \['adam', 'adamw', 'rmsprop', 'sgd'\]"):
        optimizers.get("adamax")
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['beta1'\].*'beta_1'"):
        optimizers.get("adam", beta1=0.8)
    with pytest.raises(TypeError, match=r"a name or an optax\.GradientTransformation"):
        optimizers.get(0.1)
    with pytest.raises(ValueError, match="momentum must be in"):
        optimizers.get("sgd", momentum=1.5)
