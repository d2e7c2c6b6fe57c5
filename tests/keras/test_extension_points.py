"""Keras's extension points and metric rules through phalanx.Model: `model.losses`,
overridden steps refused, custom compile arguments, `metrics` vs `weighted_metrics` with
`sample_weight` and `class_weight`."""

import keras
import numpy as np
import pytest
from keras_models import regularized_dense, same_initial_state

import phalanx


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    return x, (np.abs(x[:, :4]).argmax(1)).astype(np.int32)


def _mlp():
    return keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
    )


def _arguments():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        weighted_metrics=[
            "accuracy",
            keras.metrics.SparseCategoricalCrossentropy(from_logits=True),
        ],
    )


@pytest.mark.parametrize("weighting", ["sample_weight", "class_weight"])
def test_metrics_and_weighted_metrics_follow_keras(all_devices, weighting):
    x, y = _data()
    if weighting == "sample_weight":
        weights = {"sample_weight": np.linspace(0.0, 2.0, len(x)).astype(np.float32)}
    else:
        weights = {"class_weight": {0: 0.2, 1: 3.0, 2: 1.0, 3: 0.5}}
    keras.utils.set_random_seed(0)
    reference = _mlp()
    with all_devices.scope():
        model = phalanx.Model(_mlp())
    same_initial_state(model.module, reference)
    reference.compile(**_arguments())
    model.compile(**_arguments())
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    expected = reference.fit(x, y, **weights, **fit).history
    history = model.fit(x, y, **weights, **fit).history
    assert {"accuracy", "weighted_accuracy", "sparse_categorical_crossentropy"} <= set(history)
    for key, values in expected.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
    # The rule itself: the unweighted accuracy is not the weighted one.
    assert history["accuracy"] != history["weighted_accuracy"]


def test_model_losses_are_kerass_and_training_adds_them(all_devices):
    keras.utils.set_random_seed(0)
    with all_devices.scope():
        net = regularized_dense()
        model = phalanx.Model(net)
    assert [float(v) for v in model.losses] == pytest.approx([float(v) for v in net.losses])
    assert len(model.losses) == 3  # kernel and bias of the first Dense, kernel of the second
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    x, y = _data()
    before = sum(float(v) for v in model.losses)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert sum(float(v) for v in model.losses) != pytest.approx(before)
    assert [float(v) for v in model.losses] == pytest.approx([float(v) for v in net.losses])


class _OwnTrainStep(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(4)

    def call(self, x):
        return self.dense(x)

    def train_step(self, state, data):
        raise AssertionError("never run")


class _OwnTestStep(_OwnTrainStep):
    train_step = keras.Model.train_step

    def test_step(self, state, data):
        raise AssertionError("never run")


@pytest.mark.parametrize(
    ("cls", "method"), [(_OwnTrainStep, "train_step"), (_OwnTestStep, "test_step")]
)
def test_an_overridden_step_is_refused_naming_it_and_the_alternative(all_devices, cls, method):
    net = cls()
    net(np.zeros((1, 12), np.float32))
    with (
        all_devices.scope(),
        pytest.raises(TypeError, match=f"overrides keras.Model.{method}") as e,
    ):
        phalanx.Model(net)
    assert "compute_loss" in str(e.value) and "Keras's own model." in str(e.value)


def test_custom_compile_arguments_need_a_compile_that_takes_them(all_devices):
    with all_devices.scope():
        model = phalanx.Model(_mlp())
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['alpha'\]"):
        model.compile(optimizer="sgd", loss="mse", alpha=0.5)
    with pytest.raises(TypeError, match=r"compile\(extra_losses=\.\.\.\) is for Flax NNX"):
        model.compile(optimizer="sgd", loss="mse", extra_losses=lambda m: 0.0)
