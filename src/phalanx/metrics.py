"""Metrics with Keras's API whose state is a pytree of sums, merged across replicas by addition."""

from __future__ import annotations

from phalanx._src.train.api.metrics.base import Metric as Metric
from phalanx._src.train.api.metrics.base import MetricState as MetricState
from phalanx._src.train.api.metrics.base import merge_states as merge_states
from phalanx._src.train.api.metrics.confusion import AUC as AUC
from phalanx._src.train.api.metrics.confusion import Precision as Precision
from phalanx._src.train.api.metrics.confusion import Recall as Recall
from phalanx._src.train.api.metrics.mean import Accuracy as Accuracy
from phalanx._src.train.api.metrics.mean import BinaryAccuracy as BinaryAccuracy
from phalanx._src.train.api.metrics.mean import CategoricalAccuracy as CategoricalAccuracy
from phalanx._src.train.api.metrics.mean import Mean as Mean
from phalanx._src.train.api.metrics.mean import MeanAbsoluteError as MeanAbsoluteError
from phalanx._src.train.api.metrics.mean import MeanMetricWrapper as MeanMetricWrapper
from phalanx._src.train.api.metrics.mean import MeanSquaredError as MeanSquaredError
from phalanx._src.train.api.metrics.mean import (
    SparseCategoricalAccuracy as SparseCategoricalAccuracy,
)
from phalanx._src.train.api.metrics.mean import (
    SparseTopKCategoricalAccuracy as SparseTopKCategoricalAccuracy,
)
from phalanx._src.train.api.metrics.mean import TopKCategoricalAccuracy as TopKCategoricalAccuracy
from phalanx._src.train.api.metrics.registry import get as get

__all__ = [
    "AUC",
    "Accuracy",
    "BinaryAccuracy",
    "CategoricalAccuracy",
    "Mean",
    "MeanAbsoluteError",
    "MeanMetricWrapper",
    "MeanSquaredError",
    "Metric",
    "MetricState",
    "Precision",
    "Recall",
    "SparseCategoricalAccuracy",
    "SparseTopKCategoricalAccuracy",
    "TopKCategoricalAccuracy",
    "get",
    "merge_states",
]
