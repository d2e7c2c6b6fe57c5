"""`TensorBoard`: scalar summaries in TensorBoard event files, through tensorboardX."""

from __future__ import annotations

import os
from typing import Any

from phalanx._src.train.callbacks._process import is_chief
from phalanx._src.train.callbacks.base import Callback, _check_mode


def import_tensorboardx() -> Any:
    """Imports tensorboardX (lazily: only the writing process needs it) without letting it
    change the user's environment: its import sets CRC32C_SW_MODE, read only at that time."""
    key = "CRC32C_SW_MODE"
    before = os.environ.get(key)
    try:
        import tensorboardX
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    return tensorboardX


class TensorBoard(Callback):
    """Writes the logs as TensorBoard scalars (Keras's layout), without TensorFlow.

    Epoch values go to `log_dir/train` as 'epoch_<name>' and validation values ('val_<name>')
    to `log_dir/validation` as 'epoch_<name>', at step = epoch. With `update_freq=k`, training
    batch logs are also written as 'batch_<name>' every k batches, at the global batch count
    (this makes the loop fetch logs every k batches; the step is the global batch count, so it
    stays right when the loop calls batch hooks only every few steps). Only process 0 writes.

    Args:
      log_dir: the folder for the event files (`tensorboard --logdir log_dir` reads it).
      update_freq: 'epoch', or an int k for per-batch scalars every k batches.

    Raises:
      ValueError: for an update_freq that is neither 'epoch' nor a positive int.

    Example:
      >>> model.fit(x, y, epochs=5, callbacks=[TensorBoard("runs/mnist")])
    """

    def __init__(self, log_dir: str | os.PathLike = "logs", update_freq: str | int = "epoch"):
        super().__init__()
        if update_freq == "batch":
            update_freq = 1
        if update_freq != "epoch" and not (
            isinstance(update_freq, int) and not isinstance(update_freq, bool) and update_freq > 0
        ):
            raise ValueError(
                f"update_freq must be 'epoch' or a positive int, got {update_freq!r}; e.g. "
                "update_freq=100 to write batch scalars every 100 batches"
            )
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self._writers: dict[str, Any] = {}
        self._steps_before_epoch = 0
        self._seen_in_epoch = 0
        self._last_written = 0

    def uses_batch_hooks(self, mode: str) -> bool:
        return _check_mode(mode) == "train" and self.update_freq != "epoch"

    def batch_logs_interval(self, mode: str) -> int | None:
        return self.update_freq if self.uses_batch_hooks(mode) else None  # type: ignore[return-value]

    def _writer(self, name: str) -> Any:
        writer = self._writers.get(name)
        if writer is None:
            writer = import_tensorboardx().SummaryWriter(os.path.join(self.log_dir, name))
            self._writers[name] = writer
        return writer

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._steps_before_epoch = 0
        self._last_written = 0
        if is_chief():
            self._writer("train")

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._seen_in_epoch = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        # The global step comes from the batch index, so it stays right when the loop calls
        # this hook only every few steps (steps_per_execution) or passes logs only at times.
        self._seen_in_epoch = max(self._seen_in_epoch, batch + 1)
        step = self._steps_before_epoch + batch + 1
        if self.update_freq == "epoch" or not is_chief() or not logs:
            return
        if step - self._last_written < self.update_freq:  # type: ignore[operator]
            return
        self._last_written = step
        writer = self._writer("train")
        for name, value in logs.items():
            if isinstance(value, float):
                writer.add_scalar(f"batch_{name}", value, step)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._steps_before_epoch += self.params.get("steps") or self._seen_in_epoch
        if not is_chief():
            return
        for name, value in (logs or {}).items():
            if not isinstance(value, float):
                continue
            split = "validation" if name.startswith("val_") else "train"
            tag = "epoch_" + name.removeprefix("val_")
            self._writer(split).add_scalar(tag, value, epoch)
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
