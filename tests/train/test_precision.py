"""Precision policies and Keras's dynamic loss scaling."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from phalanx import losses, metrics, mixed_precision, optimizers

PARAMS = {"w": jnp.array([1.0, -2.0]), "b": jnp.array(0.5), "step": jnp.array(3, jnp.int32)}


def test_policies_name_their_dtypes():
    expected = {
        "float32": (jnp.float32, False),
        "mixed_bfloat16": (jnp.bfloat16, False),
        "mixed_float16": (jnp.float16, True),
    }
    for name, (compute, scaling) in expected.items():
        policy = mixed_precision.Policy(name)
        assert policy.compute_dtype == compute
        assert policy.param_dtype == jnp.float32 == policy.variable_dtype
        assert policy.loss_scaling is scaling
    with pytest.raises(ValueError, match=r"unknown dtype policy 'bfloat16'; legal names are"):
        mixed_precision.Policy("bfloat16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        mixed_precision.Policy("float32").name = "mixed_float16"


def test_cast_to_compute_only_touches_float_leaves():
    cast = mixed_precision.Policy("mixed_bfloat16").cast_to_compute(PARAMS)
    assert cast["w"].dtype == jnp.bfloat16 and cast["b"].dtype == jnp.bfloat16
    assert cast["step"].dtype == jnp.int32
    back = mixed_precision.Policy("mixed_bfloat16").cast_to_param(cast)
    assert back["w"].dtype == jnp.float32


def test_bfloat16_policy_computes_in_bf16_and_keeps_params_float32():
    policy = mixed_precision.Policy("mixed_bfloat16")
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    x = jnp.ones((2, 4))

    def loss_fn(params):
        module = nnx.merge(graphdef, policy.cast_to_compute(params))
        y = module(policy.cast_to_compute(x))
        assert y.dtype == jnp.bfloat16  # the forward pass ran in bf16
        return jnp.mean(policy.cast_to_output(y) ** 2)

    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    assert loss.dtype == jnp.float32
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    # The product really was computed from bf16-rounded weights.
    kernel = np.asarray(params["kernel"][...])
    rounded = np.asarray(jnp.asarray(kernel, jnp.bfloat16), np.float32)
    expected = float(np.mean((x @ rounded + np.asarray(params["bias"][...])) ** 2))
    assert float(loss) == pytest.approx(expected, rel=1e-2)


def test_global_policy_defaults_to_float32_and_is_settable():
    assert mixed_precision.global_policy() == mixed_precision.Policy("float32")
    try:
        mixed_precision.set_global_policy("mixed_bfloat16")
        assert mixed_precision.get(None).compute_dtype == jnp.bfloat16
    finally:
        mixed_precision.set_global_policy("float32")
    with pytest.raises(TypeError, match="a name or a Policy"):
        mixed_precision.get(16)


def loss_fn(params, scale_of):
    loss = jnp.sum(params["w"] ** 2) + params["b"]
    return mixed_precision.scale_loss(loss, scale_of)


def test_scale_loss_and_unscaled_update_equal_the_plain_update():
    inner = optimizers.get("sgd", learning_rate=0.1)
    tx = mixed_precision.loss_scale_optimizer(inner)
    params = {"w": PARAMS["w"], "b": PARAMS["b"]}
    state = tx.init(params)
    assert float(mixed_precision.current_loss_scale(state)) == 2.0**15
    grads = jax.grad(loss_fn)(params, state)
    np.testing.assert_allclose(grads["w"], 2 * 2.0**15 * np.array([1.0, -2.0]))
    updates, state = tx.update(grads, state, params)
    plain, _ = inner.update(jax.grad(loss_fn)(params, None), inner.init(params), params)
    for key in params:
        np.testing.assert_allclose(updates[key], plain[key], rtol=1e-6)
    assert int(state.good_steps) == 1
    assert mixed_precision.scale_loss(jnp.float32(2.0), inner.init(params)) == 2.0  # no scaling


def test_non_finite_gradient_halves_the_scale_and_skips_the_step():
    tx = mixed_precision.loss_scale_optimizer(optimizers.get("adam"), initial_scale=1024.0)
    params = {"w": PARAMS["w"], "b": PARAMS["b"]}
    state = tx.init(params)
    update = jax.jit(tx.update)
    finite = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(3.0)}
    _, state = update(finite, state, params)
    assert int(state.good_steps) == 1
    for bad in (jnp.inf, jnp.nan):
        before = state
        updates, state = update({"w": jnp.array([1.0, bad]), "b": jnp.array(1.0)}, state, params)
        new_params = optax.apply_updates(params, updates)
        for key in params:
            np.testing.assert_array_equal(new_params[key], params[key])
        for old, new in zip(
            jax.tree.leaves(before.inner_state), jax.tree.leaves(state.inner_state), strict=True
        ):
            np.testing.assert_array_equal(old, new)
        assert float(state.loss_scale) == float(before.loss_scale) / 2
        assert int(state.good_steps) == 0
    assert float(state.loss_scale) == 256.0
    assert optimizers.learning_rate(state) == pytest.approx(1e-3)  # found through the wrapper


def test_scale_doubles_after_the_growth_period_of_finite_steps():
    def scales_after(steps, growth):
        tx = mixed_precision.loss_scale_optimizer(
            optax.sgd(0.0), initial_scale=8.0, dynamic_growth_steps=growth
        )
        params = {"w": jnp.zeros(2)}

        @jax.jit
        def loop(state):
            def body(state, _):
                _, state = tx.update({"w": jnp.ones(2)}, state, params)
                return state, (state.loss_scale, state.good_steps)

            return jax.lax.scan(body, state, None, length=steps)[1]

        return loop(tx.init(params))

    scales, good = scales_after(2001, 2000)  # Keras's default period
    assert float(scales[1998]) == 8.0 and int(good[1998]) == 1999
    assert float(scales[1999]) == 16.0 and int(good[1999]) == 0
    assert float(scales[2000]) == 16.0 and int(good[2000]) == 1
    scales, _ = scales_after(9, 3)
    np.testing.assert_array_equal(scales, [8, 8, 16, 16, 16, 32, 32, 32, 64])


def test_wrap_optimizer_and_argument_checks():
    tx = optax.sgd(0.1)
    assert mixed_precision.Policy("mixed_bfloat16").wrap_optimizer(tx) is tx
    wrapped = mixed_precision.Policy("mixed_float16").wrap_optimizer(tx)
    assert isinstance(wrapped.init({"w": jnp.zeros(1)}), mixed_precision.LossScaleState)
    with pytest.raises(ValueError, match="dynamic_growth_steps must be a positive int"):
        mixed_precision.loss_scale_optimizer(tx, dynamic_growth_steps=0)
    assert bool(mixed_precision.all_finite({"a": jnp.ones(2), "b": jnp.zeros(())}))
    assert not bool(mixed_precision.all_finite({"a": jnp.array([1.0, jnp.nan])}))
    np.testing.assert_allclose(
        mixed_precision.unscale_grads({"a": jnp.array([8.0])}, 4.0)["a"], [2.0]
    )


@pytest.mark.parametrize("policy_name", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_one_train_step_serves_every_policy(policy_name):
    """The step the Model builds, in miniature: cast, float32 loss, scale, update, metrics."""
    policy = mixed_precision.Policy(policy_name)
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tx = policy.wrap_optimizer(optimizers.get("sgd", learning_rate=0.5))
    loss = losses.get("sparse_categorical_crossentropy", from_logits=True)
    accuracy = metrics.get("accuracy", loss=loss)
    metrics_def, metric_state = nnx.split(accuracy)
    x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    mask = np.array([1.0] * 6 + [0.0] * 2, np.float32)  # two padded rows

    @jax.jit
    def step(params, opt_state, metric_state):
        def loss_fn(params):
            logits = nnx.merge(graphdef, policy.cast_to_compute(params))(policy.cast_to_compute(x))
            per_example = loss(y, logits)
            mean = jnp.sum(per_example * mask) / jnp.sum(mask)
            return mixed_precision.scale_loss(mean, opt_state), (mean, logits)

        grads, (mean, logits) = jax.grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        m = nnx.merge(metrics_def, metric_state)
        m.update_state(y, logits.astype(jnp.float32), sample_weight=mask)
        return optax.apply_updates(params, updates), opt_state, nnx.state(m), mean

    opt_state = tx.init(params)
    first = None
    for _ in range(5):
        params, opt_state, metric_state, mean = step(params, opt_state, metric_state)
        first = float(mean) if first is None else first
    assert float(mean) < first
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    nnx.update(accuracy, metric_state)
    assert float(accuracy.count[...]) == 5 * 6  # padded rows never counted
    assert (mixed_precision.current_loss_scale(opt_state) is not None) == policy.loss_scaling
