"""Losses against NumPy references written from Keras's formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phalanx import losses

EPS = 1e-7
RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(6, 4)).astype(np.float32) * 3
LABELS = np.array([0, 3, 1, 2, 3, 0])
ONE_HOT = np.eye(4, dtype=np.float32)[LABELS]


def np_softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_categorical(onehot, probs):
    probs = np.clip(probs / probs.sum(-1, keepdims=True), EPS, 1 - EPS)
    return -(onehot * np.log(probs)).sum(-1)


def np_binary(y, p):
    p = np.clip(p, EPS, 1 - EPS)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def test_sparse_categorical_from_logits_and_probabilities():
    expected = np_categorical(ONE_HOT, np_softmax(LOGITS))
    from_logits = losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS, LOGITS)
    from_probs = losses.SparseCategoricalCrossentropy()(LABELS, np_softmax(LOGITS))
    assert from_logits.shape == (6,) and from_logits.dtype == jnp.float32
    np.testing.assert_allclose(from_logits, expected, rtol=1e-5)
    np.testing.assert_allclose(from_probs, expected, rtol=1e-5)
    # (batch, 1) labels are accepted, as in Keras.
    np.testing.assert_allclose(
        losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS[:, None], LOGITS),
        expected,
        rtol=1e-5,
    )


def test_probabilities_are_clipped_like_keras():
    probs = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    out = losses.SparseCategoricalCrossentropy()(np.array([1, 1]), probs)
    np.testing.assert_allclose(
        out, [-np.log(np.float32(EPS)), -np.log(np.float32(1 - EPS))], rtol=1e-4
    )
    assert np.all(np.isfinite(out))


def test_categorical_from_logits_probabilities_and_smoothing():
    expected = np_categorical(ONE_HOT, np_softmax(LOGITS))
    np.testing.assert_allclose(
        losses.CategoricalCrossentropy(from_logits=True)(ONE_HOT, LOGITS), expected, rtol=1e-5
    )
    np.testing.assert_allclose(
        losses.CategoricalCrossentropy()(ONE_HOT, np_softmax(LOGITS)), expected, rtol=1e-5
    )
    smoothed = ONE_HOT * 0.9 + 0.1 / 4
    np.testing.assert_allclose(
        losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)(ONE_HOT, LOGITS),
        np_categorical(smoothed, np_softmax(LOGITS)),
        rtol=1e-5,
    )


def test_binary_from_logits_and_probabilities_means_last_axis():
    logits = RNG.normal(size=(5, 3)).astype(np.float32)
    y = (RNG.random((5, 3)) > 0.5).astype(np.float32)
    probs = 1 / (1 + np.exp(-logits))
    expected = np_binary(y, probs).mean(-1)
    np.testing.assert_allclose(
        losses.BinaryCrossentropy(from_logits=True)(y, logits), expected, rtol=1e-5
    )
    np.testing.assert_allclose(losses.BinaryCrossentropy()(y, probs), expected, rtol=1e-5)
    # (batch,) labels against (batch, 1) predictions: one value per example.
    out = losses.BinaryCrossentropy()(y[:, 0], probs[:, :1])
    np.testing.assert_allclose(out, np_binary(y[:, 0], probs[:, 0]), rtol=1e-5)


def test_regression_losses_mean_trailing_axes():
    y = RNG.normal(size=(4, 2, 3)).astype(np.float32)
    p = RNG.normal(size=(4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(losses.get("mse")(y, p), ((y - p) ** 2).mean((1, 2)), rtol=1e-5)
    np.testing.assert_allclose(losses.get("mae")(y, p), np.abs(y - p).mean((1, 2)), rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_predictions_give_float32_losses(dtype):
    out = losses.get("sparse_categorical_crossentropy", from_logits=True)(
        LABELS, jnp.asarray(LOGITS, dtype)
    )
    assert out.dtype == jnp.float32
    expected = np_categorical(
        ONE_HOT, np_softmax(np.asarray(jnp.asarray(LOGITS, dtype), np.float32))
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_losses_work_under_jit_and_grad():
    loss = losses.get("categorical_crossentropy", from_logits=True)
    grads = jax.jit(jax.grad(lambda z: loss(ONE_HOT, z).sum()))(LOGITS)
    np.testing.assert_allclose(grads, np_softmax(LOGITS) - ONE_HOT, atol=1e-6)


def test_get_resolves_names_instances_and_functions():
    assert isinstance(losses.get("mean_squared_error"), losses.MeanSquaredError)
    assert isinstance(losses.get("MAE"), losses.MeanAbsoluteError)
    assert losses.get("binary_crossentropy", from_logits=True).from_logits
    instance = losses.CategoricalCrossentropy()
    assert losses.get(instance) is instance

    def my_loss(y_true, y_pred):
        return jnp.abs(y_true - y_pred)[:, 0]

    wrapped = losses.get(my_loss)
    assert wrapped.name == "my_loss"
    np.testing.assert_allclose(wrapped(np.ones((2, 1)), np.zeros((2, 1))), [1.0, 1.0])


def test_get_errors_name_the_legal_values():
    with pytest.raises(ValueError, match=r"legal names are .*'sparse_categorical_crossentropy'"):
        losses.get("crossentropy_sparse")
    with pytest.raises(TypeError, match="only apply to a loss given by name"):
        losses.get(losses.MeanSquaredError(), from_logits=True)
    with pytest.raises(TypeError, match="got 3 of type int"):
        losses.get(3)
    with pytest.raises(ValueError, match="For one-hot labels use"):
        losses.SparseCategoricalCrossentropy()(ONE_HOT[:, :3], LOGITS)
