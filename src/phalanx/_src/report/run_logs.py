"""A run's per-epoch logs, read back from its CSV (`CSVLogger`) or TensorBoard event files.

TensorBoard's files are read without TensorFlow or TensorBoard: a TFRecord framing (length,
CRC, payload, CRC) around `Event` protocol buffers, parsed with tensorboardX's classes.
"""

from __future__ import annotations

import csv
import os
import struct
from collections.abc import Iterator
from pathlib import Path

CSV_NAMES = ("history.csv", "training.log", "log.csv")


def _csv(path: Path) -> dict[str, list[float]]:
    history: dict[str, list[float]] = {}
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            for key, value in row.items():
                if key == "epoch" or value in (None, "", "NA"):
                    continue
                history.setdefault(key, []).append(float(value))
    return history


def _records(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as file:
        while header := file.read(12):
            if len(header) < 12:
                return  # a record still being written
            (length,) = struct.unpack("<Q", header[:8])
            payload = file.read(length)
            if len(payload) < length or len(file.read(4)) < 4:
                return
            yield payload


def _events(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboardX.proto import event_pb2

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for payload in _records(path):
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                if value.WhichOneof("value") == "simple_value":
                    scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def _tensorboard(root: Path) -> dict[str, list[float]]:
    """Keras's layout: `train/` and `validation/` folders with 'epoch_<name>' scalars."""
    history: dict[str, list[float]] = {}
    for split, prefix in (("train", ""), ("validation", "val_")):
        for tag, by_step in _events(root / split).items():
            if tag.startswith("epoch_"):
                name = prefix + tag.removeprefix("epoch_")
                history[name] = [by_step[s] for s in sorted(by_step)]
    return history


def read_history(run_dir: str | os.PathLike) -> dict[str, list[float]]:
    """The per-epoch logs of a run directory (or of a CSV file / TensorBoard folder).

    Looks for a CSV (`history.csv`, as `phalanx train` writes, or any `*.csv`) first, then
    TensorBoard event files in `train/` and `validation/` (directly or under
    `tensorboard/`).

    Args:
      run_dir: a run directory, a CSV file, or a TensorBoard log folder.

    Returns:
      Metric name -> per-epoch values, validation metrics prefixed 'val_'.

    Raises:
      FileNotFoundError: no CSV or TensorBoard epoch scalars were found.

    Example:
      >>> read_history("runs/mnist-20261122-210000")["loss"]
      [0.31, 0.15, 0.11]
    """
    root = Path(run_dir)
    if root.is_file():
        return _csv(root)
    if root.is_dir():
        csvs = [root / n for n in CSV_NAMES if (root / n).is_file()] or sorted(root.glob("*.csv"))
        if csvs:
            return _csv(csvs[0])
        for folder in (root, root / "tensorboard"):
            history = _tensorboard(folder)
            if history:
                return history
    raise FileNotFoundError(
        f"no training logs in {os.fspath(root)!r}: expected a CSV (CSVLogger, e.g. "
        "history.csv) or TensorBoard event files under train/ and validation/ (the "
        "TensorBoard callback); pass the run directory `phalanx train` printed"
    )
