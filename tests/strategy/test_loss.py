"""compute_average_loss and scale_regularization_loss, tf.nn's semantics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phalanx


def test_explicit_global_batch_size():
    loss = phalanx.compute_average_loss(jnp.array([1.0, 2, 3, 4, 5]), global_batch_size=10)
    assert float(loss) == pytest.approx(1.5)


def test_no_strategy_uses_the_batch_size():
    loss = phalanx.compute_average_loss(jnp.array([2.5, 6.2, 5.0]))
    assert float(loss) == pytest.approx(4.566667, abs=1e-5)


def test_sample_weights_over_all_elements():
    loss = phalanx.compute_average_loss(
        jnp.array([[2.0, 0.5], [4.0, 1.0]]), sample_weight=jnp.array([[0.3, 0.7], [0.2, 0.8]])
    )
    assert float(loss) == pytest.approx(1.275, abs=1e-6)


def test_zero_global_batch_size_gives_zero():
    assert float(phalanx.compute_average_loss(jnp.ones(4), global_batch_size=0)) == 0.0


def test_scalar_loss_is_a_clear_error():
    with pytest.raises(ValueError, match="batch dimension"):
        phalanx.compute_average_loss(jnp.float32(3.0))


@pytest.mark.multidevice
def test_same_tensor_on_two_replicas_sums_to_the_mean():
    strategy = phalanx.Strategy(devices=jax.devices()[:2])
    per_replica = strategy.run(phalanx.compute_average_loss, args=(jnp.array([2.5, 6.2, 5.0]),))
    assert float(strategy.reduce("sum", per_replica)) == pytest.approx(4.566667, abs=1e-5)


@pytest.mark.multidevice
def test_padded_rows_never_count():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync
    rows = 2 * n + 1  # a partial batch: some replicas get padding
    first = np.arange(2.0 * n * 2)  # the compiled shape: 4 rows per replica
    batches = list(strategy.experimental_distribute_dataset([first, np.arange(float(rows))]))
    losses = strategy.run(lambda x: phalanx.compute_average_loss(x), args=(batches[1],))
    assert float(strategy.reduce("sum", losses)) == pytest.approx(np.arange(rows).mean())


@pytest.mark.multidevice
def test_scale_regularization_loss():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync
    per_replica = strategy.run(lambda: phalanx.scale_regularization_loss(jnp.float32(0.8)))
    assert float(strategy.reduce("sum", per_replica)) == pytest.approx(0.8)
    assert float(phalanx.scale_regularization_loss(0.8)) == pytest.approx(0.8)
    assert n >= 1
