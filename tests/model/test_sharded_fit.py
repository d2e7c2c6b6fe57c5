"""Strategy(state_sharding='zero1' | 'fsdp'): fit gives replicated training's numbers with the
optimizer state (and parameters) sharded, keeps that layout, and checkpoints across counts."""

import jax
import numpy as np
import pytest
from conftest import build, make_data

import phalanx
from phalanx._src.strategy.sharding import leaf_spec, memory_report
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer

pytestmark = pytest.mark.multidevice

N = jax.device_count()


def _fit(mode, devices=None, epochs=2, steps_per_execution=1):
    strategy = phalanx.Strategy(devices=devices, state_sharding=mode)
    model = build(strategy, optimizer="adam", steps_per_execution=steps_per_execution)
    x, y = make_data(72)
    history = model.fit(x, y, batch_size=24, epochs=epochs, verbose=0, shuffle=False)
    return model, history.history


def _assert_laid_out(part, sharded, n=N):
    """Each leaf is split over all n replicas exactly when it has an axis divisible by n."""
    for leaf in jax.tree.leaves(part):
        expected = leaf_spec(leaf.shape, n, "data") if sharded else jax.sharding.PartitionSpec()
        assert leaf.sharding.spec == expected, (leaf.shape, leaf.sharding)
        assert len(leaf.sharding.device_set) == n
    if sharded and n > 1:
        assert any(not leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(part))


@pytest.fixture(scope="module")
def replicated():
    model, history = _fit("replicated")
    x, y = make_data(30, seed=2)
    return (
        history,
        model.get_weights(),
        model.evaluate(x, y, verbose=0, return_dict=True),
        model.predict(x),
    )


# steps_per_execution=2 runs the steps in a lax.scan, whose carry keeps the sharded layout.
@pytest.mark.parametrize(("mode", "k"), [("zero1", 1), ("fsdp", 1), ("fsdp", 2)])
def test_same_numbers_as_replicated_and_sharded_layout(mode, k, replicated):
    model, history = _fit(mode, steps_per_execution=k)
    want_history, want_weights, want_eval, want_predictions = replicated
    for key in ("loss", "accuracy"):  # the history also has timings
        np.testing.assert_allclose(history[key], want_history[key], rtol=1e-6, atol=1e-6)
    for got, want in zip(model.get_weights(), want_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    x, y = make_data(30, seed=2)
    got_eval = model.evaluate(x, y, verbose=0, return_dict=True)
    for key, value in want_eval.items():
        assert got_eval[key] == pytest.approx(value, rel=1e-6, abs=1e-6)
    np.testing.assert_allclose(model.predict(x), want_predictions, rtol=1e-6, atol=1e-6)
    state = model.engine.state
    _assert_laid_out(state["opt"], sharded=True)
    _assert_laid_out(state["params"], sharded=mode == "fsdp")
    _assert_laid_out(state["rest"], sharded=False)
    # Two epochs of fit, one compilation: the sharded output layout is the next input's.
    train_fns = [
        fn for key, fn in model.engine.cache.items() if isinstance(key, tuple) and key[0] == "train"
    ]
    assert train_fns and all(fn._cache_size() == 1 for fn in train_fns)
    # Setting the learning rate or the weights keeps the layout.
    model.learning_rate = 5e-4
    model.set_weights(model.get_weights())
    _assert_laid_out(model.engine.state["opt"], sharded=True)
    _assert_laid_out(model.engine.state["params"], sharded=mode == "fsdp")
    assert model.learning_rate == pytest.approx(5e-4)


def test_memory_report_counts_per_device_bytes():
    model, _ = _fit("fsdp", epochs=1)
    report = memory_report(model)
    assert (report["state_sharding"], report["num_replicas"]) == ("fsdp", N)
    full = sum(a.nbytes for a in jax.tree.leaves(model.engine.state["params"]))
    assert report["replicated"]["params"] == full
    per_device = sum(
        a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(model.engine.state["params"])
    )
    assert report["sharded"]["params"] == per_device
    opt_per_device = sum(
        a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(model.engine.state["opt"])
    )
    assert report["sharded"]["optimizer"] == opt_per_device
    if N > 1:
        assert report["sharded"]["total"] < report["replicated"]["total"]


@pytest.mark.parametrize("mode", ["zero1", "fsdp"])
def test_checkpoint_restores_on_half_the_devices(mode, tmp_path):
    model, _ = _fit(mode, epochs=1)
    checkpointer = TrainCheckpointer(tmp_path / "ck", asynchronous=False)
    checkpointer.save(1, model.engine, {"epoch": 0})
    checkpointer.close()
    half = jax.devices()[: max(1, N // 2)]
    fresh = build(phalanx.Strategy(devices=half, state_sharding=mode), optimizer="adam", seed=7)
    fresh.load_checkpoint(tmp_path / "ck")
    for got, want in zip(
        jax.tree.leaves(fresh.engine.state), jax.tree.leaves(model.engine.state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.sharding.device_set == set(half)
    # Restored in the target's layout: training goes on there.
    x, y = make_data(24, seed=1)
    fresh.fit(x, y, batch_size=24, epochs=1, verbose=0)
    _assert_laid_out(fresh.engine.state["opt"], sharded=True, n=len(half))
    _assert_laid_out(fresh.engine.state["params"], sharded=mode == "fsdp", n=len(half))
