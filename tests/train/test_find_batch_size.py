"""`phalanx.tune.find_batch_size`: doubling then bisection on XLA's memory analysis."""

import jax
import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx._src.tune import batch_size as tune_lib


class Wide(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(256, 512, rngs=rngs)
        self.out = nnx.Linear(512, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


@pytest.fixture(scope="module")
def model():
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = phalanx.Model(Wide(nnx.Rngs(0)))
        model.compile(
            phalanx.optimizers.get("adam", learning_rate=1e-3),
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


SAMPLE = (np.zeros((4, 256), np.float32), np.zeros(4, np.int32))


@pytest.mark.multidevice
def test_largest_batch_under_a_small_memory_cap_same_answer_twice(model):
    probe = tune_lib._Probe(model, tune_lib._example_specs(SAMPLE), None)
    # A cap between the needs of 24 and 32 examples per replica: the answer must be 24.
    low, high = probe.bytes_needed(24), probe.bytes_needed(32)
    assert low < high
    cap = (low + high) // 2
    found = phalanx.tune.find_batch_size(
        model, SAMPLE, memory_limit_bytes=cap, headroom=1.0, base_batch_size=128
    )
    assert found.per_replica_batch_size == 24 and found.multiple == 8  # CPU rounds to 8
    assert found.global_batch_size == 24 * model.strategy.num_replicas_in_sync
    assert found.bytes_per_device == low and found.method == "memory_analysis"
    assert not found.capped
    # Doubling (8, 16, 32), then bisection between 16 and 32.
    assert [t[0] for t in found.trials] == [8, 16, 32, 24]
    assert found.learning_rate == pytest.approx(1e-3 * found.global_batch_size / 128)
    again = phalanx.tune.find_batch_size(model, SAMPLE, memory_limit_bytes=cap, headroom=1.0)
    assert again.per_replica_batch_size == found.per_replica_batch_size
    assert again.trials == found.trials


def test_max_batch_size_caps_the_search_and_says_so(model):
    found = phalanx.tune.find_batch_size(model, SAMPLE, max_batch_size=32, multiple=16)
    assert found.per_replica_batch_size == 32 and found.capped
    assert "stopped at max_batch_size" in found.summary()


def test_nothing_fits_is_a_clear_error(model):
    with pytest.raises(ValueError, match="not even 8 examples per replica fit"):
        phalanx.tune.find_batch_size(model, SAMPLE, memory_limit_bytes=1000)
    with pytest.raises(ValueError, match="headroom must be in"):
        phalanx.tune.find_batch_size(model, SAMPLE, headroom=0)
    with pytest.raises(ValueError, match="leading batch axis"):
        phalanx.tune.find_batch_size(model, (np.zeros((4, 2)), np.zeros(3)))


@pytest.mark.multidevice
@pytest.mark.parametrize(
    ("examples_per_replica", "per_replica", "trials"),
    [
        (100, 5, [5]),  # 20 steps of 5: below one multiple of 8, so the cap itself
        (1000, 50, [8, 16, 32, 50]),  # doubling, then the cap instead of 64
    ],
)
def test_the_dataset_caps_the_batch_so_an_epoch_has_20_steps(
    model, examples_per_replica, per_replica, trials
):
    replicas = model.strategy.num_replicas_in_sync
    size = examples_per_replica * replicas
    found = phalanx.tune.find_batch_size(model, SAMPLE, dataset_size=size)
    assert found.per_replica_batch_size == per_replica
    assert found.global_batch_size == per_replica * replicas
    assert size // found.global_batch_size >= 20  # at least 20 full steps an epoch
    assert [t[0] for t in found.trials] == trials
    assert found.dataset_capped and not found.capped
    assert f"capped so that an epoch of {size:,} examples has at least 20 steps" in (
        found.summary()
    )


@pytest.mark.parametrize(
    ("dataset_size", "min_steps", "replicas", "per_replica"),
    [
        (1438, 20, 2, 35),  # the digits on 2 replicas: 70 global, 21 steps
        (1438, 20, 8, 8),  # 71 global rounds down to 64
        (60000, 20, 8, 375),  # MNIST: 3,000 global
        (10, 20, 8, 1),  # fewer examples than steps: one per replica
        (None, 20, 8, None),  # no dataset size: no cap
    ],
)
def test_the_cap_golden_values(dataset_size, min_steps, replicas, per_replica):
    assert tune_lib._per_replica_cap(dataset_size, min_steps, replicas) == per_replica


def test_max_batch_size_below_the_cap_still_stops_the_search(model):
    replicas = model.strategy.num_replicas_in_sync
    found = phalanx.tune.find_batch_size(
        model, SAMPLE, max_batch_size=16, dataset_size=10_000 * replicas
    )
    assert found.per_replica_batch_size == 16 and found.capped and not found.dataset_capped


def test_a_bad_dataset_size_is_a_clear_error(model):
    with pytest.raises(ValueError, match="dataset_size must be a positive int, got 0"):
        phalanx.tune.find_batch_size(model, SAMPLE, dataset_size=0)
    with pytest.raises(ValueError, match="min_steps_per_epoch must be a positive int, got -1"):
        phalanx.tune.find_batch_size(model, SAMPLE, dataset_size=100, min_steps_per_epoch=-1)
