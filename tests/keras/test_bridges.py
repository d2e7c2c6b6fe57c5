"""Keras optimizers, losses and metrics as optax / phalanx objects, with Keras's numbers."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest

import phalanx
from phalanx._src.train.api import keras_bridge, losses, optimizers
from phalanx._src.train.api.keras_bridge.losses import KerasLoss
from phalanx._src.train.api.keras_bridge.metrics import KerasMetric
from phalanx._src.train.api.metrics import registry


def _steps(make_optimizer, steps=4):
    """Parameters after `steps` updates by Keras's optimizer and by the optax bridge."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(2,)).astype(np.float32)]
    grads = [[rng.normal(size=p.shape).astype(np.float32) for p in start] for _ in range(steps)]
    variables = [keras.Variable(p) for p in start]
    keras_opt = make_optimizer()
    for g in grads:
        keras_opt.apply(g, variables)
    tx = optimizers.get(make_optimizer())
    params = [jnp.asarray(p) for p in start]
    state = tx.init(params)
    update = jax.jit(tx.update)
    for g in grads:
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return [np.asarray(v.value) for v in variables], params, state


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(0.1, weight_decay=0.01),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, clipnorm=0.5),
        lambda: keras.optimizers.Lion(0.05),
        lambda: keras.optimizers.Adagrad(0.3),
    ],
)
def test_keras_optimizer_as_optax_takes_kerass_steps(make):
    expected, got, state = _steps(make)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))  # checkpointable


def test_keras_optimizer_learning_rate_is_readable_and_settable():
    tx = optimizers.get(keras.optimizers.RMSprop(0.02))
    state = tx.init([jnp.zeros(3)])
    assert optimizers.learning_rate(state) == pytest.approx(0.02)
    state = optimizers.set_learning_rate(state, 0.005)
    _, state = tx.update([jnp.ones(3)], state, [jnp.zeros(3)])
    assert optimizers.learning_rate(state) == pytest.approx(0.005)


def test_keras_only_optimizer_name_takes_arguments():
    with keras_bridge.keras_names():
        tx = optimizers.get("nadam", learning_rate=0.3)
    assert optimizers.learning_rate(tx.init([jnp.zeros(2)])) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="only apply to an optimizer given by name"):
        optimizers.get(keras.optimizers.Adam(), learning_rate=0.1)


def test_keras_loss_is_per_example_with_kerass_values():
    rng = np.random.default_rng(1)
    y_true = rng.normal(size=(6, 3)).astype(np.float32)
    y_pred = rng.normal(size=(6, 3)).astype(np.float32)
    keras_loss = keras.losses.Huber(delta=0.5)
    loss = losses.get(keras_loss)
    assert isinstance(loss, KerasLoss) and loss.name == "huber_loss"
    per_example = loss(y_true, y_pred)
    assert per_example.shape == (6,)
    np.testing.assert_allclose(np.mean(per_example), keras_loss(y_true, y_pred), rtol=1e-6)
    assert keras_loss.reduction == "sum_over_batch_size"  # the user's object is untouched
    with keras_bridge.keras_names():  # as while a Keras model is compiled
        assert losses.get("log_cosh")(y_true, y_pred).shape == (6,)  # a name only Keras knows


def test_keras_loss_on_predictions_of_shape_batch_is_per_example():
    # Keras averages the last axis, here the batch: phalanx gives each example its own value.
    y_true = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
    y_pred = np.array([0.5, 1.0, 1.0, 5.0], np.float32)
    loss = losses.get(keras.losses.MeanSquaredError())
    np.testing.assert_allclose(loss(y_true, y_pred), (y_true - y_pred) ** 2, rtol=1e-6)


def test_keras_metric_accumulates_as_keras_does_and_merges_additively():
    rng = np.random.default_rng(2)
    y = (rng.random(20) > 0.5).astype(np.float32)
    p = rng.random(20).astype(np.float32)
    w = rng.random(20).astype(np.float32)
    reference = keras.metrics.AUC(num_thresholds=50)
    reference.update_state(y, p, sample_weight=w)
    first, second = (registry.get(keras.metrics.AUC(num_thresholds=50)) for _ in range(2))
    assert isinstance(first, KerasMetric)
    first.update_state(y[:12], p[:12], sample_weight=w[:12])
    second.update_state(y[12:], p[12:], sample_weight=w[12:])
    first.merge(second)
    np.testing.assert_allclose(first.result(), reference.result(), rtol=1e-6)
    first.reset_state()
    assert float(first.result()) == 0.0
    assert registry.get("accuracy", loss=losses.get(keras.losses.BinaryCrossentropy())).name
    with keras_bridge.keras_names():
        assert isinstance(registry.get("binary_crossentropy"), phalanx.metrics.Metric)


def test_phalanx_never_imports_keras_for_an_nnx_model():
    code = (
        "import sys, numpy as np, phalanx\n"
        "from flax import nnx\n"
        "with phalanx.Strategy().scope():\n"
        "    m = phalanx.Model(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))\n"
        "    m.compile('adam', 'mse', metrics=['mae'])\n"
        "m.fit(np.ones((4, 3), np.float32), np.ones((4, 2), np.float32), verbose=0)\n"
        "assert 'keras' not in sys.modules, 'keras was imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
