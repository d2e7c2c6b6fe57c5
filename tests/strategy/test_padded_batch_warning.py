"""A custom-loop step on a padded global batch says so, once, unless it reads the mask.

The last global batch of 10 rows over N > 1 replicas (2 rows per replica, 2N per batch)
leaves some replicas with copies of a real row. A step that sums its rows itself counts
them; phalanx warns the first time, naming the padded rows, `compute_average_loss`,
metrics and the mask accessor. Steps that leave padding out through those stay silent.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phalanx

pytestmark = pytest.mark.multidevice

N = jax.device_count()
ROWS = 2 * N + 2 if N > 1 else 3  # one full global batch, then a padded one


def _batches(strategy):
    per_batch = 2 * strategy.num_replicas_in_sync
    values = -np.arange(1, ROWS + 1, dtype=np.float32)
    dataset = phalanx.data.Dataset.from_tensor_slices(values).batch(per_batch)
    return list(strategy.experimental_distribute_dataset(dataset)), per_batch


def _padding_of_last(per_batch):
    return per_batch - (ROWS % per_batch or per_batch)


def _sum_rows(x):
    return jnp.sum(x)


def _sum_eager(x):
    return jnp.sum(x)


def _sum_compiled(x):  # its own function: the warning is once per step function
    return jnp.sum(x)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "phalanx.function"])
def test_a_step_summing_its_rows_warns_once(compiled):
    strategy = phalanx.Strategy()
    sum_rows = _sum_compiled if compiled else _sum_eager

    def distributed(x):
        return strategy.reduce("sum", strategy.run(sum_rows, args=(x,)), axis=None)

    if compiled:
        distributed = phalanx.function(distributed)
    batches, per_batch = _batches(strategy)
    padded = _padding_of_last(per_batch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in batches + batches:  # two epochs: still one warning
            distributed(x)
    messages = [str(w.message) for w in caught if w.category is phalanx.PaddedBatchWarning]
    assert len(messages) == 1
    message = messages[0]
    assert f"{padded} of the {per_batch} rows" in message
    for name in ("compute_average_loss", "metrics", "get_replica_context().mask"):
        assert name in message


@pytest.mark.parametrize(
    ("step", "want"),
    [
        (lambda x: phalanx.compute_average_loss(x, global_batch_size=ROWS), -(ROWS + 1) / 2),
        (lambda x: jnp.sum(x * phalanx.get_replica_context().mask), -ROWS * (ROWS + 1) / 2),
    ],
    ids=["compute_average_loss", "mask"],
)
def test_steps_that_leave_padding_out_are_silent(step, want):
    strategy = phalanx.Strategy()
    batches, _ = _batches(strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", phalanx.PaddedBatchWarning)
        total = sum(
            float(strategy.reduce("sum", strategy.run(step, args=(x,)), axis=None)) for x in batches
        )
    assert total == pytest.approx(want)


def test_a_metric_update_is_silent():
    strategy = phalanx.Strategy()
    with strategy.scope():
        mean = phalanx.metrics.Mean()
    batches, _ = _batches(strategy)

    def step(x):
        mean.update_state(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", phalanx.PaddedBatchWarning)
        for x in batches:
            strategy.run(step, args=(x,))
    assert float(mean.result()) == pytest.approx(-(ROWS + 1) / 2)


def test_full_batches_are_silent():
    strategy = phalanx.Strategy()
    per_batch = 2 * strategy.num_replicas_in_sync
    dataset = phalanx.data.Dataset.from_tensor_slices(np.ones(2 * per_batch, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", phalanx.PaddedBatchWarning)
        for x in strategy.experimental_distribute_dataset(dataset.batch(per_batch)):
            strategy.run(_sum_rows, args=(x,))
