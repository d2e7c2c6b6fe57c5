"""Stateful NNX modules inside `strategy.run`: RNG streams, BatchNorm averages, the registry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import phalanx

pytestmark = pytest.mark.multidevice


def _rows(strategy, per_replica=4, features=3):
    """A distributed batch whose replica r holds rows full of r + 1 (plus the column index)."""
    n = strategy.num_replicas_in_sync
    x = np.repeat(np.arange(1, n + 1, dtype=np.float32), per_replica)[:, None] + np.arange(
        features, dtype=np.float32
    )
    return x, next(iter(strategy.distribute([x])))


def _dropout_masks(seed):
    strategy = phalanx.Strategy()
    with strategy.scope():
        drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=seed))
    batch = next(iter(strategy.distribute([np.ones((strategy.num_replicas_in_sync * 2, 64))])))
    steps = [
        np.asarray(strategy.run(lambda d, x: d(x), args=(drop, batch)).stacked) for _ in range(2)
    ]
    return strategy.num_replicas_in_sync, steps


def test_dropout_masks_differ_across_replicas_and_steps_and_replay_from_the_seed():
    n, (first, second) = _dropout_masks(seed=3)
    masks = first != 0
    for r in range(1, n):
        assert not np.array_equal(masks[0], masks[r]), f"replica {r} reused replica 0's mask"
    assert not np.array_equal(first != 0, second != 0), "the second step reused the first mask"
    _, (again, _) = _dropout_masks(seed=3)
    np.testing.assert_array_equal(first, again)


def test_rng_state_is_not_reduced():
    strategy = phalanx.Strategy()
    with strategy.scope():
        rngs = nnx.Rngs(dropout=0)
        drop = nnx.Dropout(0.5, rngs=rngs)
    key_before = jax.random.key_data(drop.rngs.key.get_value())
    _, batch = _rows(strategy)
    strategy.run(lambda d, x: d(x), args=(drop, batch))
    np.testing.assert_array_equal(jax.random.key_data(drop.rngs.key.get_value()), key_before)
    assert int(drop.rngs.count.get_value()) == 1  # advanced once, identically


def test_batchnorm_moving_mean_is_the_mean_of_the_replicas_batch_means():
    strategy = phalanx.Strategy()
    with strategy.scope():
        bn = nnx.BatchNorm(3, momentum=0.9, rngs=nnx.Rngs(0))
    x, batch = _rows(strategy)
    n = strategy.num_replicas_in_sync
    out = strategy.run(lambda m, v: m(v), args=(bn, batch))
    replica_means = x.reshape(n, -1, 3).mean(axis=1)
    expected = 0.1 * replica_means.mean(axis=0)  # momentum 0.9 from zeros
    np.testing.assert_allclose(np.asarray(bn.mean.get_value()), expected, rtol=1e-6)
    # Each replica normalised with its own statistics, as TF does: its rows are constant per
    # column, so its outputs are all (close to) zero.
    np.testing.assert_allclose(np.asarray(out.stacked), 0.0, atol=1e-3)


def test_metric_state_is_summed():
    strategy = phalanx.Strategy()
    with strategy.scope():
        metric = nnx.metrics.Average()
    x, batch = _rows(strategy)
    strategy.run(lambda m, v: m.update(values=v[:, 0]), args=(metric, batch))
    assert float(metric.compute()) == pytest.approx(x[:, 0].mean())


class _Peak(nnx.Variable):
    pass


class _Tracker(nnx.Module):
    def __init__(self):
        self.peak = _Peak(jnp.zeros(()))
        self.last = nnx.BatchStat(jnp.zeros(()))

    def __call__(self, x):
        self.peak.set_value(jnp.max(x))
        self.last.set_value(jnp.max(x))
        return x


def test_a_user_variable_type_declares_its_aggregation():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        tracker = _Tracker()
    _, batch = _rows(strategy, features=1)
    strategy.run(lambda t, v: t(v), args=(tracker, batch))
    assert float(tracker.peak.get_value()) == 1.0  # unregistered: replica 0's value
    assert float(tracker.last.get_value()) == pytest.approx(np.mean(np.arange(1, n + 1)))
    phalanx.register_variable_aggregation(_Peak, "sum")
    try:
        strategy.run(lambda t, v: t(v), args=(tracker, batch))
        # The old value plus every replica's change (r + 1 - 1).
        assert float(tracker.peak.get_value()) == pytest.approx(1.0 + sum(range(n)))
    finally:
        phalanx.register_variable_aggregation(_Peak, "only_first_replica")


def test_register_rejects_bad_arguments():
    with pytest.raises(TypeError, match=r"nnx\.Variable subclass"):
        phalanx.register_variable_aggregation(int, "mean")
    with pytest.raises(ValueError, match="unknown aggregation 'median'"):
        phalanx.register_variable_aggregation(_Peak, "median")


def test_a_closed_over_stateful_module_is_carried_like_an_argument():
    strategy = phalanx.Strategy()
    with strategy.scope():
        drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    _, batch = _rows(strategy)
    closed = np.asarray(strategy.run(lambda x: drop(x), args=(batch,)).stacked)
    assert int(drop.rngs.count.get_value()) == 1  # written back, as for an argument
    with strategy.scope():
        again = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    passed = np.asarray(strategy.run(lambda d, x: d(x), args=(again, batch)).stacked)
    np.testing.assert_array_equal(closed, passed)
