"""`ModelCheckpoint`: Keras's callback, saving Keras files or phalanx checkpoints during `fit`."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import jax

from phalanx._src.train.api.callbacks.base import Callback
from phalanx._src.train.api.callbacks.monitor import lower_is_better
from phalanx._src.train.checkpoint import weights_files
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer, close_for, open_for


class ModelCheckpoint(Callback):
    """Saves the model every epoch (or every `save_freq` steps), with Keras's arguments.

    Two kinds of `filepath`:

    - **A Keras file name** (a Keras model): `'ckpt_{epoch:02d}.weights.h5'` with
      `save_weights_only=True` writes Keras's weights file, `'model_{epoch}.keras'` the
      whole model, as Keras's `ModelCheckpoint` does, loadable by plain Keras and by
      `model.load_weights`. The name is formatted with `epoch` (from 1), `batch` (with an
      int `save_freq`: the steps trained so far; Keras counts within the epoch) and the
      epoch's logs (`'{val_loss:.2f}'`). Each file is written under
      a temporary name and renamed when complete. Nothing is ever deleted.
    - **A directory** (any model): phalanx checkpoints of the whole training state
      (parameters, optimizer state, fit's position), numbered sub-directories of it (the
      epoch number, or the global step with an int `save_freq`), written by Orbax into a
      temporary directory and renamed when complete; replicated state is written once, by
      one process. Restore with `model.load_checkpoint(directory)`. `fit` refuses a
      directory that is a file, cannot be written, or is used by another checkpoint
      callback or job (a lock file names it), before any training step. `max_to_keep`
      deletes only phalanx's checkpoints: other files and folders there are never touched.

    Args:
      filepath: a Keras file name (see above) or a directory.
      monitor: the log key compared by `save_best_only`.
      verbose: 1 prints a line for every save (process 0).
      save_best_only: save only when `monitor` improved on the best value so far.
      save_weights_only: save the weights alone (a `.weights.h5` file name); a directory
        always receives the whole training state.
      mode: 'auto', 'min' or 'max' (see EarlyStopping).
      save_freq: 'epoch', or an int N to save every N training steps.
      initial_value_threshold: the value `monitor` must beat before the first save.
      max_to_keep: (directories) keep only the newest N checkpoints (None: all).

    Raises:
      ValueError: a `save_freq` other than 'epoch' or a positive int; a Keras file name that
        does not fit `save_weights_only`; `save_weights_only` or `max_to_keep` where they
        do not apply; `{...}` fields in a directory name.

    Example:
      >>> model.fit(x, y, epochs=5, callbacks=[
      ...     phalanx.callbacks.ModelCheckpoint("ckpt/ckpt_{epoch}.weights.h5",
      ...                                       save_weights_only=True)])
      >>> model.load_weights("ckpt/ckpt_5.weights.h5")
    """

    def __init__(
        self,
        filepath: str | os.PathLike,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        *,
        max_to_keep: int | None = None,
    ) -> None:
        super().__init__()
        if save_freq != "epoch" and (
            isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1
        ):
            raise ValueError(f"save_freq must be 'epoch' or a positive int, got {save_freq!r}")
        path = os.fspath(filepath)
        self.keras_file = weights_files.is_keras_filename(path)
        _check_path(path, self.keras_file, save_weights_only, max_to_keep)
        self.filepath = path
        self.directory = None if self.keras_file else path
        self.monitor = monitor
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
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
        if self.keras_file:
            weights_files.check_keras_model(self.model, self.filepath, "ModelCheckpoint")
        else:
            self._checkpointer = open_for(self, self.directory, self.max_to_keep)
        self._last_saved = self.model.train_step_count
        self.model.engine.remove_step_hook(self._on_steps)  # left by an interrupted fit
        if isinstance(self.save_freq, int):
            self.model.engine.add_step_hook(self._on_steps)

    def _on_steps(self, steps: int, feed: Any) -> None:
        count = self.model.train_step_count
        if count - self._last_saved >= self.save_freq:
            self._last_saved = count
            self._save(count, self.model.engine.position.epoch, {}, batch=count)

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

    def _save(
        self, number: int, epoch: int, logs: dict[str, float], batch: int | None = None
    ) -> None:
        if self.save_best_only and not self._improved(logs):
            return
        if self.keras_file:
            path = self._format(epoch, batch, logs)
            if self.verbose and jax.process_index() == 0:
                print(f"\nEpoch {epoch + 1}: saving model to {path}")
            save = self.model.save_weights if self.save_weights_only else self.model.save
            save(path)
            return
        record = {"epoch": epoch, "logs": {k: float(v) for k, v in logs.items()}}
        try:
            self._checkpointer.save(number, self.model.engine, record)
        except BaseException:  # a save that failed (a full disk): give the folder back
            checkpointer, self._checkpointer = self._checkpointer, None
            close_for(self, checkpointer)
            raise

    def _format(self, epoch: int, batch: int | None, logs: dict[str, float]) -> str:
        fields = {**logs, "epoch": epoch + 1}
        if batch is not None:
            fields["batch"] = batch
        try:
            return self.filepath.format(**fields)
        except (KeyError, IndexError) as error:
            raise KeyError(
                f"ModelCheckpoint cannot format filepath {self.filepath!r}: no {error} among "
                f"{sorted(fields)}; use {{epoch}}, {{batch}} (with an int save_freq) or a key "
                "of the epoch's logs"
            ) from error

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if self.save_freq == "epoch":
            self._save(epoch + 1, epoch, dict(logs or {}))

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self.model.engine.remove_step_hook(self._on_steps)
        checkpointer, self._checkpointer = self._checkpointer, None
        close_for(self, checkpointer)


def _check_path(path: str, keras_file: bool, weights_only: bool, max_to_keep: Any) -> None:
    """Keras's rules for the file name; phalanx's for a directory (see the class doc)."""
    if keras_file:
        if weights_only and not path.endswith(weights_files.WEIGHTS_SUFFIX):
            raise ValueError(
                f"ModelCheckpoint(save_weights_only=True) writes Keras's weights file, whose "
                f"name must end in '{weights_files.WEIGHTS_SUFFIX}'; got filepath={path!r}"
            )
        if not weights_only and path.endswith(weights_files.WEIGHTS_SUFFIX):
            raise ValueError(
                f"ModelCheckpoint(filepath={path!r}) names a weights file: pass "
                "save_weights_only=True, or a '.keras' name to save the whole model"
            )
        if max_to_keep is not None:
            raise ValueError(
                "ModelCheckpoint(max_to_keep=...) prunes phalanx checkpoint directories; a "
                "Keras file name is never deleted (use {epoch} in it, or one fixed name)"
            )
        return
    if weights_only:
        raise ValueError(
            f"ModelCheckpoint(filepath={path!r}, save_weights_only=True): a directory holds "
            "phalanx checkpoints of the whole training state; weights alone go to Keras's "
            "weights file, whose name ends in '.weights.h5' (as Keras 3 requires), e.g. "
            "filepath='ckpt_{epoch}.weights.h5' (Keras models)"
        )
    if "{" in path:
        raise ValueError(
            f"ModelCheckpoint(filepath={path!r}) is a directory with format fields: a "
            "directory holds numbered phalanx checkpoints by itself, so name it plainly, or "
            "give a Keras model a file name such as 'ckpt_{epoch}.weights.h5'"
        )
