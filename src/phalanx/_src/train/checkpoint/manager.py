"""`phalanx.CheckpointManager`: numbered checkpoints of a `Checkpoint`, the newest N kept.

As `tf.train.CheckpointManager(checkpoint, directory, max_to_keep)`: `save()` writes the
next checkpoint, `latest_checkpoint` and `checkpoints` name them, and beyond `max_to_keep`
the oldest are deleted. Checkpoints go to `<directory>/<checkpoint_name>/<number>` (TF
writes the files `<directory>/<checkpoint_name>-<number>.*`).

Deletion touches only checkpoints a `CheckpointManager` wrote under this directory and
name: their record says so. A manager made later on the same folder (a resumed run) takes
them over, as TF's does from its state file. A folder where TensorFlow's manager saved
(`ckpt-3.index`... and its `checkpoint` file) resumes from TF's newest until this manager
saves: `checkpoint.restore(manager.latest_checkpoint)` continues a TF run; TF's files are
never deleted. Checkpoints saved by `Checkpoint.save`, fit's
checkpoints and every other file in the folder are never deleted.

Example:
  >>> manager = phalanx.CheckpointManager(checkpoint, "runs/ckpt", max_to_keep=3)
  >>> checkpoint.restore(manager.latest_checkpoint)     # None on the first run: no-op
  >>> for epoch in range(10):
  ...     train_one_epoch()
  ...     manager.save()
"""

from __future__ import annotations

import os
from typing import Any

import jax

from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
from phalanx._src.train.checkpoint.files import Files
from phalanx._src.train.checkpoint.record import CheckpointError
from phalanx._src.train.checkpoint.tf_checkpoint import Checkpoint, barrier, checkpoints_in
from phalanx._src.train.checkpoint.tf_format.state_file import tf_latest

MANAGER = "CheckpointManager"  # the record's `by` for checkpoints a manager wrote
# tf.train.CheckpointManager's other arguments, and what to do instead.
_INSTEAD = {
    "keep_checkpoint_every_n_hours": "to keep some checkpoints for good, save them with "
    "checkpoint.save(another_prefix) (a manager never deletes those)",
    "step_counter": "call manager.save(checkpoint_number=step) when you want a checkpoint",
    "checkpoint_interval": "call manager.save() every N steps yourself (if step % N == 0)",
    "init_fn": "call your initialisation when manager.restore_or_initialize() returns None",
}


class CheckpointManager:
    """Keeps the newest `max_to_keep` checkpoints of `checkpoint` in `directory`.

    Args:
      checkpoint: the `phalanx.Checkpoint` to save.
      directory: the folder of the checkpoints (created at the first save).
      max_to_keep: how many of the manager's checkpoints to keep (None: all).
      checkpoint_name: the name of the sub-folder holding the numbered checkpoints.

    Raises:
      TypeError: when `checkpoint` is not a `phalanx.Checkpoint`, or for TF's other
        arguments (`step_counter`, `checkpoint_interval`, `keep_checkpoint_every_n_hours`,
        `init_fn`), naming what to do instead.
      ValueError: for a `max_to_keep` below 1 or a `checkpoint_name` that is not a plain
        folder name.

    Example:
      >>> manager = phalanx.CheckpointManager(checkpoint, directory="runs", max_to_keep=2)
      >>> path = manager.save()                        # 'runs/ckpt/1'
      >>> manager.latest_checkpoint == path
      True
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        directory: str | os.PathLike,
        max_to_keep: int | None,
        checkpoint_name: str = "ckpt",
        **tf_only: Any,
    ) -> None:
        if tf_only:
            raise TypeError(
                f"CheckpointManager does not take {sorted(tf_only)}: "
                + "; ".join(_INSTEAD.get(k, f"{k} is not a TF argument") for k in sorted(tf_only))
            )
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"CheckpointManager needs a phalanx.Checkpoint, got {type(checkpoint).__name__}; "
                "e.g. CheckpointManager(phalanx.Checkpoint(model=model), directory, max_to_keep=3)"
            )
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
        ):
            raise ValueError(
                f"max_to_keep must be a positive int or None (keep every checkpoint), got "
                f"{max_to_keep!r}; e.g. max_to_keep=3"
            )
        if (
            not isinstance(checkpoint_name, str)
            or not checkpoint_name
            or checkpoint_name.isdigit()
            or checkpoint_name in (".", "..")
            or os.sep in checkpoint_name
            or (os.altsep and os.altsep in checkpoint_name)
        ):
            raise ValueError(
                f"checkpoint_name must be a folder name (not a number, no separators), got "
                f"{checkpoint_name!r}; e.g. checkpoint_name='ckpt'"
            )
        if not isinstance(directory, str | os.PathLike) or not os.fspath(directory):
            raise TypeError(f"directory must be a path (str or os.PathLike), got {directory!r}")
        self._checkpoint = checkpoint
        self._directory = os.path.abspath(os.fspath(directory))
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._max_to_keep = max_to_keep
        self._kept = self._managed()  # (written at, number, path), oldest first

    def _managed(self) -> list[tuple[int, int, str]]:
        """The checkpoints a manager wrote under this prefix (read from their records)."""
        found = checkpoints_in(self._prefix)
        if not found:
            return []
        reader = TrainCheckpointer(self._prefix)
        try:
            mine = []
            for entry in found:
                try:
                    record = reader.record(entry[1])
                except CheckpointError:
                    continue  # damaged: never deleted by a manager, restore reports it
                if record.get("by") == MANAGER:
                    mine.append(entry)
            return mine
        finally:
            reader.close()

    @property
    def directory(self) -> str:
        """The folder given at construction (absolute)."""
        return self._directory

    @property
    def checkpoints(self) -> list[str]:
        """The paths of the kept checkpoints, oldest first."""
        return [path for _, _, path in self._kept]

    @property
    def latest_checkpoint(self) -> str | None:
        """The path of the newest kept checkpoint; before this manager kept any, the newest
        one TensorFlow's `CheckpointManager` recorded in the directory (its `checkpoint`
        state file), so a run trained in TF resumes here; else None."""
        return self._kept[-1][2] if self._kept else tf_latest(self._directory)

    def save(self, checkpoint_number: int | None = None) -> str:
        """Saves the checkpoint's objects, then deletes the oldest managed checkpoints beyond
        `max_to_keep`. All processes must call it.

        Args:
          checkpoint_number: the number in the path; default: the checkpoint's
            `save_counter` after this save (1, 2, ...). Either way `save_counter` grows by 1.

        Returns:
          The new checkpoint's path.

        Raises:
          OSError, CheckpointError: as `Checkpoint.save`.
        """
        counter = self._checkpoint.save_counter + 1
        number = counter if checkpoint_number is None else checkpoint_number
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ValueError(
                f"checkpoint_number must be an int >= 0 (it names the checkpoint's folder), "
                f"got {checkpoint_number!r}; e.g. manager.save(checkpoint_number=step)"
            )
        path = self._checkpoint.save_numbered(self._prefix, number, {"by": MANAGER})
        self._kept = [entry for entry in self._kept if entry[1] != number]
        self._kept.append((os.stat(path).st_mtime_ns, number, path))
        self._sweep()
        return path

    def _sweep(self) -> None:
        if self._max_to_keep is None or len(self._kept) <= self._max_to_keep:
            return
        old, self._kept = self._kept[: -self._max_to_keep], self._kept[-self._max_to_keep :]
        if jax.process_index() == 0:  # one process deletes for the job (a shared folder)
            files = Files(self._prefix)
            for _, number, _ in old:
                files.delete(number)
        barrier("phalanx-checkpoint-manager-deleted")  # no process lists a half-deleted one

    def restore_or_initialize(self) -> str | None:
        """Restores the newest kept checkpoint, if any; returns its path, or None (the
        objects keep their initial values)."""
        latest = self.latest_checkpoint
        self._checkpoint.restore(latest)
        return latest
