"""fit's validation_split and class_weight, checked against Keras's own helpers and against
the explicit equivalent (validation_data=, sample_weight=)."""

import os

import numpy as np
import pytest
from conftest import build, make_data

from phalanx._src.train.api import fit_options

# keras is imported at collection (its import sets environment variables of its own).
os.environ.setdefault("KERAS_BACKEND", "jax")
pytest.importorskip("keras")
from keras.src.trainers.data_adapters import array_slicing, data_adapter_utils


@pytest.mark.parametrize("fraction", [0.2, 0.33])
def test_validation_split_matches_keras(fraction):
    x, y = make_data(23)
    sw = np.linspace(0.5, 1.5, 23).astype(np.float32)
    ours = fit_options.validation_split({"f": x}, y, sw, fraction)
    theirs = array_slicing.train_validation_split(({"f": x}, y, sw), validation_split=fraction)
    for mine, keras_part in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine[0]["f"], np.asarray(keras_part[0]["f"]))
        np.testing.assert_array_equal(mine[1], np.asarray(keras_part[1]))
        np.testing.assert_array_equal(mine[2], np.asarray(keras_part[2]))


@pytest.mark.parametrize("one_hot", [False, True])
def test_class_weights_match_keras(one_hot):
    _, y = make_data(40)
    labels = np.eye(5, dtype=np.float32)[y] if one_hot else y[:, None]
    class_weight = {0: 0.5, 2: 3.0, 4: 1.5}  # 1 and 3 unlisted: 1.0
    expected = data_adapter_utils.class_weight_to_sample_weights(labels, class_weight)
    np.testing.assert_allclose(fit_options.class_weights(labels, class_weight, None), expected)
    sw = np.full(40, 2.0, np.float32)  # multiplied in, as tf.keras did
    np.testing.assert_allclose(
        fit_options.class_weights(labels, class_weight, sw), 2.0 * np.asarray(expected)
    )


def test_fit_with_validation_split_equals_explicit_validation_data(one_device):
    x, y = make_data(40)
    a, b = build(one_device, seed=3), build(one_device, seed=3)
    ha = a.fit(x, y, batch_size=8, epochs=2, shuffle=False, validation_split=0.25, verbose=0)
    hb = b.fit(
        x[:30],
        y[:30],
        batch_size=8,
        epochs=2,
        shuffle=False,
        validation_data=(x[30:], y[30:]),
        verbose=0,
    )
    for key in ("loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(ha.history[key], hb.history[key], rtol=1e-6)


def test_fit_with_class_weight_equals_sample_weight(one_device):
    x, y = make_data(32)
    class_weight = {0: 2.0, 3: 0.25}
    sw = np.array([class_weight.get(int(c), 1.0) for c in y], np.float32)
    a, b = build(one_device, seed=4), build(one_device, seed=4)
    ha = a.fit(x, y, batch_size=8, epochs=1, shuffle=False, class_weight=class_weight, verbose=0)
    hb = b.fit(x, y, batch_size=8, epochs=1, shuffle=False, sample_weight=sw, verbose=0)
    np.testing.assert_allclose(ha.history["loss"], hb.history["loss"], rtol=1e-6)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=1e-6)


def test_errors_for_datasets_and_bad_values(one_device):
    import phalanx

    x, y = make_data(16)
    model = build(one_device)
    dataset = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with pytest.raises(ValueError, match="validation_split is only supported for NumPy"):
        model.fit(dataset, validation_split=0.2, verbose=0)
    with pytest.raises(ValueError, match="class_weight needs the labels y"):
        model.fit(dataset, class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match=r"validation_split must be a float in \(0, 1\)"):
        model.fit(x, y, validation_split=1.5, verbose=0)
    with pytest.raises(ValueError, match="too few to hold out"):
        model.fit(x[:1], y[:1], validation_split=0.5, verbose=0)


def test_prefetch_autotune_trains_as_the_thread_and_the_loop_thread_do(one_device):
    """fit(prefetch=AUTOTUNE) on a host pipeline (a Python map, not device-resident): the
    numbers equal prefetch=2's and prefetch=0's, over epochs (one decision per call)."""
    import phalanx

    x, y = make_data(96)

    def pipeline():
        ds = phalanx.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 0.5, b))
        return ds.batch(8)

    histories, weights = [], []
    for prefetch in (phalanx.data.AUTOTUNE, 2, 0):
        model = build(one_device, seed=5)
        history = model.fit(pipeline(), epochs=3, prefetch=prefetch, device_data=False, verbose=0)
        histories.append(history.history["loss"])
        weights.append(model.get_weights())
    for other, other_weights in zip(histories[1:], weights[1:], strict=True):
        np.testing.assert_allclose(histories[0], other, rtol=1e-6)
        for a, b in zip(weights[0], other_weights, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)
