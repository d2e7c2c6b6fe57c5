"""Optimizers by Keras name, with Keras's defaults and update rules, as optax transformations."""

from __future__ import annotations

from phalanx._src.train.api.optimizers import ScaleByKerasAdamState as ScaleByKerasAdamState
from phalanx._src.train.api.optimizers import clip_by_norm as clip_by_norm
from phalanx._src.train.api.optimizers import get as get
from phalanx._src.train.api.optimizers import learning_rate as learning_rate
from phalanx._src.train.api.optimizers import scale_by_keras_adam as scale_by_keras_adam
from phalanx._src.train.api.optimizers import set_learning_rate as set_learning_rate

__all__ = [
    "ScaleByKerasAdamState",
    "clip_by_norm",
    "get",
    "learning_rate",
    "scale_by_keras_adam",
    "set_learning_rate",
]
