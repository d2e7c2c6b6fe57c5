"""Saving and restoring a Model's whole training state with Orbax, atomically.

A checkpoint holds the train state (parameters, the module's other variables, optimizer
state with its accumulator and loss scale, metric sums) and a small JSON record (epoch,
steps done in it, the data iterator's position). Orbax writes into a temporary directory
and renames it when complete, so an interrupted save never leaves a checkpoint that looks
whole. Every process calls `save` and `restore` (they are collective in a multi-process job);
replicated arrays are written once.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:
    from phalanx._src.train.model import Model


def _abstract(state: Any) -> Any:
    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state
    )


class TrainCheckpointer:
    """Numbered checkpoints of a `Model`'s train state in one directory.

    Args:
      directory: where checkpoints go (created if missing); one sub-directory per save.
      max_to_keep: keep only the newest N (None: all).

    Example:
      >>> ckpt = TrainCheckpointer("runs/ckpt", max_to_keep=2)
      >>> ckpt.save(10, model, {"epoch": 3})
      >>> record = ckpt.restore(model)           # the newest; returns {"epoch": 3}
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int | None = None) -> None:
        import orbax.checkpoint as ocp  # 1 s to import: only when checkpointing

        self._ocp = ocp
        self.directory = os.path.abspath(os.fspath(directory))
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
            ),
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's number, or None."""
        return self._manager.latest_step()

    def save(self, step: int, model: Model, record: dict[str, Any]) -> None:
        """Writes `model`'s train state and `record` (JSON-serialisable) as checkpoint `step`."""
        ocp = self._ocp
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(model._state), record=ocp.args.JsonSave(record)
            ),
            force=True,
        )
        self._manager.wait_until_finished()

    def restore(self, model: Model, step: int | None = None) -> dict[str, Any]:
        """Loads checkpoint `step` (default: the newest) into `model`; returns its record.

        Raises:
          FileNotFoundError: when there is no checkpoint.
        """
        ocp = self._ocp
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_abstract(model._state)),
                record=ocp.args.JsonRestore(),
            ),
        )
        model._state = restored["state"]
        return dict(restored["record"])

    def delete_all(self) -> None:
        """Removes every checkpoint (BackupAndRestore after a finished run)."""
        for step in list(self._manager.all_steps()):
            self._manager.delete(step)

    def close(self) -> None:
        self._manager.close()
