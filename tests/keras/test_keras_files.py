"""Keras's files from phalanx.Model: `save_weights` / `load_weights` / `save` and
`ModelCheckpoint` with Keras's signature write what plain Keras reads; NNX models keep
phalanx's format and say so; nothing phalanx did not write is touched."""

import jax
import keras
import numpy as np
import pytest
from flax import nnx
from keras_models import mlp

import phalanx


def _data(n=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    return x, (np.abs(x[:, :5]).argmax(1)).astype(np.int32)


def _model(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = phalanx.Model(mlp(hidden=8, din=12, classes=5))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["acc"])
    return model


def _same(a, b):
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)


def test_save_weights_and_save_are_read_by_plain_keras(all_devices, tmp_path):
    x, y = _data()
    model = _model(all_devices)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.save_weights(tmp_path / "w.weights.h5")
    model.save(tmp_path / "m.keras")
    plain = mlp(hidden=8, din=12, classes=5)
    plain.load_weights(tmp_path / "w.weights.h5")
    _same(plain.get_weights(), model.get_weights())
    loaded = keras.models.load_model(tmp_path / "m.keras")
    _same(loaded.get_weights(), model.get_weights())
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x), atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.keras", "w.weights.h5"]

    fresh = _model(all_devices)  # other weights until loaded; then trains on from them
    fresh.load_weights(tmp_path / "w.weights.h5")
    _same(fresh.get_weights(), model.get_weights())
    assert fresh.evaluate(x, y, verbose=0) == model.evaluate(x, y, verbose=0)


def test_kerass_own_file_rules_are_kept(all_devices, tmp_path):
    model = _model(all_devices)
    with pytest.raises(ValueError, match=r"must end in '.weights.h5'"):
        model.save_weights(tmp_path / "w.h5x")
    with pytest.raises(ValueError, match=r"saved as a '.keras' file"):
        model.save(tmp_path / "model")
    with pytest.raises(ValueError, match="save_weights_only=True"):
        phalanx.callbacks.ModelCheckpoint(tmp_path / "ckpt_{epoch}", save_weights_only=True)
    with pytest.raises(ValueError, match="names a weights file"):
        phalanx.callbacks.ModelCheckpoint(tmp_path / "ckpt.weights.h5")
    assert list(tmp_path.iterdir()) == []


def test_model_checkpoint_with_kerass_signature(all_devices, tmp_path):
    x, y = _data()
    model = _model(all_devices)
    (tmp_path / "notes.txt").write_text("the user's own file")
    callbacks = [
        phalanx.callbacks.ModelCheckpoint(
            filepath=str(tmp_path / "ckpt_{epoch:02d}.weights.h5"), save_weights_only=True
        ),
        phalanx.callbacks.ModelCheckpoint(
            str(tmp_path / "best.keras"), monitor="loss", mode="min", save_best_only=True
        ),
    ]
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=callbacks)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "best.keras",
        "ckpt_01.weights.h5",
        "ckpt_02.weights.h5",
        "ckpt_03.weights.h5",
        "notes.txt",
    ]
    plain = mlp(hidden=8, din=12, classes=5)
    plain.load_weights(tmp_path / "ckpt_03.weights.h5")
    _same(plain.get_weights(), model.get_weights())
    assert history.history["loss"][-1] == min(history.history["loss"])  # so best = last
    _same(keras.models.load_model(tmp_path / "best.keras").get_weights(), model.get_weights())


class _Net(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(12, 5, rngs=rngs)

    def __call__(self, x):
        return self.linear(x)


def test_nnx_models_keep_phalanxs_format_and_refuse_keras_names(all_devices, tmp_path):
    x, y = _data()
    with all_devices.scope():
        model = phalanx.Model(_Net(nnx.Rngs(0)))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    for call in (model.save_weights, model.save, model.load_weights):
        with pytest.raises(ValueError, match="Flax NNX module, which keeps phalanx's checkpoint"):
            call(tmp_path / "w.weights.h5")
    with pytest.raises(ValueError, match="keeps phalanx's checkpoint format"):
        model.fit(
            x,
            y,
            epochs=1,
            verbose=0,
            callbacks=[phalanx.callbacks.ModelCheckpoint(tmp_path / "m.keras")],
        )
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    saved = model.get_weights()
    model.save_weights(tmp_path / "weights")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    optimizer = [np.asarray(v) for v in jax.tree.leaves(model.engine.state["opt"])]
    model.load_weights(tmp_path / "weights")
    _same(model.get_weights(), saved)
    # The optimizer's state is left as it is (Keras's load_weights), not the saved one.
    _same([np.asarray(v) for v in jax.tree.leaves(model.engine.state["opt"])], optimizer)
    assert [p.name for p in tmp_path.iterdir()] == ["weights"]
