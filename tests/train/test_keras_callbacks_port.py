"""ReduceLROnPlateau and LambdaCallback against Keras 3's own callbacks, on scripted logs."""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx import callbacks

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")

# A loss that falls, stalls within min_delta, bumps, falls again and stalls for good.
LOSSES = [1.0, 0.8, 0.79995, 0.81, 0.8, 0.7, 0.7, 0.7, 0.71, 0.69, 0.69, 0.69, 0.69, 0.69, 0.69]
ACCURACIES = [0.5, 0.6, 0.6, 0.61, 0.6, 0.59, 0.7, 0.7, 0.7, 0.7, 0.7]


class _LRModel:
    def __init__(self, learning_rate):
        self.learning_rate = learning_rate
        self.stop_training = False
        self.metrics = []


def _keras_schedule(values, monitor, **kwargs):
    optimizer = types.SimpleNamespace(learning_rate=0.1)
    model = types.SimpleNamespace(optimizer=optimizer, metrics=[], stop_training=False)
    cb = keras.callbacks.ReduceLROnPlateau(monitor=monitor, **kwargs)
    cb.set_model(model)
    cb.on_train_begin()
    rates = []
    for epoch, value in enumerate(values):
        cb.on_epoch_end(epoch, {monitor: value})
        rates.append(float(optimizer.learning_rate))
    return rates


def _phalanx_schedule(values, monitor, **kwargs):
    model = _LRModel(0.1)
    cb = callbacks.ReduceLROnPlateau(monitor=monitor, **kwargs)
    cb.set_model(model)
    cb.on_train_begin()
    rates = []
    for epoch, value in enumerate(values):
        logs = {monitor: value}
        cb.on_epoch_end(epoch, logs)
        assert logs["learning_rate"] == pytest.approx(rates[-1] if rates else 0.1)
        rates.append(model.learning_rate)
    return rates


@pytest.mark.parametrize(
    ("values", "monitor", "kwargs"),
    [
        (LOSSES, "val_loss", dict(patience=2)),
        (LOSSES, "val_loss", dict(patience=1, factor=0.5, cooldown=2)),
        (LOSSES, "loss", dict(patience=1, factor=0.2, min_lr=0.005, min_delta=0.0)),
        (LOSSES, "val_loss", dict(patience=0, factor=0.5, min_delta=0.02, cooldown=1)),
        (ACCURACIES, "val_accuracy", dict(patience=1, factor=0.5, mode="max")),
        (ACCURACIES, "val_accuracy", dict(patience=2, factor=0.3, mode="min", min_lr=0.01)),
    ],
)
def test_reduce_lr_on_plateau_matches_keras(values, monitor, kwargs):
    expected = _keras_schedule(values, monitor, **kwargs)
    assert len(set(expected)) > 1, "the script must make Keras reduce at least once"
    np.testing.assert_allclose(_phalanx_schedule(values, monitor, **kwargs), expected, rtol=1e-12)


def test_reduce_lr_on_plateau_errors_and_verbose(capsys):
    with pytest.raises(ValueError, match=r"factor >= 1\.0"):
        callbacks.ReduceLROnPlateau(factor=1.5)
    with pytest.raises(ValueError, match="mode must be one of"):
        callbacks.ReduceLROnPlateau(mode="up")
    cb = callbacks.ReduceLROnPlateau(monitor="loss", patience=0, verbose=1)
    cb.set_model(_LRModel(0.1))
    cb.on_epoch_end(0, {"loss": 1.0})
    cb.on_epoch_end(1, {"loss": 1.0})
    assert "Epoch 2: ReduceLROnPlateau reducing learning rate to 0.01" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="'loss', which is not in the logs"):
        cb.on_epoch_end(2, {"accuracy": 1.0})


def test_lambda_callback_calls_only_the_hooks_it_is_given():
    calls = []
    cb = callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: calls.append(("epoch_end", epoch, logs["loss"])),
        on_train_begin=lambda logs: calls.append(("train_begin",)),
        on_train_batch_end=lambda batch, logs: calls.append(("batch_end", batch)),
        on_test_begin=lambda logs: calls.append(("test_begin",)),
    )
    assert cb.implements("on_epoch_end") and cb.implements("on_test_begin")
    assert cb.uses_batch_hooks("train") and not cb.uses_batch_hooks("test")
    assert not cb.implements("on_epoch_begin")
    cbl = callbacks.CallbackList([cb], model=_LRModel(0.1), epochs=1, steps=2, verbose=0)
    cbl.on_train_begin()
    cbl.on_epoch_begin(0)
    for batch in range(2):
        cbl.on_train_batch_begin(batch)
        cbl.on_train_batch_end(batch, {"loss": 1.0})
    cbl.on_test_begin()
    cbl.on_epoch_end(0, {"loss": 0.5})
    assert calls == [
        ("train_begin",),
        ("batch_end", 0),
        ("batch_end", 1),
        ("test_begin",),
        ("epoch_end", 0, 0.5),
    ]


def test_lambda_callback_keras_batch_alias_and_errors():
    seen = []
    cb = callbacks.LambdaCallback(on_batch_end=lambda batch, logs: seen.append(batch))
    assert cb.uses_batch_hooks("train")
    cb.on_train_batch_end(3, {})
    assert seen == [3]
    with pytest.raises(TypeError, match=r"unknown hooks \['on_epoch_finish'\]"):
        callbacks.LambdaCallback(on_epoch_finish=print)
    with pytest.raises(TypeError, match="needs a function"):
        callbacks.LambdaCallback(on_epoch_end=3)


def test_reduce_lr_on_plateau_in_fit_sets_the_models_learning_rate():
    x = np.linspace(-1, 1, 32, dtype=np.float32)[:, None]
    y = 3 * x
    with phalanx.Strategy().scope():
        model = phalanx.Model(nnx.Linear(1, 1, rngs=nnx.Rngs(0)))
        model.compile(optimizer=phalanx.optimizers.get("sgd", learning_rate=0.1), loss="mse")
    # A min_delta no epoch can beat: every epoch after the first is a plateau.
    cb = callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=1e9)
    history = model.fit(x, y, batch_size=16, epochs=3, callbacks=[cb], verbose=0)
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.1, 0.05])
    assert model.learning_rate == pytest.approx(0.025)
