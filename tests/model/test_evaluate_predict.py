"""evaluate and predict on data that does not divide evenly: one-device numbers, each once."""

import jax
import numpy as np
import pytest
from conftest import build, make_data

import phalanx

pytestmark = pytest.mark.multidevice


@pytest.fixture
def four():
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices")
    return phalanx.Strategy(devices=jax.devices()[:4])


@pytest.mark.parametrize(("examples", "batch"), [(10, 4), (10, 8), (6, 3)])
def test_uneven_data_on_four_replicas(one_device, four, examples, batch):
    x, y = make_data(examples, seed=examples + batch)
    reference = build(one_device)
    model = build(four)
    want = reference.evaluate(x, y, batch_size=examples, return_dict=True)
    got = model.evaluate(x, y, batch_size=batch, return_dict=True)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    predictions = model.predict(x, batch_size=batch)
    assert predictions.shape == (examples, 5)
    np.testing.assert_allclose(predictions, reference.predict(x, batch_size=examples), atol=1e-6)


def test_predict_keeps_the_output_structure(all_devices):
    x, _ = make_data(13)
    model = build(all_devices)
    out = model.predict(phalanx.data.Dataset.from_tensor_slices(x).batch(5))
    assert out.shape == (13, 5)
    np.testing.assert_allclose(out, np.asarray(model(x)), atol=1e-5)


def test_evaluate_with_sample_weights_matches_keras_rule(one_device, all_devices):
    x, y = make_data(12)
    weights = np.linspace(0.0, 2.0, 12).astype(np.float32)
    one = build(one_device).evaluate(x, y, sample_weight=weights, batch_size=12, return_dict=True)
    many = build(all_devices).evaluate(x, y, sample_weight=weights, batch_size=5, return_dict=True)
    for key in one:
        assert many[key] == pytest.approx(one[key], rel=1e-6)
    logits = np.asarray(build(one_device)(x))
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    per_example = -log_probs[np.arange(12), y]
    assert one["loss"] == pytest.approx(float(np.mean(per_example * weights)), rel=1e-5)
