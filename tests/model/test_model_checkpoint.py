"""ModelCheckpoint: when it saves, and what a restore brings back."""

import numpy as np
from conftest import build, make_data

import phalanx
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer


def test_saves_every_epoch_and_restores(all_devices, tmp_path):
    x, y = make_data(64)
    model = build(all_devices, optimizer="adam")
    ckpt = phalanx.callbacks.ModelCheckpoint(tmp_path / "ck", monitor="loss", max_to_keep=2)
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[ckpt])
    checkpointer = TrainCheckpointer(tmp_path / "ck")
    assert checkpointer.latest_step() == 3
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.isdigit()) == ["2", "3"]
    trained = model.get_weights()
    checkpointer.close()
    fresh = build(all_devices, optimizer="adam", seed=5)
    record = fresh.load_checkpoint(tmp_path / "ck")
    assert record["epoch"] == 2
    for a, b in zip(fresh.get_weights(), trained, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fresh.load_checkpoint(tmp_path / "ck", step=2)["epoch"] == 1


def test_save_best_only_and_step_frequency(all_devices, tmp_path):
    x, y = make_data(64)
    model = build(all_devices, optimizer="adam")
    best = phalanx.callbacks.ModelCheckpoint(
        tmp_path / "best", monitor="loss", save_best_only=True, initial_value_threshold=-1.0
    )
    steps = phalanx.callbacks.ModelCheckpoint(tmp_path / "steps", save_freq=3)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[best, steps])
    assert not [p for p in (tmp_path / "best").iterdir() if p.name.isdigit()]
    saved = sorted(int(p.name) for p in (tmp_path / "steps").iterdir() if p.name.isdigit())
    assert saved == [3, 6]
    assert model.train_step_count == 8
