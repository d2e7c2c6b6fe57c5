"""`TensorBoard`: scalar summaries in TensorBoard event files (through tensorboardX), and a
profiler window over chosen training batches (through `jax.profiler`)."""

from __future__ import annotations

import os
from typing import Any

import jax

from phalanx._src.train.api.callbacks._process import is_chief
from phalanx._src.train.api.callbacks.base import Callback, _check_mode


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

    With `profile_batch`, as in Keras, training batches `start..stop` (counted from 1 over the
    whole `fit`, both included) are traced with `jax.profiler`, and the trace is written to
    `log_dir/train/plugins/profile/<time>/`: `<host>.xplane.pb` for TensorBoard's profile
    plugin (`pip install tensorboard-plugin-profile`) and `perfetto_trace.json.gz` for
    https://ui.perfetto.dev. With `steps_per_execution=K` the window widens to whole
    compiled calls of K batches. The device work is waited for before the trace stops, so
    the window holds the traced batches' execution, not only their dispatch.

    Args:
      log_dir: the folder for the event files (`tensorboard --logdir log_dir` reads it).
      update_freq: 'epoch', or an int k for per-batch scalars every k batches.
      profile_batch: 0 (no profiling), a batch number N (that batch), or a pair
        `(start, stop)` of batch numbers.
      profile_all_processes: trace on every process, not only process 0 (process i > 0
        writes under `log_dir/train/process_<i>`).

    Raises:
      ValueError: for an update_freq that is neither 'epoch' nor a positive int, or a bad
        profile_batch.

    Example:
      >>> model.fit(x, y, epochs=5, callbacks=[TensorBoard("runs/mnist")])
      >>> model.fit(x, y, callbacks=[TensorBoard("runs/prof", profile_batch=(3, 6))])
    """

    def __init__(
        self,
        log_dir: str | os.PathLike = "logs",
        update_freq: str | int = "epoch",
        profile_batch: int | tuple[int, int] = 0,
        profile_all_processes: bool = False,
    ):
        super().__init__()
        self._profile_range = _profile_range(profile_batch)
        self.profile_batch = profile_batch
        self.profile_all_processes = profile_all_processes
        self._tracing = False
        self._traced = False
        self._last_end_step = 0
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
        wanted = self.update_freq != "epoch" or self._profile_range is not None
        return _check_mode(mode) == "train" and wanted

    def batch_logs_interval(self, mode: str) -> int | None:
        if _check_mode(mode) != "train" or self.update_freq == "epoch":
            return None
        return self.update_freq  # type: ignore[return-value]

    # -- the profiler window ----------------------------------------------------------------

    def _profiles_here(self) -> bool:
        return self._profile_range is not None and (self.profile_all_processes or is_chief())

    def _profile_dir(self) -> str:
        base = os.path.join(self.log_dir, "train")
        index = jax.process_index()
        return base if index == 0 else os.path.join(base, f"process_{index}")

    def _start_trace(self) -> None:
        jax.profiler.start_trace(self._profile_dir(), create_perfetto_trace=True)
        self._tracing = True

    def _stop_trace(self) -> None:
        state = getattr(getattr(self.model, "engine", None), "state", None)
        if state is not None:
            jax.block_until_ready(state)  # the traced steps' execution, not just their dispatch
        jax.profiler.stop_trace()
        self._tracing = False
        self._traced = True

    def _next_call_starts_window(self, first: int, stride: int) -> bool:
        """Whether the next compiled call, batches first..first+stride-1, enters the window."""
        start, stop = self._profile_range  # type: ignore[misc]
        return not (self._tracing or self._traced) and first <= stop and first + stride > start

    def _calls_stride(self) -> int:
        """Batches per compiled call before any was seen: the model's steps_per_execution."""
        k = getattr(getattr(self.model, "engine", None), "steps_per_call", None)
        try:
            return max(1, int(k(self.params.get("steps")))) if callable(k) else 1
        except (TypeError, ValueError):
            return 1

    def _writer(self, name: str) -> Any:
        writer = self._writers.get(name)
        if writer is None:
            writer = import_tensorboardx().SummaryWriter(os.path.join(self.log_dir, name))
            self._writers[name] = writer
        return writer

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._steps_before_epoch = 0
        self._last_written = 0
        self._traced = False
        self._last_end_step = 0
        if is_chief():
            self._writer("train")
        if self._profiles_here() and self._next_call_starts_window(1, self._calls_stride()):
            self._start_trace()

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._seen_in_epoch = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        # The global step comes from the batch index, so it stays right when the loop calls
        # this hook only every few steps (steps_per_execution) or passes logs only at times.
        self._seen_in_epoch = max(self._seen_in_epoch, batch + 1)
        step = self._steps_before_epoch + batch + 1
        if self._profiles_here():
            # Batch hooks may fire only every K batches, so the window opens before the call
            # that holds its first batch and closes after the call that holds its last.
            stride = step - self._last_end_step if self._last_end_step else self._calls_stride()
            self._last_end_step = step
            if self._tracing and step >= self._profile_range[1]:  # type: ignore[index]
                self._stop_trace()
            elif self._next_call_starts_window(step + 1, max(stride, 1)):
                self._start_trace()
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
        if self._tracing:  # fit ended inside the window
            self._stop_trace()
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


def _profile_range(profile_batch: Any) -> tuple[int, int] | None:
    """Keras's `profile_batch` as `(start, stop)` batch numbers, or None when off."""

    def is_count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if is_count(profile_batch):
        return None if profile_batch == 0 else (profile_batch, profile_batch)
    if (
        isinstance(profile_batch, tuple | list)
        and len(profile_batch) == 2
        and all(is_count(b) and b > 0 for b in profile_batch)
        and profile_batch[0] <= profile_batch[1]
    ):
        return int(profile_batch[0]), int(profile_batch[1])
    raise ValueError(
        f"profile_batch must be 0 (off), a batch number, or a pair (start, stop) of batch "
        f"numbers with 1 <= start <= stop, got {profile_batch!r}; e.g. profile_batch=(3, 6)"
    )
