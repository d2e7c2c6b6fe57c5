"""`ProgbarLogger`: Keras-style progress output; a live `rich` bar on terminals, plain lines
elsewhere.

verbose=1 on a terminal: a live bar per epoch drawn with rich (steps, rate, ETA, the latest
loss and metrics, and the previous epoch's input wait and MFU), redrawn whenever the loop
calls a batch hook, with loss and metrics fetched about 50 times per epoch; when the epoch
ends it gives way to one summary line. verbose=1 when stdout
is not a terminal (CI, log files), or verbose=2: one plain line per epoch, with no control
characters. verbose=0: nothing. No thread is started: the bar is redrawn only from hooks.

Log keys shown specially when the loop provides them: `examples_per_second` (throughput),
`input_wait_fraction` (share of the time the step waited for input, 0..1),
`model_tflops_per_second` and `mfu` (see `phalanx._src.train.engine.flop_rate`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from phalanx._src.train.api.callbacks.base import Callback, _check_mode

EXAMPLES_PER_SECOND = "examples_per_second"
INPUT_WAIT_FRACTION = "input_wait_fraction"
TFLOPS = "model_tflops_per_second"
MFU = "mfu"
# The ledger of transfers (`engine.transfers`): in History and the logs, not on the bar.
TRANSFERS = (
    "host_to_device_mib",
    "host_to_device_arrays",
    "device_to_host_mib",
    "device_to_host_arrays",
)
_SPECIAL = (EXAMPLES_PER_SECOND, INPUT_WAIT_FRACTION, TFLOPS, MFU, *TRANSFERS)
# How often per phase the live bar asks for fresh loss and metric values. Each fetch waits
# for the device, so Keras's every-step fetch would slow small steps; 50 keeps it under ~2 %.
LIVE_UPDATES = 50


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.4e}"
    return str(value)


def _format_rate(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _metric_parts(logs: dict[str, Any]) -> list[str]:
    keys = sorted((k for k in logs if k not in _SPECIAL), key=lambda k: (k.startswith("val_"), k))
    return [f"{k}: {_format_value(logs[k])}" for k in keys]


def _speed_parts(logs: dict[str, Any]) -> list[str]:
    parts = []
    if EXAMPLES_PER_SECOND in logs:
        parts.append(f"{_format_rate(float(logs[EXAMPLES_PER_SECOND]))} examples/s")
    if INPUT_WAIT_FRACTION in logs:
        parts.append(f"input wait {100 * float(logs[INPUT_WAIT_FRACTION]):.0f}%")
    if TFLOPS in logs:
        parts.append(f"{float(logs[TFLOPS]):.3g} TFLOP/s")
    if MFU in logs:
        parts.append(f"MFU {100 * float(logs[MFU]):.1f}%")
    return parts


def format_logs(logs: dict[str, Any] | None) -> str:
    """' - name: value' for every metric (training ones first), then throughput, input wait,
    FLOP rate and MFU.

    Example:
      >>> format_logs({"loss": 0.25, "val_loss": 0.5, "examples_per_second": 12000.0})
      ' - loss: 0.2500 - val_loss: 0.5000 - 12.0k examples/s'
    """
    logs = logs or {}
    return "".join(f" - {p}" for p in _metric_parts(logs) + _speed_parts(logs))


class ProgbarLogger(Callback):
    """Prints progress and metrics to stdout (Keras's `ProgbarLogger`).

    Args:
      verbose: 0 silent, 1 live progress bar (one line per epoch when stdout is not a
        terminal), 2 one line per epoch. None: take `params['verbose']` (default 1).
      stream: where to write; default `sys.stdout` at the time of writing.
      width: characters of the bar.

    Example:
      >>> model.fit(x, y, epochs=3, callbacks=[ProgbarLogger(verbose=2)])
      Epoch 1/3 - 58 steps - 1.2s - accuracy: 0.8812 - loss: 0.4210 - 50.1k examples/s
    """

    async_safe = True  # it only draws what it is given

    def __init__(
        self, verbose: int | None = None, stream: TextIO | None = None, width: int = 30
    ) -> None:
        super().__init__()
        self.verbose = verbose
        self.stream = stream
        self.width = width
        self._in_fit = False
        self._logs: dict[str, Any] = {}
        self._speed: dict[str, Any] = {}  # the last epoch's speed logs, shown on the live bar
        self._seen = 0
        self._start = 0.0
        self._epoch = 0
        self._live: Any = None  # the rich Progress of the current phase, on terminals

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
        """About 50 fresh values per phase on the live bar (a device sync each); none for
        plain lines, which show only the epoch's final logs."""
        if _check_mode(mode) == "predict" or self.level != 1:
            return None
        steps = self.params.get("steps")
        return max(1, steps // LIVE_UPDATES) if steps else LIVE_UPDATES

    # -- plain output --------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        out = self._out()
        out.write(text)
        out.flush()

    def _elapsed_text(self) -> str:
        elapsed = time.perf_counter() - self._start
        per_step = elapsed / self._seen * 1e3 if self._seen else 0.0
        return f"{elapsed:.1f}s {per_step:.0f}ms/step"

    # -- the live bar (rich) ---------------------------------------------------------------------

    def _open_live(self, description: str) -> None:
        from phalanx._src.train.api.callbacks.live_bar import LiveBar

        self._close_live()
        self._live = LiveBar(self._out(), description, self.params.get("steps"), self.width)

    def _close_live(self, summary: str | None = None) -> None:
        if self._live is not None:
            self._live.close(summary)
            self._live = None

    def _live_text(self) -> str:
        return " - ".join(_metric_parts(self._logs) + _speed_parts(self._speed))

    # -- shared --------------------------------------------------------------------------------

    def _begin(self, description: str | None = None) -> None:
        self._seen = 0
        self._logs = {}
        self._start = time.perf_counter()
        if self.level == 1 and description is not None:
            self._open_live(description)

    def _batch(self, batch: int, logs: dict[str, Any] | None) -> None:
        self._seen = batch + 1
        if logs:
            self._logs = dict(logs)
        if self.level == 1 and self._live is not None:
            self._live.update(self._seen, self._live_text)

    # -- hooks ----------------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._in_fit = True
        self._speed = {}

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self._in_fit = False
        self._close_live()

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._epoch = epoch
        self._begin(f"Epoch {epoch + 1}/{self.params.get('epochs', '?')}")

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._batch(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        level = self.level
        self._seen = max(self._seen, self.params.get("steps") or 0)  # the epoch is complete
        logs = logs or {}
        # The live bar's own rate is steps/s; of the epoch's speed logs it shows input wait
        # and MFU (or the FLOP rate where the peak is unknown).
        shown = (INPUT_WAIT_FRACTION, MFU) if MFU in logs else (INPUT_WAIT_FRACTION, TFLOPS)
        self._speed = {k: v for k, v in logs.items() if k in shown}
        if level == 1:
            if self._live is not None:
                self._live.update(self._seen, "")
            self._close_live(f"{self._elapsed_text()}{format_logs(logs)}")
        elif level == 2:
            steps = self.params.get("steps") or self._seen
            elapsed = time.perf_counter() - self._start
            head = f"Epoch {epoch + 1}/{self.params.get('epochs', '?')}"
            steps_text = f" - {steps} steps" if steps else ""
            self._write(f"{head}{steps_text} - {elapsed:.1f}s{format_logs(logs)}\n")

    def on_test_begin(self, logs: dict[str, float] | None = None) -> None:
        if not self._in_fit:
            self._begin("Evaluation")

    def on_test_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        if not self._in_fit:
            self._batch(batch, logs)

    def on_test_end(self, logs: dict[str, float] | None = None) -> None:
        if self._in_fit or self.level == 0:
            return
        summary = f"{self._elapsed_text()}{format_logs(logs)}"
        if self.level == 1 and self._live is not None:
            self._close_live(summary)
        else:
            self._write(f"Evaluation - {summary}\n")

    def on_predict_begin(self, logs: dict[str, float] | None = None) -> None:
        self._begin("Predict")

    def on_predict_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._batch(batch, None)

    def on_predict_end(self, logs: dict[str, float] | None = None) -> None:
        self._close_live(self._elapsed_text() if self._seen else None)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
