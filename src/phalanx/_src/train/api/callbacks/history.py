"""`History`: per-epoch logs, returned by `fit`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from phalanx._src.train.api.callbacks.base import Callback


class History(Callback):
    """Records every epoch's logs; `fit` returns it (Keras's `History`).

    Attributes:
      history: metric name -> list of per-epoch values, e.g. `{'loss': [0.3, 0.2]}`.
      epoch: the epoch indices recorded (0-based).

    Example:
      >>> history = model.fit(x, y, epochs=2)
      >>> history.history["loss"], history.epoch
      ([0.31, 0.17], [0, 1])
      >>> history.plot().savefig("curves.png")  # needs matplotlib (the `plot` extra)
    """

    async_safe = True  # it only records what it is given

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[Any]] = {}
        self.epoch: list[int] = []

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self.epoch = []

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)
        if self.model is not None:
            # Keras sets model.history after each epoch, so it is current even mid-fit.
            self.model.history = self

    def plot(self, keys: Sequence[str] | None = None, title: str | None = None) -> Any:
        """Draws the loss and every metric, training and validation, per epoch.

        matplotlib is imported only here, so training never needs it.

        Args:
          keys: the metrics to draw (names without 'val_'); default: the loss and every
            metric, leaving out the speed logs (examples/s, input wait, FLOP rate, MFU).
          title: the figure's title.

        Returns:
          A `matplotlib.figure.Figure`, one panel per metric.

        Raises:
          ImportError: matplotlib is not installed (`pip install "phalanx[plot]"`).
          ValueError: no epoch was recorded.

        Example:
          >>> figure = model.fit(x, y, epochs=3, validation_data=(xv, yv)).plot()
          >>> figure.savefig("curves.png")
        """
        from phalanx._src.report.curves import plot_history

        return plot_history(self.history, self.epoch, keys=keys, title=title)
