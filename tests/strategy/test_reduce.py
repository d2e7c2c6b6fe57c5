"""strategy.reduce and ReplicaContext.all_reduce, with tf.distribute's semantics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phalanx

pytestmark = pytest.mark.multidevice


@pytest.fixture
def two():
    return phalanx.Strategy(devices=jax.devices()[:2])


def _per_replica(strategy, rows):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: np.asarray(rows[ctx.replica_id_in_sync_group])
    )


@pytest.mark.parametrize(
    ("op", "axis", "expected"),
    [
        ("sum", None, [4, 6, 8, 10]),
        ("mean", None, [2, 3, 4, 5]),
        ("sum", 0, 28),
        ("mean", 0, 3.5),
        (phalanx.ReduceOp.MAX, None, [4, 5, 6, 7]),
        ("min", 0, 0),
    ],
)
def test_reduce_two_replicas(two, op, axis, expected):
    value = _per_replica(two, [[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_allclose(two.reduce(op, value, axis=axis), expected)


def test_reduce_partial_batch_excludes_padding(two):
    (batch,) = list(two.experimental_distribute_dataset([np.arange(7.0)]))
    assert np.asarray(phalanx.get_batch_mask(batch)).tolist() == [True] * 7 + [False]
    per_replica = two.run(lambda x: x, args=(batch,))
    assert two.reduce("mean", per_replica, axis=0) == pytest.approx(3.0)
    assert two.reduce("mean", batch, axis=0) == pytest.approx(3.0)
    assert two.reduce("sum", per_replica, axis=0) == pytest.approx(21.0)
    assert two.reduce("max", per_replica, axis=0) == pytest.approx(6.0)
    # Elementwise over replicas: position 3 only has replica 0's value.
    np.testing.assert_allclose(two.reduce("sum", per_replica), [4, 6, 8, 3])
    np.testing.assert_allclose(two.reduce("mean", per_replica), [2, 3, 4, 3])


def test_all_reduce_pytree(two):
    def fn():
        ctx = phalanx.get_replica_context()
        first = ctx.replica_id_in_sync_group == 0
        value = {
            "a": jnp.where(first, 1.0, 3.0),
            "b": jnp.where(first, jnp.array([40.0, 1.0]), jnp.array([2.0, 98.0])),
        }
        return ctx.all_reduce("sum", value), ctx.all_reduce(phalanx.ReduceOp.MEAN, value)

    total, mean = two.run(fn)
    np.testing.assert_allclose(total["a"], 4)
    np.testing.assert_allclose(total["b"], [42, 99])
    np.testing.assert_allclose(mean["a"], 2)
    np.testing.assert_allclose(mean["b"], [21, 49.5])


def test_all_reduce_of_a_constant_counts_every_replica():
    strategy = phalanx.Strategy()
    n = strategy.run(lambda: phalanx.get_replica_context().all_reduce("sum", 1.0))
    assert float(n) == jax.device_count()


def test_all_gather_concatenates_in_replica_order():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync

    def fn():
        ctx = phalanx.get_replica_context()
        return ctx.all_gather(jnp.full((2,), ctx.replica_id_in_sync_group), axis=0)

    gathered = strategy.experimental_local_results(strategy.run(fn))
    assert len(gathered) == n
    for copy in gathered:
        np.testing.assert_array_equal(copy, np.repeat(np.arange(n), 2))


def test_run_returns_per_replica_for_one_and_many_replicas():
    for devices in (jax.devices()[:1], jax.devices()):
        strategy = phalanx.Strategy(devices=devices)
        out = strategy.run(lambda: {"id": phalanx.get_replica_context().replica_id_in_sync_group})
        assert isinstance(out, dict)
        assert isinstance(out["id"], phalanx.PerReplica)
        assert [int(v) for v in strategy.experimental_local_results(out["id"])] == list(
            range(len(devices))
        )


def test_unknown_reduce_op_is_a_clear_error(two):
    value = _per_replica(two, [[0], [1]])
    with pytest.raises(ValueError, match="unknown reduce op 'median'"):
        two.reduce("median", value)


def test_sum_of_a_plain_array_is_rejected_mean_passes(two):
    with pytest.raises(ValueError, match="no per-replica parts"):
        two.reduce("sum", jnp.ones(3))
    np.testing.assert_allclose(two.reduce("mean", jnp.arange(3.0)), [0, 1, 2])


def test_mirrored_run_result_sums_once_per_replica(two):
    mirrored = two.run(lambda: jnp.float32(0.25))
    assert not isinstance(mirrored, phalanx.PerReplica)
    assert float(two.reduce("sum", mirrored)) == pytest.approx(0.5)
    assert float(two.reduce("mean", mirrored)) == pytest.approx(0.25)


def test_replica_context_outside_run():
    outside = phalanx.get_replica_context()
    assert outside.num_replicas_in_sync == 1
    strategy = phalanx.Strategy()
    with strategy.scope():
        assert phalanx.get_replica_context() is None  # cross-replica context, as in TF
    captured = []
    strategy.run(lambda: captured.append(phalanx.get_replica_context()) or 0)
    with pytest.raises(RuntimeError, match=r"after its strategy\.run finished"):
        captured[0].all_reduce("sum", 1.0)
