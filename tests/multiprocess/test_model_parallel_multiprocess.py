"""Model parallelism across two processes x four CPU devices (issue 24): with
`model_parallel=2` the job is 4 replicas of 2 devices, each model group on one process, and
fit gives one device's numbers (computed by the test, on one device, before the launch)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from multiprocess_harness import run_multiprocess

import phalanx

pytestmark = pytest.mark.multiprocess

RULES = [("mlp", "model")]
X = np.random.RandomState(0).randn(40, 8).astype(np.float32)  # 5 batches of 8
Y = X[:, :4].argmax(1).astype(np.int32)


class _Wide(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        split = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "mlp"))
        joined = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("mlp", None))
        self.up = nnx.Linear(8, 16, kernel_init=split, rngs=rngs)
        self.down = nnx.Linear(16, 4, kernel_init=joined, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def _fit(strategy: phalanx.Strategy) -> tuple[list[float], list[float], phalanx.Model]:
    with strategy.scope():
        model = phalanx.Model(_Wide(nnx.Rngs(0)))
        model.compile(
            optimizer="adam",
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    return history.history["loss"], model.evaluate(X, Y, batch_size=16, verbose=0), model


def _body(want_losses: list[float], want_eval: list[float], want_kernel: list) -> None:
    strategy = phalanx.Strategy(model_parallel=2, axis_rules=RULES)
    assert strategy.num_replicas_in_sync == 4
    assert strategy.num_local_replicas == 2
    for group in strategy.mesh.devices:  # a model group never spans processes
        assert len({d.process_index for d in group}) == 1
    losses, evaluated, model = _fit(strategy)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(evaluated, want_eval, rtol=1e-5)
    kernel = model.engine.state["params"]["up"]["kernel"].get_value()
    shards = kernel.addressable_shards
    assert all(s.data.shape == (8, 8) for s in shards)  # each device: half of the kernel
    halves = {s.index[1].start or 0: np.asarray(s.data) for s in shards}
    np.testing.assert_allclose(
        np.concatenate([halves[0], halves[8]], axis=1),
        np.asarray(want_kernel),
        rtol=1e-5,
        atol=1e-6,
    )


def test_model_parallel_across_two_processes_equals_one_device():
    losses, evaluated, model = _fit(phalanx.Strategy(devices=jax.devices()[:1], axis_rules=RULES))
    kernel = np.asarray(model.engine.state["params"]["up"]["kernel"].get_value())
    run_multiprocess(
        _body,
        cpu_devices=4,
        timeout=180.0,
        kwargs={
            "want_losses": [float(v) for v in losses],
            "want_eval": [float(v) for v in evaluated],
            "want_kernel": kernel.tolist(),
        },
    )
