"""Which way a monitored log value improves (shared by EarlyStopping and ModelCheckpoint)."""

from __future__ import annotations

from typing import Any

MODES = ("auto", "min", "max")
# Name fragments that settle mode='auto' (Keras decides from the metric's direction).
_LOWER_IS_BETTER = ("loss", "error", "mse", "mae", "crossentropy", "hinge")
_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall")


def lower_is_better(monitor: str, mode: str, model: Any, owner: str) -> bool:
    """True when smaller values of `monitor` are better.

    `mode` 'min'/'max' decides; 'auto' asks the model's metric of that name for its
    `direction`, then falls back to Keras's name rule (losses and errors down, accuracies
    up).

    Raises:
      ValueError: when mode='auto' cannot tell; the message names `owner`.
    """
    if mode not in MODES:
        raise ValueError(f"{owner}: mode must be one of {MODES}, got {mode!r}")
    if mode != "auto":
        return mode == "min"
    name = monitor.removeprefix("val_").lower()
    for metric in getattr(model, "metrics", None) or ():
        if getattr(metric, "name", None) == name and hasattr(metric, "direction"):
            return metric.direction == "down"
    if any(fragment in name for fragment in _LOWER_IS_BETTER):
        return True
    if any(fragment in name for fragment in _HIGHER_IS_BETTER):
        return False
    raise ValueError(
        f"{owner}(monitor={monitor!r}) cannot tell whether that metric should be minimized "
        "or maximized; pass mode='min' or mode='max'"
    )
