"""phalanx.Checkpoint / CheckpointManager in a job of 2 processes (Orbax writes), restored
there and in this single process on one device."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multiprocess"))
from multiprocess_harness import run_multiprocess

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _trained():
    """A Linear and its Adam state after one step of gradients 1 (the same everywhere)."""
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    optimizer.update(model, jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param)))
    return model, optimizer


def _local(array):
    return np.asarray(array.addressable_data(0))


def _body(folder):
    assert jax.process_count() == 2
    strategy = phalanx.Strategy()  # both processes' devices
    model, optimizer = _trained()
    strategy.replicate((model, optimizer))
    assert not model.kernel[...].is_fully_addressable
    checkpoint = phalanx.Checkpoint(model=model, optimizer=optimizer, step=5)
    manager = phalanx.CheckpointManager(checkpoint, folder, max_to_keep=2)
    for _ in range(3):
        manager.save()
    assert [os.path.basename(path) for path in manager.checkpoints] == ["2", "3"]
    assert sorted(os.listdir(os.path.join(folder, "ckpt"))) == ["2", "3"]

    fresh = strategy.replicate(nnx.Linear(3, 2, rngs=nnx.Rngs(1)))
    fresh_optimizer = strategy.replicate(nnx.Optimizer(fresh, optax.adam(0.1), wrt=nnx.Param))
    restored = phalanx.Checkpoint(model=fresh, optimizer=fresh_optimizer, step=0)
    restored.restore(phalanx.latest_checkpoint(folder))
    assert restored.step == 5 and restored.save_counter == 3
    np.testing.assert_array_equal(_local(fresh.kernel[...]), _local(model.kernel[...]))
    assert int(_local(fresh_optimizer.step[...])) == 1


def test_saved_by_two_processes_restores_in_one(tmp_path):
    folder = str(tmp_path / "run")
    run_multiprocess(_body, cpu_devices=2, timeout=150, kwargs={"folder": folder})
    latest = phalanx.latest_checkpoint(folder)
    assert latest == os.path.join(folder, "ckpt", "3")
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(7))
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    checkpoint = phalanx.Checkpoint(model=model, optimizer=optimizer, step=0)
    checkpoint.restore(latest)
    want_model, want_optimizer = _trained()
    for got, want in zip(
        jax.tree.leaves(nnx.state((model, optimizer))),
        jax.tree.leaves(nnx.state((want_model, want_optimizer))),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    assert checkpoint.step == 5
