"""`BackupAndRestore`: an interrupted `fit` resumes where it stopped."""

from __future__ import annotations

import os
import shutil
from typing import Any

import jax

from phalanx._src.train.api.callbacks.base import Callback
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer


class BackupAndRestore(Callback):
    """Backs up the whole training state, and restores it when `fit` starts again.

    Keras's semantics: at the end of every epoch (or every `save_freq` steps) the model's
    train state, the epoch and the data iterator's position are written to `backup_dir`, in
    the background while training goes on. When the job gets SIGTERM (a scheduler's stop or
    preemption), every process backs up at the same step and exits with status 143; run
    the same command again to resume from that step.
    When `fit` is called again with this callback after an interruption, it restores them
    and continues: a 10-epoch `fit` interrupted at the start of epoch 4 runs epochs 4..9.
    The data iterator resumes exactly where it was (for checkpointable sources such as
    phalanx datasets), so the resumed run sees the batches an uninterrupted one would.
    After a `fit` that finishes, the backup is deleted (`delete_checkpoint=True`).

    Args:
      backup_dir: the directory for the backup (a checkpoint sub-directory per save).
      save_freq: 'epoch', or an int N to back up every N training steps as well.
      delete_checkpoint: delete the backup when training ends normally.

    Example:
      >>> backup = phalanx.callbacks.BackupAndRestore("runs/backup")
      >>> model.fit(ds, epochs=10, steps_per_epoch=100, callbacks=[backup])  # interrupted...
      >>> model.fit(ds, epochs=10, steps_per_epoch=100, callbacks=[backup])  # ...resumes
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        save_freq: str | int = "epoch",
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__()
        if not backup_dir:
            raise ValueError("BackupAndRestore needs a backup_dir, e.g. 'runs/backup'")
        if save_freq != "epoch" and (not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"save_freq must be 'epoch' or a positive int, got {save_freq!r}")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self._checkpointer: TrainCheckpointer | None = None
        self._saves = 0
        self._last_saved_steps = 0

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        if self._checkpointer is not None:  # the last fit was interrupted: finish its save
            self._checkpointer.close()
        self._checkpointer = TrainCheckpointer(self.backup_dir, max_to_keep=1)
        self._saves = self._checkpointer.latest_step() or 0
        self._last_saved_steps = 0
        if isinstance(self.save_freq, int):
            self.model.engine.add_step_hook(self._on_steps)
        if self._checkpointer.latest_step() is None:
            return
        record = self._checkpointer.restore(self.model.engine)
        self.model.train_step_count = int(record["train_step_count"])
        self.model.engine.position.resume_at(
            int(record["epoch"]),
            int(record["steps"]),
            bool(record["epoch_done"]),
            record.get("data"),
        )

    def _save(self, epoch: int, steps: int, done: bool, data_state: Any) -> None:
        self._saves += 1
        record = {
            "epoch": epoch,
            "steps": steps,
            "epoch_done": done,
            "data": data_state,
            "train_step_count": self.model.train_step_count,
        }
        self._checkpointer.save(self._saves, self.model.engine, record)

    def _on_steps(self, steps: int, feed: Any) -> None:
        if steps - self._last_saved_steps >= self.save_freq:
            self._last_saved_steps = steps
            state = feed.get_state() if feed.checkpointable else None
            position = self.model.engine.position
            self._save(position.epoch, position.steps_done + steps, False, state)

    def save_now(self, steps: int, feed: Any) -> None:
        """Backs up at this step boundary, `steps` into the epoch, waits until it is on disk
        and releases the writer's threads (preemption: the process exits right after, and a
        thread still inside Orbax when Python shuts down aborts the process)."""
        state = feed.get_state() if feed.checkpointable else None
        position = self.model.engine.position
        self._save(position.epoch, position.steps_done + steps, False, state)
        checkpointer, self._checkpointer = self._checkpointer, None
        checkpointer.close()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._last_saved_steps = 0
        self._save(epoch, 0, True, self.model.engine.position.data_state)

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self.model.engine.remove_step_hook(self._on_steps)
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is None:
            return
        checkpointer.close()
        if self.delete_checkpoint and jax.process_index() == 0:
            shutil.rmtree(self.backup_dir, ignore_errors=True)
