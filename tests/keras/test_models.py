"""Sequential, Functional and subclassed Keras models; BatchNormalization and Dropout."""

import keras
import numpy as np
import pytest
from keras_models import twin

import phalanx


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    return x, (np.abs(x[:, :5]).argmax(1)).astype(np.int32)


def sequential():
    return keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(5)]
    )


def functional():
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    skip = keras.layers.Concatenate()([hidden, inputs])
    return keras.Model(inputs, keras.layers.Dense(5)(skip))


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(5)

    def call(self, x):
        return self.out(self.hidden(x))


def subclassed():
    model = Subclassed()
    model(np.zeros((1, 12), np.float32))  # builds the variables
    return model


def _compile(model, optimizer="sgd"):
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


@pytest.mark.parametrize("build", [sequential, functional, subclassed])
def test_model_kinds_train_as_keras_does(all_devices, build):
    x, y = _data(48)
    reference, mine, model = twin(build, all_devices)
    _compile(reference)
    _compile(model)
    expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(history.history[key], expected.history[key], atol=1e-5)
    for a, b in zip(mine.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def batch_norm_net(dropout=0.0):
    layers = [keras.Input((12,)), keras.layers.Dense(16), keras.layers.BatchNormalization()]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    return keras.Sequential([*layers, keras.layers.Dense(5)])


def test_batch_norm_statistics_of_partial_batches_equal_keras(all_devices):
    """10 examples in batches of 4: the last batch's 2 rows are padded to a full global
    batch; the padded rows stay out of the batch statistics, so the moving mean and
    variance equal Keras's, which sees a batch of 2."""
    x, y = _data(10)
    reference, mine, model = twin(batch_norm_net, all_devices)
    _compile(reference)
    _compile(model)
    expected = reference.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], atol=1e-5)
    for a, b in zip(mine.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_batch_norm_and_dropout_train_and_evaluate_deterministically(all_devices):
    x, y = _data(40)
    runs = []
    for _ in range(2):
        _, mine, model = twin(lambda: batch_norm_net(dropout=0.5), all_devices)
        _compile(model, optimizer="adam")
        seeds = [np.array(v.value) for v in mine.non_trainable_variables if "seed" in v.path]
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        scores = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
        assert scores == model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
        advanced = [np.array(v.value) for v in mine.non_trainable_variables if "seed" in v.path]
        assert seeds and not np.array_equal(seeds[0], advanced[0])  # dropout drew new masks
        runs.append((history.history["loss"], scores, mine.get_weights()))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
    for a, b in zip(runs[0][2], runs[1][2], strict=True):
        np.testing.assert_array_equal(a, b)


def test_phalanx_mixed_bfloat16_computes_in_bfloat16_and_keeps_float32_variables(all_devices):
    x, y = _data(32)
    _, mine, model = twin(batch_norm_net, all_devices)
    _compile(model)
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        precision="mixed_bfloat16",
    )
    params, state = model.adapter.variables()
    outputs, _ = model.adapter.apply(params, state, x, training=True, mask=np.ones(32, np.float32))
    assert outputs.dtype == np.dtype("bfloat16")
    assert all(layer.dtype_policy.name == "float32" for layer in mine.layers)  # restored
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert all(w.dtype == np.float32 for w in mine.get_weights())


def test_kerass_own_mixed_precision_policy_is_honoured(all_devices):
    keras.config.set_dtype_policy("mixed_bfloat16")  # reset by the conftest fixture
    x, y = _data(32)
    _, _, model = twin(batch_norm_net, all_devices)
    _compile(model)
    params, state = model.adapter.variables()
    assert all(p.dtype == np.float32 for p in params)
    outputs, _ = model.adapter.apply(params, state, x, training=False, mask=np.ones(32))
    assert outputs.dtype == np.dtype("bfloat16")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_unbuilt_keras_model_is_refused_with_a_hint(all_devices):
    with all_devices.scope(), pytest.raises(ValueError, match="build it before"):
        phalanx.Model(Subclassed())
