"""`distribute_datasets_from_function` across 2 processes x 4 CPU devices, with TF's numbers.

TF's documented `dataset_fn` is ported verbatim (`tf.data` -> `phalanx.data`): 2 input
pipelines with ids 0 and 1, `get_per_replica_batch_size(64) == 8`, and every step a global
batch of 8 x 8 = 64 examples.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from multiprocess_harness import run_multiprocess

import phalanx

pytestmark = pytest.mark.multiprocess

global_batch_size = 64


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    d = phalanx.data.Dataset.from_tensors([[1.0]]).repeat().batch(batch_size)
    return d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def _tutorial_body() -> None:
    strategy = phalanx.Strategy()
    seen = []

    def traced_fn(ctx):
        seen.append(ctx)
        return dataset_fn(ctx)

    batch = next(iter(strategy.distribute_datasets_from_function(traced_fn)))
    (ctx,) = seen
    assert ctx.num_input_pipelines == 2
    assert ctx.input_pipeline_id == jax.process_index()
    assert ctx.num_replicas_in_sync == 8
    assert ctx.get_per_replica_batch_size(global_batch_size) == 8
    assert batch.shape == (global_batch_size, 1, 1)
    total = strategy.reduce("sum", batch, axis=None)
    assert float(np.asarray(total).sum()) == global_batch_size


def test_tf_tutorial_dataset_fn_on_two_processes():
    run_multiprocess(_tutorial_body, cpu_devices=4)
