"""phalanx.Checkpoint / CheckpointManager / latest_checkpoint, used as TF's tutorials use
tf.train.Checkpoint: NNX objects, metrics and counters saved on 8 replicas and restored on 1
and 3; a kill during a save keeps the previous checkpoint; max_to_keep deletes only what a
manager wrote; a checkpoint that does not fit names the entry."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx
from phalanx._src.train.checkpoint import files as files_module
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
from phalanx._src.train.checkpoint.record import CheckpointError


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, hidden: int = 8):
        self.l1 = nnx.Linear(6, hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _objects(devices, seed=0, hidden=8, steps=0):
    """A model, its Adam optimizer after `steps` steps and a metric, replicated on `devices`
    (built and trained on one device: eager ops on a mesh compile one by one)."""
    model = MLP(nnx.Rngs(seed), hidden)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    accuracy = phalanx.metrics.SparseCategoricalAccuracy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    y = np.abs(x[:, :3]).argmax(1)
    for _ in range(steps):
        grads = nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(
            model
        )
        optimizer.update(model, grads)
    if steps:
        accuracy.update_state(y, model(x))
    return phalanx.Strategy(devices=devices).replicate((model, optimizer, accuracy))


def _leaves(*objects):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(objects))]


@pytest.mark.parametrize("replicas", [1, 3])
def test_saved_on_all_replicas_restores_on_fewer(tmp_path, replicas):
    model, optimizer, accuracy = _objects(jax.devices(), steps=2)
    assert model.l1.kernel[...].sharding.mesh.devices.size == jax.device_count()
    checkpoint = phalanx.Checkpoint(
        model=model, optimizer=optimizer, accuracy=accuracy, step=7, seen=jnp.int32(96)
    )
    prefix = os.path.join(tmp_path, "ckpt")
    path = checkpoint.save(prefix)
    assert path == os.path.join(tmp_path, "ckpt", "1")
    assert checkpoint.save_counter == 1
    assert phalanx.latest_checkpoint(tmp_path) == path

    devices = jax.devices()[:replicas]
    model2, optimizer2, accuracy2 = _objects(devices, seed=1)
    restored = phalanx.Checkpoint(
        model=model2, optimizer=optimizer2, accuracy=accuracy2, step=0, seen=jnp.int32(0)
    )
    assert restored.save_counter == 0
    restored.restore(phalanx.latest_checkpoint(tmp_path)).assert_consumed()

    for got, want in zip(_leaves(model2, optimizer2), _leaves(model, optimizer), strict=True):
        np.testing.assert_array_equal(got, want)
    assert int(optimizer2.step[...]) == 2
    assert float(accuracy2.result()) == float(accuracy.result())
    assert restored.step == 7 and type(restored.step) is int
    assert int(restored.seen) == 96 and restored.save_counter == 1
    kernel = model2.l1.kernel[...]
    assert kernel.sharding.mesh.devices.size == replicas  # placed as the receiving model is
    assert kernel.sharding.is_fully_replicated


def test_save_counts_and_attributes_are_settable(tmp_path):
    model, optimizer, _ = _objects(jax.devices()[:1])
    checkpoint = phalanx.Checkpoint(model=model, step=0)
    prefix = os.path.join(tmp_path, "run", "ckpt")
    for _ in range(3):
        checkpoint.step += 1
        checkpoint.save(prefix)
    assert checkpoint.save_counter == 3
    assert sorted(os.listdir(os.path.join(tmp_path, "run", "ckpt"))) == ["1", "2", "3"]
    # latest_checkpoint finds the newest one below the folder, as TF's does for a prefix.
    assert phalanx.latest_checkpoint(os.path.join(tmp_path, "run")).endswith(
        os.path.join("ckpt", "3")
    )
    checkpoint.optimizer = optimizer  # entries can be added later, as in TF
    assert checkpoint.optimizer is optimizer
    fresh = phalanx.Checkpoint(model=model, step=0)
    fresh.restore(os.path.join(prefix, "2"))
    assert fresh.step == 2 and fresh.save_counter == 2


def test_objects_on_different_devices_are_saved_together_and_stay_put(tmp_path):
    on_one = nnx.Linear(2, 2, rngs=nnx.Rngs(0))  # built outside any scope: one device
    with phalanx.Strategy(devices=jax.devices()[:3]).scope():
        metric = phalanx.metrics.Mean()
    metric.update_state(jnp.array([1.0, 2.0, 6.0]))
    checkpoint = phalanx.Checkpoint(model=on_one, metric=metric, seen=np.int64(3))
    path = checkpoint.save(tmp_path / "ckpt")
    metric.reset_state()
    before = (on_one.kernel[...].sharding, metric.total[...].sharding)
    checkpoint.restore(path)
    assert float(metric.result()) == 3.0 and checkpoint.seen == 3
    assert isinstance(checkpoint.seen, np.int64)
    assert (on_one.kernel[...].sharding, metric.total[...].sharding) == before


def test_restore_none_restores_nothing_as_tf(tmp_path):
    assert phalanx.latest_checkpoint(tmp_path) is None
    assert phalanx.latest_checkpoint(os.path.join(tmp_path, "missing")) is None
    model, _, _ = _objects(jax.devices()[:1])
    before = _leaves(model)
    status = phalanx.Checkpoint(model=model).restore(phalanx.latest_checkpoint(tmp_path))
    status.expect_partial()
    with pytest.raises(AssertionError, match="nothing was restored"):
        status.assert_consumed()
    for got, want in zip(_leaves(model), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_restoring_other_shapes_names_the_entry_and_changes_nothing(tmp_path):
    model, optimizer, _ = _objects(jax.devices()[:2])
    path = phalanx.Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt")
    wide, wide_opt, _ = _objects(jax.devices()[:1], hidden=5)
    before = _leaves(wide, wide_opt)
    with pytest.raises(CheckpointError) as caught:
        phalanx.Checkpoint(model=wide, optimizer=wide_opt).restore(path)
    message = str(caught.value)
    assert "entry 'model'" in message and "['l1']['bias']" in message
    assert "float32[8]" in message and "float32[5]" in message
    for got, want in zip(_leaves(wide, wide_opt), before, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(CheckpointError, match=r"entries \['model', 'optimizer'\].*\['model'\]"):
        phalanx.Checkpoint(model=model).restore(path)
    with pytest.raises(FileNotFoundError, match=r"holds checkpoints \[1\]"):
        phalanx.Checkpoint(model=model).restore(tmp_path / "ckpt" / "9")
    with pytest.raises(FileNotFoundError, match="latest_checkpoint"):
        phalanx.Checkpoint(model=model).restore(tmp_path / "ckpt")


def test_bad_entries_are_refused_by_name():
    with pytest.raises(TypeError, match=r"cannot save step='seven'.*holds a str"):
        phalanx.Checkpoint(step="seven")
    with pytest.raises(ValueError, match="'restore'"):
        phalanx.Checkpoint(restore=1)
    with pytest.raises(ValueError, match="'save_counter'"):
        phalanx.Checkpoint(save_counter=1)
    with pytest.raises(AttributeError, match=r"no entry 'modle'; its entries: \['step'\]"):
        phalanx.Checkpoint(step=1).modle  # noqa: B018
    with pytest.raises(ValueError, match="max_to_keep must be a positive int"):
        phalanx.CheckpointManager(phalanx.Checkpoint(step=1), "runs", max_to_keep=0)
    with pytest.raises(TypeError, match=r"\['checkpoint_interval'\].*every N steps"):
        phalanx.CheckpointManager(
            phalanx.Checkpoint(step=1), "runs", max_to_keep=1, checkpoint_interval=10
        )
    with pytest.raises(TypeError, match=r"needs a phalanx\.Checkpoint"):
        phalanx.CheckpointManager({"step": 1}, "runs", max_to_keep=1)


def test_manager_keeps_the_newest_and_deletes_only_its_own(tmp_path):
    model, optimizer, _ = _objects(jax.devices()[:1])
    checkpoint = phalanx.Checkpoint(model=model, optimizer=optimizer, step=0)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "50").mkdir()  # a numbered folder phalanx did not write
    (folder / "50" / "data.csv").write_text("1,2")
    by_hand = checkpoint.save(folder)  # Checkpoint.save, not the manager: never deleted
    manager = phalanx.CheckpointManager(checkpoint, tmp_path, max_to_keep=2)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    paths = []
    for step in range(4):
        checkpoint.step = step
        paths.append(manager.save())
    assert paths == [os.path.join(tmp_path, "ckpt", str(n)) for n in (2, 3, 4, 5)]
    assert manager.checkpoints == paths[-2:]
    assert manager.latest_checkpoint == paths[-1]
    assert phalanx.latest_checkpoint(tmp_path) == paths[-1]
    left = sorted(os.listdir(folder))
    assert "notes.txt" in left and os.path.isfile(folder / "50" / "data.csv")
    assert os.path.isdir(by_hand)
    assert not any(os.path.exists(old) for old in paths[:2])
    # A resumed run's manager takes over the managed checkpoints, and only those.
    resumed = phalanx.CheckpointManager(checkpoint, tmp_path, max_to_keep=1)
    assert resumed.checkpoints == paths[-2:]
    resumed.save(checkpoint_number=100)
    assert resumed.checkpoints == [os.path.join(tmp_path, "ckpt", "100")]
    assert os.path.isdir(by_hand) and os.path.isfile(folder / "notes.txt")
    fresh = phalanx.Checkpoint(model=model, optimizer=optimizer, step=-1)
    assert resumed.restore_or_initialize() == os.path.join(tmp_path, "ckpt", "100")
    fresh.restore(resumed.latest_checkpoint)
    assert fresh.step == 3


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, _, _ = _objects(jax.devices()[:1])
    checkpoint = phalanx.Checkpoint(model=model, step=1)
    first = checkpoint.save(tmp_path / "ckpt")
    real = files_module._write

    def full_disk(path, data):
        if path.name.endswith(".bin"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(files_module, "_write", full_disk)
    checkpoint.step = 2
    with pytest.raises(OSError, match="could not write checkpoint 2"):
        checkpoint.save(tmp_path / "ckpt")
    monkeypatch.undo()
    assert os.listdir(tmp_path / "ckpt") == ["1"]
    assert phalanx.latest_checkpoint(tmp_path) == first
    restored = phalanx.Checkpoint(model=model, step=0)
    restored.restore(phalanx.latest_checkpoint(tmp_path))
    assert restored.step == 1


_KILLED_MID_SAVE = """
import os, signal, sys
import jax
from flax import nnx
import phalanx
from phalanx._src.train.checkpoint import files

model = nnx.Linear(6, 3, rngs=nnx.Rngs(0))
checkpoint = phalanx.Checkpoint(model=model, step=1)
checkpoint.save(os.path.join(sys.argv[1], "ckpt"))
real = files._write

def die_after_first_array(path, data):
    real(path, data)
    os.kill(os.getpid(), signal.SIGKILL)  # the process dies with one array written

files._write = die_after_first_array
checkpoint.step = 2
checkpoint.save(os.path.join(sys.argv[1], "ckpt"))
"""


def test_a_kill_during_a_save_leaves_the_previous_checkpoint(child_env, tmp_path):
    script = tmp_path / "save.py"
    script.write_text(textwrap.dedent(_KILLED_MID_SAVE))
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=child_env,
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == -9, run.stderr.decode()[-2000:]
    leftovers = os.listdir(tmp_path / "ckpt")
    assert "1" in leftovers and "2" not in leftovers
    assert any(".phalanx-tmp-" in name for name in leftovers)  # the interrupted save's
    latest = phalanx.latest_checkpoint(tmp_path)
    assert latest == os.path.join(tmp_path, "ckpt", "1")
    model = nnx.Linear(6, 3, rngs=nnx.Rngs(5))
    checkpoint = phalanx.Checkpoint(model=model, step=0)
    checkpoint.restore(latest)
    assert checkpoint.step == 1
    np.testing.assert_array_equal(model.kernel[...], nnx.Linear(6, 3, rngs=nnx.Rngs(0)).kernel[...])
    # The dead process's lock is taken over; the next save is number 2.
    assert checkpoint.save(tmp_path / "ckpt") == os.path.join(tmp_path, "ckpt", "2")


def test_a_compiled_phalanx_model_is_saved_whole(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype(np.float32)
    y = np.abs(x[:, :3]).argmax(1).astype(np.int32)

    def compiled(seed, devices):
        with phalanx.Strategy(devices=devices).scope():
            model = phalanx.Model(MLP(nnx.Rngs(seed)))
            model.compile("adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    trained = compiled(0, jax.devices()[:2])
    trained.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = phalanx.Checkpoint(model=trained).save(tmp_path / "ckpt")
    other = compiled(1, jax.devices()[:1])
    # fit's own checkpoints are neither listed nor restored as Checkpoint's.
    fit_checkpoints = TrainCheckpointer(tmp_path / "fit")
    fit_checkpoints.save(1, trained.engine, {"epoch": 1}, wait=True)
    fit_checkpoints.close()
    assert phalanx.latest_checkpoint(tmp_path / "fit") is None
    with pytest.raises(CheckpointError, match=r"fit checkpoint.*model\.load_checkpoint"):
        phalanx.Checkpoint(model=other).restore(tmp_path / "fit" / "1")
    with pytest.raises(ValueError, match="not compiled yet"):
        phalanx.Checkpoint(model=phalanx.Model(MLP(nnx.Rngs(0)))).save(tmp_path / "x")
    phalanx.Checkpoint(model=other).restore(path)
    # The whole training state: parameters, Adam's moments and count, metric sums.
    got, want = jax.tree.leaves(other.engine.state), jax.tree.leaves(trained.engine.state)
    assert len(got) == len(want) > 10
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert got[0].sharding.mesh.devices.size == 1
