"""Distributing batches: tf.distribute's spread, padding, masks, structure, and early errors."""

import collections

import jax
import numpy as np
import pytest

import phalanx
from phalanx._src.strategy import layout

pytestmark = pytest.mark.multidevice


def _strategy(n):
    if n > jax.device_count():
        pytest.skip(f"needs {n} devices")
    return phalanx.Strategy(devices=jax.devices()[:n])


def _replica_rows(strategy, batch):
    """Each replica's real rows, read back through strategy.run and the mask."""
    per_replica = strategy.run(lambda x: x, args=(batch,))
    mask = np.asarray(phalanx.get_batch_mask(batch)).reshape(strategy.num_replicas_in_sync, -1)
    values = np.asarray(per_replica.stacked)
    return [values[r][mask[r]].tolist() for r in range(strategy.num_replicas_in_sync)]


class _Batches(list):
    """A list of batches that declares how it was batched, as phalanx datasets do."""

    def __init__(self, items, batch_size, drop_remainder=False):
        super().__init__(items)
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder


@pytest.mark.parametrize(
    ("n", "parts", "expected"),
    [
        (6, 2, [(0, 3), (3, 6)]),
        (2, 2, [(0, 1), (1, 2)]),
        (4, 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 4)]),
        (7, 3, [(0, 3), (3, 6), (6, 7)]),
        (0, 3, [(0, 0), (0, 0), (0, 0)]),
    ],
)
def test_ceil_split_golden(n, parts, expected):
    assert layout.ceil_split(n, parts) == expected


def test_range6_batch4_on_two_replicas():
    strategy = _strategy(2)
    data = np.arange(6)
    batches = _Batches([data[:4], data[4:]], batch_size=4)
    got = [_replica_rows(strategy, b) for b in strategy.experimental_distribute_dataset(batches)]
    assert got == [[[0, 1], [2, 3]], [[4], [5]]]


def test_range4_batch4_on_five_replicas():
    strategy = _strategy(5)
    (batch,) = list(strategy.distribute(_Batches([np.arange(4)], batch_size=4)))
    assert _replica_rows(strategy, batch) == [[0], [1], [2], [3], []]
    assert batch.shape == (5,)


def test_structure_is_kept():
    strategy = _strategy(2)
    Pair = collections.namedtuple("Pair", "x y")
    x, y = np.arange(8.0).reshape(4, 2), np.arange(4)
    for batch, kind in [((x, y), tuple), ({"x": x, "y": y}, dict), (Pair(x, y), Pair)]:
        (out,) = list(strategy.distribute([batch]))
        assert isinstance(out, kind)
        leaves = jax.tree.leaves(out)
        assert all(isinstance(leaf, jax.Array) for leaf in leaves)
        assert out[0 if kind is not dict else "x"].sharding.spec[0] == strategy.axis_name
    (pair,) = list(strategy.distribute([Pair(x, y)]))
    assert pair.x.shape == (4, 2) and pair.y.shape == (4,)


def test_bare_array_batch_keeps_its_mask():
    strategy = _strategy(2)
    (batch,) = list(strategy.distribute([np.arange(3.0)]))
    assert isinstance(batch, jax.Array)
    assert np.asarray(phalanx.get_batch_mask(batch)).tolist() == [True, True, True, False]
    assert float(strategy.reduce("mean", batch, axis=0)) == pytest.approx(1.0)


def test_drop_remainder_split_error_before_iterating():
    strategy = _strategy(2)
    n = strategy.num_replicas_in_sync
    with pytest.raises(ValueError, match=f"does not split over {n} replicas"):
        strategy.distribute(_Batches([], batch_size=2 * n + 1, drop_remainder=True))
    # Without drop_remainder the same batch pads instead.
    strategy.distribute(_Batches([], batch_size=2 * n + 1, drop_remainder=False))


def test_leading_dimensions_must_agree():
    strategy = _strategy(2)
    with pytest.raises(ValueError, match="disagree on the batch dimension"):
        next(iter(strategy.distribute([(np.zeros(4), np.zeros(3))])))


def test_rank0_leaf_is_rejected():
    strategy = _strategy(2)
    with pytest.raises(ValueError, match="is a scalar"):
        next(iter(strategy.distribute([(np.zeros(4), np.float32(1.0))])))


def test_batch_larger_than_the_first_is_rejected():
    strategy = _strategy(2)
    it = iter(strategy.distribute([np.zeros(4), np.zeros(6)]))
    next(it)
    with pytest.raises(ValueError, match="never larger"):
        next(it)


def test_input_context():
    ctx = phalanx.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    assert ctx.get_per_replica_batch_size(64) == 16
    with pytest.raises(ValueError, match="does not split over 4 replicas"):
        ctx.get_per_replica_batch_size(30)
    with pytest.raises(ValueError, match="not in"):
        phalanx.InputContext(num_input_pipelines=2, input_pipeline_id=2)


# TF's own code, from the tf.distribute.Strategy.distribute_datasets_from_function docs,
# ported verbatim but for `tf.data` -> `phalanx.data`. TF's docs use 64 on 8 replicas; 8 per
# replica keeps the 3-device run's global batch divisible too.
global_batch_size = 8 * jax.device_count()


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    d = phalanx.data.Dataset.from_tensors([[1.0]]).repeat().batch(batch_size)
    return d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def test_tf_tutorial_dataset_fn_gives_per_replica_times_replicas_examples():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync
    seen = []

    def traced_fn(ctx):
        seen.append(ctx)
        return dataset_fn(ctx)

    batch = next(iter(strategy.distribute_datasets_from_function(traced_fn)))
    ctx = seen[0]
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id) == (1, 0)
    assert ctx.num_replicas_in_sync == n
    assert ctx.get_per_replica_batch_size(global_batch_size) == global_batch_size // n
    assert batch.shape == (global_batch_size, 1, 1)
    assert float(strategy.reduce("sum", batch, axis=None).sum()) == global_batch_size


def test_each_replica_gets_one_per_replica_batch_in_order():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync

    def numbered(ctx):
        rows = np.repeat(np.arange(n + 1, dtype=np.float32), 2)  # batch b holds b, b
        return phalanx.data.Dataset.from_tensor_slices(rows).batch(2)

    batches = list(strategy.distribute_datasets_from_function(numbered))
    assert len(batches) == 2  # n batches, then the one left over
    assert _replica_rows(strategy, batches[0]) == [[r, r] for r in range(n)]
    assert np.asarray(phalanx.get_batch_mask(batches[1])).sum() == 2  # padded and masked
    rows = [row for part in _replica_rows(strategy, batches[1]) for row in part]
    assert rows == [n, n]


def test_process_batches_keeps_the_older_form():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync

    def process_fn(ctx):
        return [np.arange(2 * n, dtype=np.float32)]

    (batch,) = list(strategy.distribute_datasets_from_function(process_fn, process_batches=True))
    assert batch.shape == (2 * n,)
    assert float(strategy.reduce("sum", batch, axis=0)) == pytest.approx(sum(range(2 * n)))


def test_scope_nesting_and_default_strategy():
    default = phalanx.get_strategy()
    assert default.num_replicas_in_sync == 1
    assert not phalanx.has_strategy()
    outer, inner = phalanx.Strategy(), _strategy(2)
    with outer.scope():
        assert phalanx.get_strategy() is outer
        with inner.scope():
            assert phalanx.get_strategy() is inner
        assert phalanx.get_strategy() is outer
    assert phalanx.get_strategy() is default


def test_strategy_on_a_subset_of_devices():
    strategy = _strategy(3)
    assert strategy.num_replicas_in_sync == 3
    assert strategy.devices == tuple(jax.devices()[:3])
    with pytest.raises(ValueError, match="same device twice"):
        phalanx.Strategy(devices=[jax.devices()[0]] * 2)
