"""Mistakes that once gave a wrong number without a word now raise, naming what was received,
before anything compiles, or give the right number (issue 22, item 3)."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import MLP, build, make_data
from flax import nnx

import phalanx


class _Batches:
    """A plain iterable of host batches (not an in-memory Dataset): checked batch by batch."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


# ---- labels ----------------------------------------------------------------------------------
def test_evaluate_without_labels_names_the_data_and_how_to_pass_labels(one_device):
    model = build(one_device)
    x, y = make_data(16)
    with pytest.raises(ValueError, match=r"evaluate's data has no labels") as info:
        model.evaluate(x, batch_size=8)
    message = str(info.value)
    assert "(16, 12) float32" in message  # what was received
    assert "'sparse_categorical_crossentropy'" in message  # who needs the labels
    assert "model.evaluate(x, y" in message and "model.predict(x)" in message
    in_memory = phalanx.data.Dataset.from_tensor_slices(x).batch(8)
    with pytest.raises(ValueError, match=r"evaluate's data has no labels"):
        model.evaluate(in_memory)
    with pytest.raises(ValueError, match=r"evaluate's data has no labels.*\(8, 12\) float32"):
        model.evaluate(_Batches([x[:8], x[8:]]))
    assert model.evaluate(x, y, batch_size=8)[0] > 0.0  # with labels: a real loss


def test_validation_without_labels_fails_before_training(one_device):
    model = build(one_device)
    x, y = make_data(16)
    with pytest.raises(ValueError, match=r"validation_data has no labels.*\(4, 12\)") as info:
        model.fit(x, y, batch_size=8, validation_data=(x[:4],), verbose=0)
    assert "validation_data=(x_val, y_val)" in str(info.value)
    assert model.train_step_count == 0
    # A dataset of x alone: refused at its first batch, before the test step is compiled.
    with pytest.raises(ValueError, match=r"validation_data has no labels.*\(4, 12\)"):
        model.fit(x, y, batch_size=8, validation_data=_Batches([x[:4]]), verbose=0)


def test_fit_without_labels_or_with_weights_but_no_labels(one_device):
    model = build(one_device)
    x, _ = make_data(16)
    with pytest.raises(ValueError, match=r"fit's data has no labels.*\(16, 12\)"):
        model.fit(x, batch_size=8, verbose=0)
    with pytest.raises(ValueError, match=r"sample_weight was given without labels.*\(16,\)"):
        model.fit(x, sample_weight=np.ones(16, np.float32), batch_size=8, verbose=0)
    assert model.train_step_count == 0


# ---- a loss that averages the batch itself ---------------------------------------------------
def _batch_mean_loss(y_true, y_pred):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(y_pred, y_true))


def _per_example_loss(y_true, y_pred):
    return optax.softmax_cross_entropy_with_integer_labels(y_pred, y_true)


def _compiled(strategy, loss):
    with strategy.scope():
        model = phalanx.Model(MLP(nnx.Rngs(0)))
        model.compile(optimizer="sgd", loss=loss)
    return model


def test_a_loss_returning_the_batch_mean_is_refused(one_device):
    model = _compiled(one_device, _batch_mean_loss)
    x, y = make_data(12)
    with pytest.raises(
        ValueError, match=r"'_batch_mean_loss' returned shape \(\) for a batch of 8"
    ):
        model.evaluate(x, y, batch_size=8)
    with pytest.raises(ValueError, match=r"one value per example, shape \(8,\).*reduction='none'"):
        model.fit(x, y, batch_size=8, verbose=0)
    assert model.train_step_count == 0
    shaped = _compiled(one_device, lambda t, p: _per_example_loss(t, p)[:1])
    with pytest.raises(ValueError, match=r"returned shape \(1,\) for a batch of 8"):
        shaped.evaluate(x, y, batch_size=8)


def test_a_per_example_loss_is_exact_on_a_partial_last_batch(one_device):
    model = _compiled(one_device, _per_example_loss)
    x, y = make_data(12)  # batches of 8 and 4: the last one is padded
    expected = np.mean(np.asarray(_per_example_loss(y, model.predict(x, batch_size=12))))
    assert model.evaluate(x, y, batch_size=8) == pytest.approx(float(expected), rel=1e-5)


# ---- step counts -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps_per_epoch": 0}, r"steps_per_epoch must be an int >= 1.*got 0"),
        ({"steps_per_epoch": -2}, r"steps_per_epoch must be an int >= 1.*got -2"),
        ({"validation_steps": 0}, r"validation_steps must be an int >= 1.*got 0"),
        ({"validation_freq": 0}, r"validation_freq must be an int >= 1.*got 0"),
    ],
)
def test_zero_step_counts_are_refused(one_device, kwargs, match):
    model = build(one_device)
    x, y = make_data(16)
    with pytest.raises(ValueError, match=match):
        model.fit(x, y, batch_size=8, validation_data=(x, y), verbose=0, **kwargs)
    assert model.train_step_count == 0


def test_evaluate_with_zero_steps_is_refused(one_device):
    model = build(one_device)
    x, y = make_data(16)
    with pytest.raises(ValueError, match=r"steps must be an int >= 1.*got 0"):
        model.evaluate(x, y, batch_size=8, steps=0)


# ---- a model used under another strategy -----------------------------------------------------
def _needs_two_devices():
    if jax.device_count() < 2:
        pytest.skip("needs a strategy with more devices than the default one")


@pytest.mark.multidevice
def test_model_built_outside_scope_is_refused_inside_another_scope(all_devices):
    _needs_two_devices()
    x, y = make_data(16)
    model = phalanx.Model(MLP(nnx.Rngs(0)))  # no scope: the default one-device strategy
    model.compile(optimizer="sgd", loss=_per_example_loss)
    n = all_devices.num_replicas_in_sync
    with all_devices.scope():
        with pytest.raises(ValueError, match=rf"fit\(\) was called inside the scope of .*{n}") as e:
            model.fit(x, y, batch_size=8, verbose=0)
        assert "outside any scope(), so on the default one-device strategy" in str(e.value)
        assert "num_replicas_in_sync=1" in str(e.value)
        with pytest.raises(ValueError, match=r"model\.evaluate\(\) was called inside"):
            model.evaluate(x, y, batch_size=8)
        with pytest.raises(ValueError, match=r"model\.predict\(\) was called inside"):
            model.predict(x, batch_size=8)
        with pytest.raises(ValueError, match=r"model\.compile\(\) was called inside"):
            model.compile(optimizer="sgd", loss=_per_example_loss)
    assert model.train_step_count == 0
    model.fit(x, y, batch_size=8, verbose=0)  # no scope, no scope: its own strategy
    assert model.train_step_count == 2


@pytest.mark.multidevice
def test_model_of_one_scope_runs_in_it_or_in_none_but_not_in_another(one_device, all_devices):
    _needs_two_devices()
    x, y = make_data(16)
    model = build(all_devices)
    model.fit(x, y, batch_size=8, verbose=0)  # built in a scope, fit with none: its own
    with all_devices.scope():
        model.fit(x, y, batch_size=8, verbose=0)
    with phalanx.Strategy(devices=all_devices.devices).scope():  # the same devices
        model.evaluate(x, y, batch_size=8)
    wrong = pytest.raises(ValueError, match=r"fit\(\) was called inside .*with strategy=")
    with one_device.scope(), wrong:
        model.fit(x, y, batch_size=8, verbose=0)
    assert model.train_step_count == 4


# ---- examples_per_second measures finished work ----------------------------------------------
@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_epoch_time_ends_when_its_work_is_done(one_device, steps_per_execution):
    """The logs of an epoch's last call are ready only once all its calls ran; a device that
    takes 0.3 s longer than dispatch must show in examples_per_second."""
    model = build(one_device, steps_per_execution=steps_per_execution)
    x, y = make_data(32)
    model.fit(x, y, batch_size=8, verbose=0)  # compiled: the next epoch is steady state
    engine = model.engine
    fetch = engine.fetch_logs

    def slow_device(values=None):
        time.sleep(0.3)  # the queued calls still running when the host stops dispatching
        return fetch(values)

    engine.fetch_logs = slow_device
    try:
        history = model.fit(x, y, batch_size=8, verbose=0)
    finally:
        del engine.fetch_logs
    rate = history.history["examples_per_second"][-1]
    assert 0 < rate <= 32 / 0.3
