"""fit on N replicas equals one device; accumulation and steps per execution are exact."""

import jax
import numpy as np
import optax
import pytest
from conftest import build, make_data

import phalanx

pytestmark = pytest.mark.multidevice


def _params(model):
    return [np.asarray(w) for w in model.get_weights()]


def _fit_steps(model, x, y, batch, steps, **kwargs):
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    history = model.fit(ds, epochs=steps, steps_per_epoch=1, verbose=0, **kwargs)
    return history.history["loss"]


def test_fit_on_all_replicas_equals_one_device(one_device, all_devices):
    n = all_devices.num_replicas_in_sync
    batch = 8 * n
    x, y = make_data(batch * 20)
    losses = {}
    params = {}
    for name, strategy in (("one", one_device), ("all", all_devices)):
        model = build(strategy, optimizer=optax.sgd(0.1))
        losses[name] = _fit_steps(model, x, y, batch, steps=20)
        params[name] = _params(model)
    assert len(losses["one"]) == 20
    np.testing.assert_allclose(losses["all"], losses["one"], rtol=1e-4)
    for a, b in zip(params["all"], params["one"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.mean(losses["one"][-5:]) < np.mean(losses["one"][:5])


def test_gradient_accumulation_equals_one_large_step(all_devices):
    x, y = make_data(64)
    big = build(all_devices, optimizer=optax.sgd(0.5))
    _fit_steps(big, x, y, 64, steps=1)
    accumulated = build(all_devices, optimizer=optax.sgd(0.5), gradient_accumulation_steps=4)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(16)
    accumulated.fit(ds, epochs=1, verbose=0)
    for a, b in zip(_params(accumulated), _params(big), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # Three batches are not enough for an update: the weights must not have moved.
    untouched = build(all_devices, optimizer=optax.sgd(0.5), gradient_accumulation_steps=4)
    before = _params(untouched)
    untouched.fit(ds.take(3), epochs=1, verbose=0)
    for a, b in zip(_params(untouched), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_accumulation_weights_examples_not_batches(one_device):
    """A partial batch counts by its examples: the mean over all examples, not of means."""
    x, y = make_data(40)
    big = build(one_device, optimizer=optax.sgd(0.5))
    _fit_steps(big, x, y, 40, steps=1)
    accumulated = build(one_device, optimizer=optax.sgd(0.5), gradient_accumulation_steps=3)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(16)  # 16 + 16 + 8
    accumulated.fit(ds, epochs=1, verbose=0)
    for a, b in zip(_params(accumulated), _params(big), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("k", [8, 3])
def test_steps_per_execution_equals_single_steps_and_compiles_once(all_devices, k):
    n = all_devices.num_replicas_in_sync
    x, y = make_data(4 * n * 10 + 3)  # 10 full batches and a partial one
    single = build(all_devices, optimizer="adam")
    fused = build(all_devices, optimizer="adam", steps_per_execution=k)
    for model in (single, fused):
        model.fit(x, y, batch_size=4 * n, epochs=2, seed=3, verbose=0, validation_data=(x, y))
    np.testing.assert_allclose(
        fused.history.history["loss"], single.history.history["loss"], rtol=1e-5
    )
    np.testing.assert_allclose(
        fused.history.history["val_accuracy"], single.history.history["val_accuracy"]
    )
    for a, b in zip(_params(fused), _params(single), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for phase in ("train", "test"):
        assert fused.engine.cache[(phase, True)]._cache_size() == 1
    # Single training steps compile twice: without the mask for full batches, and with it
    # for the partial last one (Steps.train); evaluation always takes the mask.
    assert single.engine.cache[("train", False)]._cache_size() == 2
    assert single.engine.cache[("test", False)]._cache_size() == 1


def test_evaluate_is_the_one_device_number(one_device, all_devices):
    x, y = make_data(50)
    one = build(one_device)
    all_ = build(all_devices)
    want = one.evaluate(x, y, batch_size=50, return_dict=True)
    got = all_.evaluate(x, y, batch_size=7, return_dict=True)
    assert got.keys() == want.keys() == {"loss", "accuracy"}
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6)
    assert all_.evaluate(x, y, batch_size=7) == pytest.approx([want["loss"], want["accuracy"]])


def test_history_and_callbacks_see_keras_logs(all_devices):
    x, y = make_data(64)
    model = build(all_devices, optimizer="adam")
    seen = []

    class Recorder(phalanx.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((epoch, dict(logs)))

    history = model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        initial_epoch=1,
        verbose=0,
        callbacks=[Recorder()],
        validation_data=(x, y),
    )
    assert [e for e, _ in seen] == [1, 2]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(history.history)
    assert len(history.history["loss"]) == 2
    assert all(isinstance(v, float) for _, logs in seen for v in logs.values())


def test_bad_arguments_fail_before_compiling(all_devices):
    model = build(all_devices)
    x, y = make_data(10)
    with pytest.raises(ValueError, match="steps_per_execution"):
        build(all_devices, steps_per_execution=0)
    with pytest.raises(ValueError, match="rows but"):
        model.fit(x, y[:9], verbose=0)
    with pytest.raises(ValueError, match="batch_size"):
        model.fit(x, y, batch_size=0, verbose=0)
    uncompiled = phalanx.Model(build(all_devices).module)
    with pytest.raises(RuntimeError, match="compile"):
        uncompiled.fit(x, y)
    assert not model.engine.cache.get(("train", False))
    assert jax.device_count() >= 1


def test_auto_steps_per_execution_fits_the_epoch(all_devices):
    n = all_devices.num_replicas_in_sync
    x, y = make_data(4 * n * 6)  # 6 batches an epoch: auto picks K = 6, not 50
    auto = build(all_devices, optimizer="adam", steps_per_execution="auto")
    single = build(all_devices, optimizer="adam")
    for model in (auto, single):
        model.fit(x, y, batch_size=4 * n, epochs=2, seed=1, verbose=0)
    assert auto.engine.steps_per_call(6) == 6 and auto.engine.steps_per_call(None) == 50
    np.testing.assert_allclose(
        auto.history.history["loss"], single.history.history["loss"], rtol=1e-5
    )


def test_the_default_shuffle_follows_numpys_global_seed(all_devices):
    # Keras draws its shuffle seed from NumPy's global generator: `np.random.seed` (and
    # `keras.utils.set_random_seed`, which calls it) makes a run's order reproducible.
    x, y = make_data(64)
    saved = np.random.get_state()
    try:
        losses = []
        for seed in (0, 0, 1):
            np.random.seed(seed)
            model = build(all_devices, optimizer=optax.sgd(0.1))
            history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)  # shuffle=True
            losses.append(history.history["loss"])
    finally:
        np.random.set_state(saved)
    assert losses[0] == losses[1]
    assert losses[2] != losses[0]  # another seed, another order: the shuffle is used
