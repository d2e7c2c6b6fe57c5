"""Callbacks with Keras's hooks; hooks nobody overrides cost nothing."""

from __future__ import annotations

from phalanx._src.train.api.callbacks.base import Callback as Callback
from phalanx._src.train.api.callbacks.callback_list import CallbackList as CallbackList
from phalanx._src.train.api.callbacks.csv_logger import CSVLogger as CSVLogger
from phalanx._src.train.api.callbacks.early_stopping import EarlyStopping as EarlyStopping
from phalanx._src.train.api.callbacks.history import History as History
from phalanx._src.train.api.callbacks.lambda_callback import LambdaCallback as LambdaCallback
from phalanx._src.train.api.callbacks.lr_scheduler import (
    LearningRateScheduler as LearningRateScheduler,
)
from phalanx._src.train.api.callbacks.progbar import ProgbarLogger as ProgbarLogger
from phalanx._src.train.api.callbacks.reduce_lr_on_plateau import (
    ReduceLROnPlateau as ReduceLROnPlateau,
)
from phalanx._src.train.api.callbacks.tensorboard import TensorBoard as TensorBoard
from phalanx._src.train.api.callbacks.terminate_on_nan import TerminateOnNaN as TerminateOnNaN
from phalanx._src.train.checkpoint.backup import BackupAndRestore as BackupAndRestore
from phalanx._src.train.checkpoint.model_checkpoint import ModelCheckpoint as ModelCheckpoint

__all__ = [
    "BackupAndRestore",
    "CSVLogger",
    "Callback",
    "CallbackList",
    "EarlyStopping",
    "History",
    "LambdaCallback",
    "LearningRateScheduler",
    "ModelCheckpoint",
    "ProgbarLogger",
    "ReduceLROnPlateau",
    "TensorBoard",
    "TerminateOnNaN",
]
