"""Precision policies in fit, and BackupAndRestore's resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import MLP, build, make_data
from flax import nnx

import phalanx
from phalanx._src.train.api import precision


def test_mixed_float16_skips_a_non_finite_step_and_halves_the_scale(all_devices):
    model = build(all_devices, optimizer="adam", precision="mixed_float16")
    assert float(precision.current_loss_scale(model.engine.state["opt"])) == 2.0**15
    x, y = make_data(16)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    weights = model.get_weights()
    opt_before = jax.tree.map(np.asarray, model.engine.state["opt"])
    bad = x.copy()
    bad[3, 0] = np.inf
    model.fit(bad, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert float(precision.current_loss_scale(model.engine.state["opt"])) == 2.0**14
    for a, b in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(a, b)
    inner_now = jax.tree.leaves(model.engine.state["opt"].inner_state)
    inner_before = jax.tree.leaves(opt_before.inner_state)
    for a, b in zip(inner_now, inner_before, strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert not all(np.array_equal(a, b) for a, b in zip(model.get_weights(), weights, strict=True))


def test_mixed_bfloat16_computes_in_bf16_and_keeps_float32_params(all_devices):
    seen = []

    class Probe(MLP):
        def __call__(self, x):
            seen.append((x.dtype, self.l1.kernel[...].dtype))
            return super().__call__(x)

    with all_devices.scope():
        model = phalanx.Model(Probe(nnx.Rngs(0)))
        model.compile(
            "adam",
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            precision="mixed_bfloat16",
        )
    x, y = make_data(32)
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert (jnp.bfloat16, jnp.bfloat16) in seen
    assert all(w.dtype == np.float32 for w in model.get_weights())
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][-1] < history.history["loss"][0]


class _Interrupt(phalanx.callbacks.Callback):
    def __init__(self, at_epoch):
        super().__init__()
        self.at_epoch = at_epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at_epoch:
            raise RuntimeError("interrupted")


class _Epochs(phalanx.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def test_backup_and_restore_resumes_keras_example(all_devices, tmp_path):
    x, y = make_data(96)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=1).batch(32)
    backup = phalanx.callbacks.BackupAndRestore(tmp_path / "backup")

    model = build(all_devices, optimizer="adam")
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(ds, epochs=10, verbose=0, callbacks=[backup, _Interrupt(4)])
    assert (tmp_path / "backup").exists()

    resumed = build(all_devices, optimizer="adam", seed=7)  # other weights: the backup wins
    epochs = _Epochs()
    history = resumed.fit(ds, epochs=10, verbose=0, callbacks=[backup, epochs])
    assert epochs.epochs == [4, 5, 6, 7, 8, 9]
    assert len(history.history["loss"]) == 6
    assert not (tmp_path / "backup").exists()

    straight = build(all_devices, optimizer="adam")
    ds_again = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=1).batch(32)
    straight.fit(ds_again, epochs=10, verbose=0)
    for a, b in zip(resumed.get_weights(), straight.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_backup_mid_epoch_resumes_exactly(all_devices, tmp_path):
    x, y = make_data(128)

    def dataset():
        return phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(128, seed=2).batch(16)

    class StopAt(phalanx.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                raise KeyboardInterrupt

    backup = phalanx.callbacks.BackupAndRestore(tmp_path / "b", save_freq=2)
    model = build(all_devices, optimizer="sgd")
    with pytest.raises(KeyboardInterrupt):
        model.fit(dataset(), epochs=2, verbose=0, callbacks=[backup, StopAt()])
    resumed = build(all_devices, optimizer="sgd", seed=3)
    resumed.fit(dataset(), epochs=2, verbose=0, callbacks=[backup])
    straight = build(all_devices, optimizer="sgd")
    straight.fit(dataset(), epochs=2, verbose=0)
    for a, b in zip(resumed.get_weights(), straight.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
