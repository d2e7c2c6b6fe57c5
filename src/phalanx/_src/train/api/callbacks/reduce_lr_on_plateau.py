"""`ReduceLROnPlateau`: lower the learning rate when a monitored metric stops improving."""

from __future__ import annotations

import warnings

import numpy as np

from phalanx._src.train.api.callbacks.base import Callback
from phalanx._src.train.api.callbacks.monitor import MODES, lower_is_better


class ReduceLROnPlateau(Callback):
    """Multiplies the learning rate by `factor` after `patience` epochs without improvement.

    Keras's rule, number for number: at each epoch end, an epoch in cooldown counts the
    cooldown down and clears `wait`; a value better than the best by more than `min_delta`
    becomes the best and clears `wait`; otherwise, outside cooldown, `wait` grows, and when
    it reaches `patience` the rate becomes `max(lr * factor, min_lr)` (if it is still above
    `min_lr`), `wait` is cleared and `cooldown` epochs of cooldown begin. The new rate is
    set with `model.learning_rate = ...` and applies from the next step; the rate in effect
    during the epoch is added to its logs as 'learning_rate'.

    Args:
      monitor: the log key to watch, e.g. 'val_loss'.
      factor: the multiplier, < 1.
      patience: epochs without improvement before the rate is lowered.
      verbose: 1 prints each reduction.
      mode: 'min', 'max', or 'auto' (as EarlyStopping decides).
      min_delta: the smallest change that counts as an improvement.
      cooldown: epochs to wait after a reduction before counting again.
      min_lr: the lowest rate it sets.

    Raises:
      ValueError: `factor >= 1`, or an unknown mode.

    Example:
      >>> model.fit(x, y, validation_data=(xv, yv), epochs=50,
      ...           callbacks=[ReduceLROnPlateau(factor=0.5, patience=3, min_lr=1e-5)])
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: int = 0,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
    ) -> None:
        super().__init__()
        if factor >= 1.0:
            raise ValueError(
                f"ReduceLROnPlateau does not support a factor >= 1.0, got factor={factor}; "
                "use e.g. factor=0.1 to divide the rate by 10"
            )
        if mode not in MODES:
            raise ValueError(f"ReduceLROnPlateau mode must be one of {MODES}, got {mode!r}")
        self.monitor = monitor
        self.factor = factor
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.min_delta = abs(min_delta)
        self.cooldown = cooldown
        self.min_lr = min_lr
        self._lower_is_better: bool | None = None
        self._reset()

    def _reset(self) -> None:
        self.best: float | None = None
        self.cooldown_counter = 0
        self.wait = 0

    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def _is_improvement(self, value: float) -> bool:
        if self.best is None:
            return True
        if self._lower_is_better:
            return value + self.min_delta < self.best
        return value - self.min_delta > self.best

    def _learning_rate(self) -> float:
        if not hasattr(self.model, "learning_rate"):
            raise ValueError(
                "ReduceLROnPlateau needs a model with a `learning_rate` property (get and "
                f"set); {type(self.model).__name__} has none"
            )
        return float(self.model.learning_rate)

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._reset()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if self._lower_is_better is None:
            self._lower_is_better = lower_is_better(
                self.monitor, self.mode, self.model, "ReduceLROnPlateau"
            )
        logs = logs if logs is not None else {}
        logs["learning_rate"] = self._learning_rate()
        current = logs.get(self.monitor)
        if current is None:
            warnings.warn(
                f"ReduceLROnPlateau is monitoring {self.monitor!r}, which is not in the logs; "
                f"available keys: {sorted(logs)}",
                stacklevel=2,
            )
            return
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        if self._is_improvement(current):
            self.best = current
            self.wait = 0
            return
        if self.in_cooldown():
            return
        self.wait += 1
        if self.wait < self.patience:
            return
        old_lr = self._learning_rate()
        if old_lr > np.float32(self.min_lr):  # as Keras compares: float32 rates stop here
            new_lr = max(old_lr * self.factor, self.min_lr)
            self.model.learning_rate = new_lr
            if self.verbose > 0:
                print(f"\nEpoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {new_lr}.")
            self.cooldown_counter = self.cooldown
            self.wait = 0
