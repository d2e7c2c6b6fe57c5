"""`BackupAndRestore`: an interrupted `fit` resumes where it stopped."""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any

import jax

from phalanx._src.train.api.callbacks.base import Callback
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer, close_for, open_for
from phalanx._src.train.checkpoint.record import CheckpointError

# Written into a backup folder that BackupAndRestore created: the folder goes with the
# backup only then (and only if nothing else is in it).
MADE_HERE = ".phalanx-backup-folder"
# What a backup's record holds; a checkpoint without them was written by something else.
RECORD_KEYS = ("epoch", "steps", "epoch_done", "train_step_count")
KEEP = 2  # the newest backup, and the one before it in case the newest is damaged


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
    After a `fit` that finishes, the backup is deleted (`delete_checkpoint=True`): the
    backup's own checkpoints, and the folder only if `BackupAndRestore` created it and
    nothing else is in it. The two newest backups are kept: if the newest is damaged (cut
    short by a full disk, say), `fit` warns and resumes from the one before.

    The folder must be the backup's own: `fit` refuses one that is a file, cannot be
    written, holds checkpoints of another kind, is used by another checkpoint callback of
    the same `fit`, or by another job (a lock file names it), before any training step.

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
        # The last fit was interrupted: finish its save, give the folder back.
        close_for(self, self._checkpointer)
        self._checkpointer = None
        checkpointer = open_for(self, self.backup_dir, max_to_keep=KEEP)
        self._checkpointer = checkpointer
        try:
            record = self._restore(checkpointer)
        except BaseException:
            self._checkpointer = None
            close_for(self, checkpointer)
            raise
        if checkpointer.created and jax.process_index() == 0:
            (Path(checkpointer.directory) / MADE_HERE).write_text(
                "made by phalanx's BackupAndRestore: removed with the backup when empty\n"
            )
        self._saves = checkpointer.latest_step() or 0
        self._last_saved_steps = 0
        self.model.engine.remove_step_hook(self._on_steps)  # left by an interrupted fit
        if isinstance(self.save_freq, int):
            self.model.engine.add_step_hook(self._on_steps)
        if record is None:
            return
        self.model.train_step_count = int(record["train_step_count"])
        self.model.engine.position.resume_at(
            int(record["epoch"]),
            int(record["steps"]),
            bool(record["epoch_done"]),
            record.get("data"),
        )

    def _restore(self, checkpointer: TrainCheckpointer) -> dict[str, Any] | None:
        """The newest backup that restores, restored; None when there is none.

        Raises:
          CheckpointError: when the folder holds checkpoints that are not backups, or none
            of its backups can be restored.
        """
        steps = checkpointer.steps()
        foreign = []
        for step in steps:
            with contextlib.suppress(CheckpointError):  # a damaged one: judged below
                if not all(key in checkpointer.record(step) for key in RECORD_KEYS):
                    foreign.append(step)
        if foreign:
            raise CheckpointError(
                f"BackupAndRestore's folder {checkpointer.directory} holds checkpoints "
                f"{foreign} that are not backups (another callback wrote them); the backup "
                "would delete them when fit ends: give BackupAndRestore a folder of its own, "
                f"e.g. {os.path.join(checkpointer.directory, 'backup')!r}"
            )
        failures: list[CheckpointError] = []
        for step in reversed(steps):
            try:
                record = checkpointer.restore(self.model.engine, step, expect=RECORD_KEYS)
            except CheckpointError as error:
                failures.append(error)
                continue
            if failures:
                warnings.warn(
                    f"BackupAndRestore: the newest backup cannot be restored ({failures[0]}); "
                    f"resuming from the one before it, step {step}",
                    stacklevel=3,
                )
            return record
        if failures:
            raise CheckpointError(
                f"no backup in {checkpointer.directory} can be restored (the newest: "
                f"{failures[0]}); to start over instead, delete the folder"
            ) from failures[0]
        return None

    def _save(self, epoch: int, steps: int, done: bool, data_state: Any) -> None:
        self._saves += 1
        record = {
            "epoch": epoch,
            "steps": steps,
            "epoch_done": done,
            "data": data_state,
            "train_step_count": self.model.train_step_count,
        }
        try:
            self._checkpointer.save(self._saves, self.model.engine, record)
        except BaseException:  # a save that failed (a full disk): give the folder back
            checkpointer, self._checkpointer = self._checkpointer, None
            close_for(self, checkpointer)
            raise

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
        close_for(self, checkpointer)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._last_saved_steps = 0
        self._save(epoch, 0, True, self.model.engine.position.data_state)

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self.model.engine.remove_step_hook(self._on_steps)
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is None:
            return
        try:
            if self.delete_checkpoint:
                checkpointer.delete_all()  # the backups and their leftovers, nothing else
        finally:
            close_for(self, checkpointer)  # releases the folder's lock
        made_here = Path(checkpointer.directory) / MADE_HERE
        if self.delete_checkpoint and jax.process_index() == 0 and made_here.is_file():
            made_here.unlink()
            with contextlib.suppress(OSError):  # not empty: what else is in it stays
                os.rmdir(checkpointer.directory)
