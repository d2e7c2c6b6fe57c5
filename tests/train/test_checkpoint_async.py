"""Asynchronous checkpoints: training goes on while a save is written, and a kill during a
save leaves the previous checkpoint whole and loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
from phalanx._src.train.checkpoint.layout import Layout

WIDE = 2048  # 2048 x 2048 float32 kernel + Adam's two moments: ~50 MB, long enough to write


class Wide(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(WIDE, WIDE, rngs=rngs)

    def __call__(self, x):
        return self.l1(x)


def _model(seed):
    with phalanx.Strategy(devices=phalanx.Strategy().devices[:1]).scope():
        model = phalanx.Model(Wide(nnx.Rngs(seed)))
        model.compile(optax.adam(1e-3), loss="mse")
    return model


KILL_DURING_SAVE = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    sys.path.insert(0, {here!r})
    from test_checkpoint_async import _model
    from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
    model = _model(0)
    ckpt = TrainCheckpointer({directory!r})
    ckpt.save(1, model.engine, {{"n": 1}}, wait=True)
    np.save({first!r}, model.get_weights()[0])
    model.set_weights([w + 1 for w in model.get_weights()])
    ckpt.save(2, model.engine, {{"n": 2}})  # returns at once; the files are written later
    print("SAVE 2 RETURNED", flush=True)
    while not any(p.startswith("2") for p in os.listdir({directory!r})):
        time.sleep(0.001)  # kill as soon as the writer has started checkpoint 2
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.slow
def test_a_kill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    directory, first = tmp_path / "ckpt", tmp_path / "first.npy"
    code = KILL_DURING_SAVE.format(
        here=os.path.dirname(__file__), directory=str(directory), first=str(first)
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "SAVE 2 RETURNED" in proc.stdout
    # The interrupted save is left as a temporary directory, never as checkpoint 2.
    leftovers = [p.name for p in directory.iterdir() if p.name.startswith("2")]
    assert leftovers and all("tmp" in name for name in leftovers), leftovers
    ckpt = TrainCheckpointer(directory)
    try:
        assert ckpt.latest_step() == 1
        model = _model(5)
        assert ckpt.restore(model.engine) == {"n": 1}
    finally:
        ckpt.close()
    np.testing.assert_array_equal(model.get_weights()[0], np.load(first))


def test_an_async_save_survives_the_next_steps_and_restores_exactly(tmp_path):
    # The next step donates the state's buffers while the files are still being written.
    x = np.random.default_rng(0).normal(size=(8, WIDE)).astype(np.float32)
    model = _model(0)
    model.fit(x, x, batch_size=8, epochs=1, verbose=0)  # Adam's moments and count: not zero
    ckpt = TrainCheckpointer(tmp_path / "ckpt")
    try:
        ckpt.save(7, model.engine, {"epoch": 0})
        saved = jax.device_get(model.engine.state)
        model.fit(x, x, batch_size=8, epochs=2, verbose=0)
        assert not np.array_equal(model.get_weights()[0], saved["params"]["l1"]["kernel"][...])
        assert ckpt.restore(model.engine) == {"epoch": 0}
    finally:
        ckpt.close()
    # Every leaf as it was at the save: parameters, optimizer state, metric sums.
    restored = jax.device_get(model.engine.state)
    assert jax.tree.structure(restored) == jax.tree.structure(saved)
    jax.tree.map(np.testing.assert_array_equal, restored, saved)


def test_a_checkpoint_orbax_wrote_for_several_processes_restores_in_one(tmp_path):
    # Several processes save with Orbax, one writes files: either restores anywhere, and the
    # numbering, max_to_keep and delete_all see both.
    model = _model(0)
    x = np.random.default_rng(1).normal(size=(8, WIDE)).astype(np.float32)
    model.fit(x, x, batch_size=8, epochs=1, verbose=0)
    ckpt = TrainCheckpointer(tmp_path / "ckpt", max_to_keep=2)
    try:
        # What TrainCheckpointer.save does on several processes, here on one.
        layout = Layout.of(model.engine.state)
        meta = {"record": {"by": "orbax"}, "layout": layout.describe()}
        packed = layout.pack(jax.tree.leaves(model.engine.state))
        ckpt._orbax().save(3, args=ckpt._orbax_args(packed, meta), force=True)
        saved = jax.device_get(model.engine.state)
        model.fit(x, x, batch_size=8, epochs=1, verbose=0)
        ckpt.save(4, model.engine, {"by": "files"}, wait=True)
        after = jax.device_get(model.engine.state)
        assert ckpt.latest_step() == 4 and ckpt._files.is_ours(4) and not ckpt._files.is_ours(3)
        assert ckpt.restore(model.engine, step=3) == {"by": "orbax"}
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(model.engine.state), saved)
        assert ckpt.restore(model.engine) == {"by": "files"}
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(model.engine.state), after)
        ckpt.save(5, model.engine, {"by": "files"}, wait=True)  # max_to_keep=2: the oldest goes
        assert ckpt._files.steps() == [4, 5]
        ckpt.delete_all()
        assert ckpt.latest_step() is None
    finally:
        ckpt.close()
