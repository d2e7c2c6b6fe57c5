"""evaluate and predict of a Keras model on partial batches equal Keras's own."""

import keras
import numpy as np
import pytest
from keras_models import mlp, twin

pytestmark = pytest.mark.multidevice


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    return x, np.eye(5, dtype=np.float32)[rng.integers(0, 5, n)]


def _compile(model):
    model.compile(
        optimizer="adam",
        loss=keras.losses.CategoricalCrossentropy(),
        metrics=[keras.metrics.CategoricalAccuracy(), keras.metrics.AUC(name="auc")],
    )


def test_evaluate_seven_examples_batch_four_equals_keras(all_devices):
    x, y = _data(7)
    reference, _, model = twin(lambda: mlp(hidden=16, din=12, classes=5), all_devices)
    _compile(reference)
    _compile(model)
    expected = reference.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    got = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    assert set(got) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_predict_returns_every_row_in_order(all_devices):
    x, _ = _data(11, seed=1)
    reference, _, model = twin(lambda: mlp(hidden=16, din=12, classes=5), all_devices)
    _compile(model)
    got = model.predict(x, batch_size=4, verbose=0)
    assert got.shape == (11, 5)
    np.testing.assert_allclose(got, reference.predict(x, batch_size=4, verbose=0), atol=1e-6)
