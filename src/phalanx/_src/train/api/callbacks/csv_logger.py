"""`CSVLogger`: one CSV row of logs per epoch."""

from __future__ import annotations

import csv
import os
from typing import Any, TextIO

from phalanx._src.train.api.callbacks._process import is_chief
from phalanx._src.train.api.callbacks.base import Callback


class CSVLogger(Callback):
    """Streams epoch results to a CSV file (Keras's `CSVLogger`).

    Columns are 'epoch' then the metric names of the first epoch, sorted (with 'val_'
    columns added up front when validation has not run yet, so a later validation epoch
    fits). Missing values are written as 'NA'. Only process 0 writes; the file is flushed
    after every row and closed at the end of training.

    Args:
      filename: the CSV file; its folder is created if needed.
      separator: the field delimiter.
      append: append to an existing file (writing the header only if it is empty) instead
        of overwriting it; useful when resuming.

    Example:
      >>> model.fit(x, y, epochs=10, callbacks=[CSVLogger("runs/train.csv")])
    """

    async_safe = True  # it only records what it is given

    def __init__(self, filename: str | os.PathLike, separator: str = ",", append: bool = False):
        super().__init__()
        self.filename = os.fspath(filename)
        self.sep = separator
        self.append = append
        self.keys: list[str] | None = None
        self._file: TextIO | None = None
        self._writer: csv.DictWriter | None = None
        self._write_header = True

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        if not is_chief():
            return
        folder = os.path.dirname(self.filename)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._write_header = True
        if self.append and os.path.exists(self.filename):
            with open(self.filename, encoding="utf-8") as f:
                self._write_header = not f.readline()
        self._file = open(self.filename, "a" if self.append else "w", newline="", encoding="utf-8")  # noqa: SIM115
        self.keys = None
        self._writer = None

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if self._file is None:
            return
        logs = logs or {}
        if self.keys is None:
            self.keys = sorted(logs)
            if self.keys and not any(k.startswith("val_") for k in self.keys):
                self.keys += ["val_" + k for k in self.keys]
        if self._writer is None:
            self._writer = csv.DictWriter(
                self._file, fieldnames=["epoch", *self.keys], delimiter=self.sep
            )
            if self._write_header:
                self._writer.writeheader()
        row: dict[str, Any] = {"epoch": epoch}
        row.update((k, logs.get(k, "NA")) for k in self.keys)
        self._writer.writerow(row)
        self._file.flush()

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._writer = None
