"""`TerminateOnNaN`: stop training when the loss becomes NaN or infinite."""

from __future__ import annotations

import math

from phalanx._src.train.api.callbacks.base import Callback


class TerminateOnNaN(Callback):
    """Sets `model.stop_training = True` when the logged loss is NaN or inf.

    It checks every set of batch logs the loop fetches (it does not force a fetch per
    batch) and the epoch logs, so a NaN is caught at the next fetch at the latest.

    Example:
      >>> model.fit(x, y, callbacks=[TerminateOnNaN()])
    """

    def batch_logs_interval(self, mode: str) -> int | None:
        return None

    def _check(self, where: str, logs: dict[str, float] | None) -> None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            print(f"{where}: invalid loss {loss}, terminating training")
            self.model.stop_training = True

    def on_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._check(f"Batch {batch}", logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._check(f"Epoch {epoch + 1}", logs)
