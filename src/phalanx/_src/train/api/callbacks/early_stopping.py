"""`EarlyStopping`: stop when a monitored metric stops improving."""

from __future__ import annotations

import warnings
from typing import Any

from phalanx._src.train.api.callbacks.base import Callback
from phalanx._src.train.api.callbacks.monitor import MODES, lower_is_better


class EarlyStopping(Callback):
    """Stops training when `monitor` has not improved for `patience` epochs (Keras's rule).

    Each epoch with a value counts toward `wait`; an improvement (better than the best by
    more than `min_delta`) resets it, provided it also beats `baseline` when one is given.
    When `wait >= patience` (and the epoch is not the first), `model.stop_training` is set.

    With `restore_best_weights=True` the model's weights from the best epoch are restored at
    the end of training. This needs the model to provide `get_weights()`, returning a
    host-side snapshot that later steps do not change (e.g. a list of NumPy arrays), and
    `set_weights(snapshot)`.

    Args:
      monitor: the log key to watch, e.g. 'val_loss' or 'accuracy'.
      min_delta: the smallest change that counts as an improvement.
      patience: epochs without improvement before stopping.
      verbose: 1 prints when it stops and restores.
      mode: 'min', 'max', or 'auto' (min for losses and errors, max for accuracy, AUC,
        precision, recall; otherwise the model's metric `direction`).
      baseline: a value the metric must beat for the wait to reset.
      restore_best_weights: restore the best epoch's weights when training ends.
      start_from_epoch: epochs to wait before monitoring starts (warm-up).

    Raises:
      ValueError: for an unknown mode, or mode='auto' on a metric whose direction cannot be
        told (pass mode='min' or 'max').

    Example:
      >>> model.fit(x, y, validation_data=(xv, yv), epochs=100,
      ...           callbacks=[EarlyStopping(patience=3, restore_best_weights=True)])
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0.0,
        patience: int = 0,
        verbose: int = 0,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        start_from_epoch: int = 0,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"EarlyStopping mode must be one of {MODES}, got {mode!r}")
        self.monitor = monitor
        self.min_delta = abs(min_delta)
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.baseline = baseline
        self.restore_best_weights = restore_best_weights
        self.start_from_epoch = start_from_epoch
        self._lower_is_better: bool | None = None
        self._reset()

    def _reset(self) -> None:
        self.wait = 0
        self.stopped_epoch = 0
        self.best: float | None = None
        self.best_weights: Any = None
        self.best_epoch = 0

    def _is_improvement(self, value: float, reference: float | None) -> bool:
        if reference is None:
            return True
        if self._lower_is_better:
            return value - (-self.min_delta) < reference
        return value - self.min_delta > reference

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._reset()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if self._lower_is_better is None:
            self._lower_is_better = lower_is_better(
                self.monitor, self.mode, self.model, "EarlyStopping"
            )
        logs = logs or {}
        current = logs.get(self.monitor)
        if current is None:
            warnings.warn(
                f"EarlyStopping is monitoring {self.monitor!r}, which is not in the logs; "
                f"available keys: {sorted(logs)}",
                stacklevel=2,
            )
            return
        if epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            # Until something improves, the first monitored epoch is the best one.
            self.best_weights = self.model.get_weights()
            self.best_epoch = epoch
        self.wait += 1
        if self._is_improvement(current, self.best):
            self.best = current
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            if self.baseline is None or self._is_improvement(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        if self.stopped_epoch > 0 and self.verbose > 0:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping")
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose > 0:
                print(f"Restoring weights from the end of the best epoch: {self.best_epoch + 1}.")
            self.model.set_weights(self.best_weights)
