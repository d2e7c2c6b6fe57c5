"""Keras 3's `metrics` and `weighted_metrics`: which metrics `sample_weight` weighs.

In Keras 3, `sample_weight` (and `class_weight`, which `fit` turns into sample weights)
weighs the loss and the metrics given as `compile(weighted_metrics=...)`; the metrics given
as `compile(metrics=...)` count every example once, whatever the weights. phalanx follows
that rule (padding rows never count in either). A weighted metric whose log name is already
taken by an unweighted one is logged as `weighted_{name}` (`{output}_weighted_{name}` for
one output of several), as Keras names it.

Example:
  >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
  ...               metrics=["accuracy"], weighted_metrics=["accuracy"])
  >>> model.fit(x, y, sample_weight=w)   # logs: loss, accuracy, weighted_accuracy
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from phalanx._src.train.api import multi_output
from phalanx._src.train.api.metrics.base import Metric


def resolve(
    weighted_metrics: Any,
    loss: Any,
    taken: Sequence[str],
    get_metric: Callable[..., Metric],
) -> list[Metric]:
    """`compile(weighted_metrics=...)` as metric objects, renamed as Keras renames them.

    Args:
      weighted_metrics: None, a list of metrics, or (for a model with several outputs) a
        dict `{output: [metrics]}` / a list with one entry per output, as `metrics`.
      loss: the compiled loss (`multi_output.MultiOutputLoss` for several outputs); a
        single loss decides what 'accuracy' means.
      taken: the log names already used (the loss, per-output losses, `metrics`).
      get_metric: `metrics.registry.get`.

    Raises:
      ValueError: a per-output configuration for a single loss, as for `metrics`.
    """
    if not weighted_metrics:
        return []
    if isinstance(loss, multi_output.MultiOutputLoss):
        found = multi_output.per_output_metrics(weighted_metrics, loss, get_metric)
    else:
        if isinstance(weighted_metrics, Mapping):
            raise ValueError(
                f"weighted_metrics is a dict {sorted(weighted_metrics)} but the loss is a "
                "single loss; give a list, e.g. weighted_metrics=['accuracy']"
            )
        base = getattr(loss, "base", loss)  # a loss scaled by loss_weights
        found = [get_metric(m, loss=base) for m in weighted_metrics]
    names = set(taken)
    for metric in found:
        if metric.name in names:
            inner = getattr(metric, "metric", None)  # multi_output.OutputMetric
            if inner is not None:
                output = metric.name[: -len(inner.name)]
                metric.name = f"{output}weighted_{inner.name}"
            else:
                metric.name = f"weighted_{metric.name}"
        names.add(metric.name)
    return found
