"""`ProgbarLogger`: Keras-style progress output, plain text, no threads.

verbose=1 on a terminal: one live progress line per epoch, redrawn with '\\r' whenever the
loop calls a batch hook. verbose=1 when stdout is not a terminal (CI, log files), or
verbose=2: one line per epoch. verbose=0: nothing.

Two log keys are shown specially when the loop provides them: `examples_per_second`
(throughput) and `input_wait_fraction` (share of the time the step waited for input, 0..1).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from phalanx._src.train.callbacks.base import Callback, _check_mode

EXAMPLES_PER_SECOND = "examples_per_second"
INPUT_WAIT_FRACTION = "input_wait_fraction"
_SPECIAL = (EXAMPLES_PER_SECOND, INPUT_WAIT_FRACTION)


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.4e}"
    return str(value)


def _format_rate(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def format_logs(logs: dict[str, Any] | None) -> str:
    """' - name: value' for every metric (training ones first), then throughput and input wait.

    Example:
      >>> format_logs({"loss": 0.25, "val_loss": 0.5, "examples_per_second": 12000.0})
      ' - loss: 0.2500 - val_loss: 0.5000 - 12.0k examples/s'
    """
    logs = logs or {}
    keys = sorted((k for k in logs if k not in _SPECIAL), key=lambda k: (k.startswith("val_"), k))
    parts = [f"{k}: {_format_value(logs[k])}" for k in keys]
    if EXAMPLES_PER_SECOND in logs:
        parts.append(f"{_format_rate(float(logs[EXAMPLES_PER_SECOND]))} examples/s")
    if INPUT_WAIT_FRACTION in logs:
        parts.append(f"input wait {100 * float(logs[INPUT_WAIT_FRACTION]):.0f}%")
    return "".join(f" - {p}" for p in parts)


class ProgbarLogger(Callback):
    """Prints progress and metrics to stdout (Keras's `ProgbarLogger`).

    Args:
      verbose: 0 silent, 1 progress bar (one line per epoch when stdout is not a terminal),
        2 one line per epoch. None: take `params['verbose']` (default 1).
      stream: where to write; default `sys.stdout` at the time of writing.
      width: characters of the bar.

    Example:
      >>> model.fit(x, y, epochs=3, callbacks=[ProgbarLogger(verbose=2)])
      Epoch 1/3 - 58 steps - 1.2s - accuracy: 0.8812 - loss: 0.4210 - 50.1k examples/s
    """

    def __init__(
        self, verbose: int | None = None, stream: TextIO | None = None, width: int = 30
    ) -> None:
        super().__init__()
        self.verbose = verbose
        self.stream = stream
        self.width = width
        self._in_fit = False
        self._logs: dict[str, Any] = {}
        self._seen = 0
        self._start = 0.0
        self._epoch = 0

    # -- configuration -------------------------------------------------------------------------

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout

    @property
    def level(self) -> int:
        """The effective verbosity: 0, 1 (live bar, terminals only) or 2 (line per epoch)."""
        verbose = self.verbose if self.verbose is not None else self.params.get("verbose", 1)
        if verbose == "auto":
            verbose = 1
        verbose = int(verbose)
        if verbose == 1 and not _isatty(self._out()):
            return 2
        return min(max(verbose, 0), 2)

    def uses_batch_hooks(self, mode: str) -> bool:
        _check_mode(mode)
        return self.level == 1

    def batch_logs_interval(self, mode: str) -> int | None:
        return None  # shows whatever the loop fetched last; never forces a sync

    # -- output --------------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        out = self._out()
        out.write(text)
        out.flush()

    def _steps_text(self) -> str:
        target = self.params.get("steps")
        if not target:
            return f"{self._seen}"
        bar_done = int(self.width * min(self._seen, target) / target)
        arrow = ">" if bar_done < self.width else ""
        bar = "=" * bar_done + arrow + "." * (self.width - bar_done - len(arrow))
        return f"{self._seen:>{len(str(target))}}/{target} [{bar}]"

    def _elapsed_text(self) -> str:
        elapsed = time.perf_counter() - self._start
        per_step = elapsed / self._seen * 1e3 if self._seen else 0.0
        return f"{elapsed:.1f}s {per_step:.0f}ms/step"

    def _begin(self) -> None:
        self._seen = 0
        self._logs = {}
        self._start = time.perf_counter()

    def _batch(self, batch: int, logs: dict[str, Any] | None) -> None:
        self._seen = batch + 1
        if logs:
            self._logs = dict(logs)
        if self.level == 1:
            line = f"{self._steps_text()} - {self._elapsed_text()}{format_logs(self._logs)}"
            self._write("\r" + line)

    # -- hooks ----------------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._in_fit = True

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self._in_fit = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._begin()
        self._epoch = epoch
        if self.level == 1:
            self._write(f"Epoch {epoch + 1}/{self.params.get('epochs', '?')}\n")

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._batch(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        level = self.level
        self._seen = max(self._seen, self.params.get("steps") or 0)  # the epoch is complete
        if level == 1:
            self._write(f"\r{self._steps_text()} - {self._elapsed_text()}{format_logs(logs)}\n")
        elif level == 2:
            steps = self.params.get("steps") or self._seen
            elapsed = time.perf_counter() - self._start
            head = f"Epoch {epoch + 1}/{self.params.get('epochs', '?')}"
            steps_text = f" - {steps} steps" if steps else ""
            self._write(f"{head}{steps_text} - {elapsed:.1f}s{format_logs(logs)}\n")

    def on_test_begin(self, logs: dict[str, float] | None = None) -> None:
        if not self._in_fit:
            self._begin()

    def on_test_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        if not self._in_fit:
            self._batch(batch, logs)

    def on_test_end(self, logs: dict[str, float] | None = None) -> None:
        if self._in_fit or self.level == 0:
            return
        prefix = "\r" if self.level == 1 and self._seen else ""
        self._write(f"{prefix}Evaluation - {self._elapsed_text()}{format_logs(logs)}\n")

    def on_predict_begin(self, logs: dict[str, float] | None = None) -> None:
        self._begin()

    def on_predict_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._batch(batch, None)

    def on_predict_end(self, logs: dict[str, float] | None = None) -> None:
        if self.level == 1 and self._seen:
            self._write("\n")


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
