"""phalanx.Checkpoint holding Keras 3 objects: variables saved, restored in place by order
(Keras names layers per model: dense, dense_1...), as `get_weights` / `set_weights` match."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import phalanx
from phalanx._src.train.checkpoint.record import CheckpointError


def test_keras_objects_restore_in_place(tmp_path):

    def build(seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])

    model = build(0)
    path = phalanx.Checkpoint(model=model, epoch=3).save(tmp_path / "ckpt")
    other = build(1)
    checkpoint = phalanx.Checkpoint(model=other, epoch=0)
    checkpoint.restore(path)
    for got, want in zip(other.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert checkpoint.epoch == 3


def test_keras_shapes_that_differ_name_the_variable(tmp_path):
    keras.utils.set_random_seed(0)
    small = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    path = phalanx.Checkpoint(model=small).save(tmp_path / "ckpt")
    wide = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)])
    with pytest.raises(CheckpointError, match=r"entry 'model'.*kernel.*float32\[4, 3\]"):
        phalanx.Checkpoint(model=wide).restore(path)
