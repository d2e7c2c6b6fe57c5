"""`ModelCheckpoint`: save the training state during `fit`, on Orbax, atomically."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from phalanx._src.train.api.callbacks.base import Callback
from phalanx._src.train.api.callbacks.monitor import lower_is_better
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer, close_for, open_for


class ModelCheckpoint(Callback):
    """Saves the model's training state every epoch (or every `save_freq` steps).

    Checkpoints are numbered sub-directories of `directory` (the epoch number, or the global
    step with an int `save_freq`), written by Orbax into a temporary directory and renamed
    when complete, so a crash never leaves a half-written checkpoint. Replicated state is
    written once, by one process. Restore with `TrainCheckpointer(directory).restore(model)`
    or `model.load_checkpoint(directory)`.

    `fit` refuses a `directory` that is a file, cannot be written, is used by another
    checkpoint callback of the same `fit` or by another job (a lock file names it), before
    any training step. `max_to_keep` deletes only checkpoints: other files and folders in
    `directory` are never touched.

    Args:
      directory: where checkpoints go.
      monitor: the log key compared by `save_best_only`.
      save_best_only: save only when `monitor` improved on the best value so far.
      mode: 'auto', 'min' or 'max' (see EarlyStopping).
      save_freq: 'epoch' (checkpoints numbered by epoch, from 1), or an int N to save every
        N training steps (numbered by `model.train_step_count`).
      max_to_keep: keep only the newest N checkpoints (None: all).
      initial_value_threshold: the value `monitor` must beat before the first save.

    Example:
      >>> model.fit(x, y, epochs=5, callbacks=[
      ...     phalanx.callbacks.ModelCheckpoint("runs/ckpt", monitor="val_loss",
      ...                                       save_best_only=True)])
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        monitor: str = "val_loss",
        save_best_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        max_to_keep: int | None = None,
        initial_value_threshold: float | None = None,
    ) -> None:
        super().__init__()
        if save_freq != "epoch" and (not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"save_freq must be 'epoch' or a positive int, got {save_freq!r}")
        self.directory = os.fspath(directory)
        self.monitor = monitor
        self.save_best_only = save_best_only
        self.mode = mode
        self.save_freq = save_freq
        self.max_to_keep = max_to_keep
        self.best = initial_value_threshold
        self._checkpointer: TrainCheckpointer | None = None
        self._last_saved = 0

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._lower = lower_is_better(self.monitor, self.mode, self.model, "ModelCheckpoint")
        close_for(self, self._checkpointer)  # the last fit was interrupted: give it back
        self._checkpointer = None
        self._checkpointer = open_for(self, self.directory, self.max_to_keep)
        self._last_saved = self.model.train_step_count
        self.model.engine.remove_step_hook(self._on_steps)  # left by an interrupted fit
        if isinstance(self.save_freq, int):
            self.model.engine.add_step_hook(self._on_steps)

    def _on_steps(self, steps: int, feed: Any) -> None:
        count = self.model.train_step_count
        if count - self._last_saved >= self.save_freq:
            self._last_saved = count
            self._save(count, self.model.engine.position.epoch, {})

    def _improved(self, logs: dict[str, float]) -> bool:
        value = logs.get(self.monitor)
        if value is None or math.isnan(value):
            warnings.warn(
                f"ModelCheckpoint(save_best_only=True) found no {self.monitor!r} in the logs "
                f"(keys: {sorted(logs)}); nothing saved",
                stacklevel=3,
            )
            return False
        if self.best is None or (value < self.best if self._lower else value > self.best):
            self.best = value
            return True
        return False

    def _save(self, number: int, epoch: int, logs: dict[str, float]) -> None:
        if self.save_best_only and not self._improved(logs):
            return
        record = {"epoch": epoch, "logs": {k: float(v) for k, v in logs.items()}}
        try:
            self._checkpointer.save(number, self.model.engine, record)
        except BaseException:  # a save that failed (a full disk): give the folder back
            checkpointer, self._checkpointer = self._checkpointer, None
            close_for(self, checkpointer)
            raise

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if self.save_freq == "epoch":
            self._save(epoch + 1, epoch, dict(logs or {}))

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self.model.engine.remove_step_hook(self._on_steps)
        checkpointer, self._checkpointer = self._checkpointer, None
        close_for(self, checkpointer)
