"""TF's `tf.train` names: checkpoints, for code that renames `tf.` to `phalanx.`.

`phalanx.train.Checkpoint`, `CheckpointManager` and `latest_checkpoint` are the same
objects as `phalanx.Checkpoint`, `phalanx.CheckpointManager` and
`phalanx.latest_checkpoint`. `load_checkpoint`, `list_variables` and
`init_from_checkpoint` read checkpoints TensorFlow wrote, without TensorFlow.
"""

from __future__ import annotations

from phalanx._src.train.checkpoint.manager import CheckpointManager as CheckpointManager
from phalanx._src.train.checkpoint.tf_checkpoint import Checkpoint as Checkpoint
from phalanx._src.train.checkpoint.tf_checkpoint import latest_checkpoint as latest_checkpoint
from phalanx._src.train.checkpoint.tf_format.assign import (
    init_from_checkpoint as init_from_checkpoint,
)
from phalanx._src.train.checkpoint.tf_format.bundle import CheckpointReader as CheckpointReader
from phalanx._src.train.checkpoint.tf_format.bundle import list_variables as list_variables
from phalanx._src.train.checkpoint.tf_format.bundle import load_checkpoint as load_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "CheckpointReader",
    "init_from_checkpoint",
    "latest_checkpoint",
    "list_variables",
    "load_checkpoint",
]
