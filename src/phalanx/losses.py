"""Losses with Keras's names: callables returning one float32 loss per example."""

from __future__ import annotations

from phalanx._src.train.api.losses import BinaryCrossentropy as BinaryCrossentropy
from phalanx._src.train.api.losses import CategoricalCrossentropy as CategoricalCrossentropy
from phalanx._src.train.api.losses import FunctionLoss as FunctionLoss
from phalanx._src.train.api.losses import Loss as Loss
from phalanx._src.train.api.losses import MeanAbsoluteError as MeanAbsoluteError
from phalanx._src.train.api.losses import MeanSquaredError as MeanSquaredError
from phalanx._src.train.api.losses import (
    SparseCategoricalCrossentropy as SparseCategoricalCrossentropy,
)
from phalanx._src.train.api.losses import get as get
from phalanx._src.train.api.reduction import Reduction as Reduction

__all__ = [
    "BinaryCrossentropy",
    "CategoricalCrossentropy",
    "FunctionLoss",
    "Loss",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "Reduction",
    "SparseCategoricalCrossentropy",
    "get",
]
