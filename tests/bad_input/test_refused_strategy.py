"""Mistakes with the strategy: devices, batch splits, distributing data, `run` and `reduce`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from mistakes import Case, assert_documented, expect, ids

import phalanx

REPLICAS = jax.device_count()
ODD = REPLICAS + 2 if REPLICAS > 1 else 3  # a global batch that does not split (for > 1)


class Counter(nnx.Variable):
    """A variable kind of the user's own, for `register_variable_aggregation`."""


def strategy():
    return phalanx.Strategy()


def first_batches(batches):
    """The distributed batches of a list of host batches, taken one by one."""
    return list(strategy().experimental_distribute_dataset(batches))


CASES = [
    Case(
        "`Strategy(devices=[])`",
        ValueError,
        ("at least one device", "empty list"),
        lambda s: phalanx.Strategy(devices=[]),
    ),
    Case(
        "the same device twice in `Strategy(devices=...)`",
        ValueError,
        ("the same device twice",),
        lambda s: phalanx.Strategy(devices=[jax.devices()[0], jax.devices()[0]]),
    ),
    Case(
        "`Strategy(state_sharding='zero3')`",
        ValueError,
        ("state_sharding must be one of", "got 'zero3'"),
        lambda s: phalanx.Strategy(state_sharding="zero3"),
    ),
    Case(
        "`strategy.reduce('avg', value)`",
        ValueError,
        ("unknown reduce op 'avg'", "'mean'"),
        lambda s: strategy().reduce("avg", jnp.ones(3), axis=None),
    ),
    Case(
        "`strategy.reduce('sum', value, axis='0')`",
        TypeError,
        ("axis must be None or an int, got '0'",),
        lambda s: strategy().reduce("sum", jnp.ones(3), axis="0"),
    ),
    Case(
        "`strategy.reduce('sum', ...)` of a plain array",
        ValueError,
        ("plain array", "shape (3,)", "PerReplica"),
        lambda s: strategy().reduce("sum", np.ones(3, np.float32), axis=None),
    ),
    Case(
        "`strategy.run(step(batch))`: a result, not a function",
        TypeError,
        ("strategy.run needs a function, got 3",),
        lambda s: strategy().run(3),
    ),
    Case(
        "a `drop_remainder` batch that does not split over the replicas",
        ValueError,
        (f"global batch {ODD} does not split over", "drop_remainder=True"),
        lambda s: strategy().experimental_distribute_dataset(
            phalanx.data.Dataset.from_tensor_slices(s.x).repeat().batch(ODD, drop_remainder=True)
        ),
    ),
    Case(
        "an unbatched element given to `experimental_distribute_dataset`",
        ValueError,
        ("is a scalar", "dataset.batch(n)"),
        lambda s: first_batches([np.float32(1.0)]),
    ),
    Case(
        "batch leaves with different row counts",
        ValueError,
        ("disagree on the batch dimension",),
        lambda s: first_batches([(np.ones((8, 1)), np.ones((4, 1)))]),
    ),
    Case(
        "a later batch larger than the first",
        ValueError,
        (f"a batch of {4 * REPLICAS} rows", "compiled for 2"),
        lambda s: first_batches([np.ones((2 * REPLICAS, 1)), np.ones((4 * REPLICAS, 1))]),
    ),
    Case(
        "`InputContext(num_input_pipelines=2, input_pipeline_id=2)`",
        ValueError,
        ("input_pipeline_id 2 is not in [0, 2)",),
        lambda s: phalanx.InputContext(num_input_pipelines=2, input_pipeline_id=2),
    ),
    Case(
        "`InputContext(num_replicas_in_sync=0)`",
        ValueError,
        ("num_replicas_in_sync must be >= 1, got 0",),
        lambda s: phalanx.InputContext(num_replicas_in_sync=0),
    ),
    Case(
        "`get_per_replica_batch_size(100)` over 8 replicas",
        ValueError,
        ("global batch size 100 does not split over 8 replicas", "96 or 104"),
        lambda s: phalanx.InputContext(num_replicas_in_sync=8).get_per_replica_batch_size(100),
    ),
    Case(
        "`register_variable_aggregation(int, 'mean')`",
        TypeError,
        ("var_type must be an nnx.Variable subclass", "int"),
        lambda s: phalanx.register_variable_aggregation(int, "mean"),
    ),
    Case(
        "`register_variable_aggregation(Counter, 'median')`",
        ValueError,
        ("unknown aggregation 'median' for Counter",),
        lambda s: phalanx.register_variable_aggregation(Counter, "median"),
    ),
    Case(
        "`compute_average_loss` of an already averaged loss",
        ValueError,
        ("got a scalar", "not their mean"),
        lambda s: phalanx.compute_average_loss(jnp.float32(0.5)),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_the_mistake_gets_a_clear_error(case, make_scene):
    expect(case, make_scene(case.checkpoint))


def test_every_case_is_in_the_docs():
    assert_documented(CASES)
