"""Stateful NNX layers in fit / evaluate / predict: BatchNorm, Dropout, counters, modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_data
from flax import nnx

import phalanx

pytestmark = pytest.mark.multidevice


class Calls(nnx.Variable):
    """A user counter: how many training calls the module has made."""


class BNDropNet(nnx.Module):
    """Linear -> BatchNorm -> relu -> Dropout -> Linear, counting its training calls."""

    def __init__(self, rngs: nnx.Rngs, rate: float = 0.5):
        self.l1 = nnx.Linear(12, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, momentum=0.5, rngs=rngs)
        self.drop = nnx.Dropout(rate, rngs=rngs)
        self.l2 = nnx.Linear(16, 5, rngs=rngs)
        self.calls = Calls(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        if not self.bn.use_running_average:
            self.calls[...] += 1
        return self.l2(self.drop(jax.nn.relu(self.bn(self.l1(x)))))


def _model(strategy, rate=0.5, optimizer="sgd"):
    with strategy.scope():
        model = phalanx.Model(BNDropNet(nnx.Rngs(0), rate))
        model.compile(
            optimizer=optimizer,
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


def test_batchnorm_statistics_ignore_the_padding_of_a_partial_batch():
    strategy = phalanx.Strategy()
    x, y = make_data(10)
    padded, exact = _model(strategy, rate=0.0), _model(strategy, rate=0.0)
    padded.fit(x, y, batch_size=8 * strategy.num_replicas_in_sync, epochs=1, verbose=0)
    exact.fit(x, y, batch_size=10, epochs=1, verbose=0, shuffle=False)
    for name in ("mean", "var"):
        got = np.asarray(getattr(padded.module.bn, name)[...])
        want = np.asarray(getattr(exact.module.bn, name)[...])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # ... and they are the statistics of the 10 real rows, by hand (momentum 0.5 from 0 and 1)
    fresh = _model(strategy, rate=0.0)
    kernel, bias = np.asarray(fresh.module.l1.kernel[...]), np.asarray(fresh.module.l1.bias[...])
    fresh.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    h = x @ kernel + bias
    np.testing.assert_allclose(fresh.module.bn.mean[...], 0.5 * h.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fresh.module.bn.var[...], 0.5 + 0.5 * h.var(0), rtol=1e-4, atol=1e-5)


def test_replicas_draw_the_one_device_dropout_masks_and_batch_statistics():
    x, y = make_data(45, seed=1)
    histories, modules = [], []
    for devices in (jax.devices()[:1], jax.devices()):
        model = _model(phalanx.Strategy(devices=devices))
        histories.append(model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0))
        modules.append(model.module)
    np.testing.assert_allclose(
        histories[0].history["loss"], histories[1].history["loss"], rtol=1e-5
    )
    for a, b in zip(
        jax.tree.leaves(nnx.state(modules[0])), jax.tree.leaves(nnx.state(modules[1])), strict=True
    ):
        if jnp.issubdtype(a.dtype, jnp.floating):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_dropout_draws_new_masks_every_step_and_inference_is_deterministic():
    strategy = phalanx.Strategy()
    model = _model(strategy, optimizer=phalanx.optimizers.get("sgd", learning_rate=0.0))
    x, y = make_data(32, seed=2)
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    first, second = history.history["loss"]
    assert first != second  # same weights, same batch: only the masks changed
    assert model.evaluate(x, y, batch_size=8, verbose=0) == model.evaluate(
        x, y, batch_size=8, verbose=0
    )
    np.testing.assert_array_equal(
        model.predict(x, batch_size=8, verbose=0), model.predict(x, batch_size=8, verbose=0)
    )


def test_predict_uses_running_averages_and_no_dropout():
    strategy = phalanx.Strategy()
    model = _model(strategy)
    x, y = make_data(24, seed=3)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    m = model.module
    h = x @ np.asarray(m.l1.kernel[...]) + np.asarray(m.l1.bias[...])
    bn = m.bn
    h = (h - np.asarray(bn.mean[...])) / np.sqrt(np.asarray(bn.var[...]) + bn.epsilon)
    h = np.maximum(h * np.asarray(bn.scale[...]) + np.asarray(bn.bias[...]), 0)
    want = h @ np.asarray(m.l2.kernel[...]) + np.asarray(m.l2.bias[...])
    np.testing.assert_allclose(model.predict(x, batch_size=7, verbose=0), want, atol=1e-4)


def test_rng_and_user_state_are_carried_through_steps_and_checkpoints(tmp_path):
    strategy = phalanx.Strategy()
    x, y = make_data(40, seed=4)
    model = _model(strategy)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert int(model.module.calls[...]) == 5  # one per training step, never in inference
    model.evaluate(x, y, batch_size=8, verbose=0)
    assert int(model.module.calls[...]) == 5
    initial = int(BNDropNet(nnx.Rngs(0)).drop.rngs.count[...])
    assert int(model.module.drop.rngs.count[...]) == initial + 5  # a fresh draw every step

    # A resumed run continues bitwise: the RNG counters and the counter are in the checkpoint.
    ckpt = tmp_path / "ckpt"
    saver = phalanx.callbacks.ModelCheckpoint(str(ckpt), monitor="loss")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[saver])
    continued = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    restored = _model(strategy)
    restored.load_checkpoint(str(ckpt))
    assert int(restored.module.calls[...]) == 10
    again = restored.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert again.history["loss"] == continued.history["loss"]
    for a, b in zip(restored.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
