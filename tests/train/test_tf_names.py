"""TF's and Keras's names on phalanx objects: metrics (`reset_states`, calling, `dtype=`),
losses (`reduction=`), `model.optimizer.learning_rate` / `iterations`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx

LABELS = jnp.array([1, 0, 2, 1])
LOGITS = jnp.array([[0.1, 2.0, 0.3], [1.5, 0.2, 0.1], [0.3, 0.2, 0.1], [0.0, 0.5, 3.0]])


def test_metric_call_updates_and_returns_the_result():
    accuracy = phalanx.metrics.SparseCategoricalAccuracy("training_accuracy", dtype="float32")
    assert accuracy.name == "training_accuracy" and accuracy.dtype == np.float32
    assert float(accuracy(LABELS[:2], LOGITS[:2])) == 1.0
    assert float(accuracy(LABELS[2:], LOGITS[2:])) == 0.5  # 2 of 4 so far
    accuracy.reset_states()
    assert float(accuracy.result()) == 0.0
    loss = phalanx.metrics.Mean("training_loss", dtype=jnp.float32)
    assert float(loss(jnp.array([1.0, 3.0]), sample_weight=jnp.array([1.0, 0.0]))) == 1.0
    assert float(loss(2.0)) == 1.5
    loss.reset_states()
    assert float(loss.result()) == 0.0
    auc = phalanx.metrics.AUC(dtype="bfloat16")
    assert auc.dtype == jnp.bfloat16
    assert (
        float(phalanx.metrics.Precision(dtype="float32")(jnp.array([1, 0]), jnp.array([0.9, 0.1])))
        == 1.0
    )
    with pytest.raises(ValueError, match=r"dtype='int32'.*float dtype"):
        phalanx.metrics.Mean(dtype="int32")


def test_loss_reductions_are_keras_3s():
    per_example = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS, LOGITS)
    assert per_example.shape == (4,)
    weight = jnp.array([1.0, 0.0, 2.0, 1.0])

    def loss(reduction):
        return phalanx.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)

    np.testing.assert_allclose(loss("sum")(LABELS, LOGITS), per_example.sum(), rtol=1e-6)
    np.testing.assert_allclose(
        loss("sum_over_batch_size")(LABELS, LOGITS), per_example.mean(), rtol=1e-6
    )
    np.testing.assert_allclose(
        loss("sum_over_batch_size")(LABELS, LOGITS, sample_weight=weight),
        (per_example * weight).sum() / 4,  # Keras divides by the batch size, not the weights
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        loss("mean_with_sample_weight")(LABELS, LOGITS, sample_weight=weight),
        (per_example * weight).sum() / weight.sum(),
        rtol=1e-6,
    )
    np.testing.assert_allclose(loss(None)(LABELS, LOGITS), per_example)
    np.testing.assert_allclose(loss("none")(LABELS, LOGITS, weight), per_example * weight)
    assert "reduction='sum'" in repr(loss("sum"))
    with pytest.raises(ValueError, match=r"reduction='auto'.*'sum_over_batch_size'"):
        loss("auto")
    mse = phalanx.losses.MeanSquaredError(reduction="sum")
    assert float(mse(jnp.ones((3, 2)), jnp.zeros((3, 2)))) == 3.0


def test_sum_over_batch_size_in_replicas_sums_to_one_devices_mean():
    strategy = phalanx.Strategy()
    loss = phalanx.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size"
    )
    rows = 2 * strategy.num_replicas_in_sync + 3  # a partial, padded global batch
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, rows)
    logits = rng.normal(size=(rows, 3)).astype(np.float32)
    batch = next(iter(strategy.experimental_distribute_dataset([(labels, logits)])))
    per_replica = strategy.run(lambda b: loss(b[0], b[1]), args=(batch,))
    total = strategy.reduce("sum", per_replica, axis=None)
    np.testing.assert_allclose(total, loss(labels, logits), rtol=1e-5)


def _model(devices, loss):
    with phalanx.Strategy(devices=devices).scope():
        model = phalanx.Model(nnx.Linear(4, 3, rngs=nnx.Rngs(0)))
        model.compile(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1), loss=loss)
    return model


def test_compile_uses_per_example_values_whatever_the_reduction():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(24, 4)).astype(np.float32)
    y = rng.integers(0, 3, 24)
    weights = []
    for reduction in ("none", "sum"):
        loss = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
        model = _model(jax.devices()[:2], loss)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        weights.append(model.get_weights())
        assert loss.reduction == reduction  # the user's object is left as it was
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_model_optimizer_learning_rate_and_iterations_as_keras():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    with phalanx.Strategy(devices=jax.devices()[:2]).scope():
        model = phalanx.Model(nnx.Linear(4, 3, rngs=nnx.Rngs(0)))
        assert model.optimizer is None  # as Keras, before compile
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    seen = []

    class PrintLR(phalanx.callbacks.Callback):  # TF's distributed-training tutorial callback
        def on_epoch_end(self, epoch, logs=None):
            seen.append(model.optimizer.learning_rate.numpy())
            model.optimizer.learning_rate = model.optimizer.learning_rate / 2

    assert model.optimizer.learning_rate == pytest.approx(1e-3)
    assert int(model.optimizer.iterations) == 0
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[PrintLR()])
    np.testing.assert_allclose(seen, [1e-3, 5e-4, 2.5e-4], rtol=1e-6)
    assert model.learning_rate == pytest.approx(1.25e-4)
    assert model.optimizer.iterations.numpy() == 12  # 4 batches x 3 epochs
    model.optimizer.learning_rate.assign(0.01)
    assert model.optimizer.learning_rate == pytest.approx(0.01)
    with pytest.raises(TypeError, match="takes a number"):
        model.optimizer.learning_rate = "fast"


def test_nnx_optimizer_learning_rate_the_phalanx_way():
    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(
        model, phalanx.optimizers.get("sgd", learning_rate=0.5), wrt=nnx.Param
    )
    assert phalanx.optimizers.learning_rate(optimizer) == 0.5
    phalanx.optimizers.set_learning_rate(optimizer, 0.25)
    assert phalanx.optimizers.learning_rate(optimizer) == 0.25
    grads = jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param))
    optimizer.update(model, grads)
    assert int(optimizer.step[...]) == 1
    np.testing.assert_allclose(model.bias[...], -0.25)
