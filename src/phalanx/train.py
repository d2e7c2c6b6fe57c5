"""TF's `tf.train` names: checkpoints, for code that renames `tf.` to `phalanx.`.

`phalanx.train.Checkpoint`, `CheckpointManager` and `latest_checkpoint` are the same
objects as `phalanx.Checkpoint`, `phalanx.CheckpointManager` and
`phalanx.latest_checkpoint`.
"""

from __future__ import annotations

from phalanx._src.train.checkpoint.manager import CheckpointManager as CheckpointManager
from phalanx._src.train.checkpoint.tf_checkpoint import Checkpoint as Checkpoint
from phalanx._src.train.checkpoint.tf_checkpoint import latest_checkpoint as latest_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "latest_checkpoint",
]
