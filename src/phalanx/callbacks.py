"""Callbacks with Keras's hooks; hooks nobody overrides cost nothing."""

from __future__ import annotations

from phalanx._src.train.callbacks.backup import BackupAndRestore as BackupAndRestore
from phalanx._src.train.callbacks.base import Callback as Callback
from phalanx._src.train.callbacks.callback_list import CallbackList as CallbackList
from phalanx._src.train.callbacks.csv_logger import CSVLogger as CSVLogger
from phalanx._src.train.callbacks.early_stopping import EarlyStopping as EarlyStopping
from phalanx._src.train.callbacks.history import History as History
from phalanx._src.train.callbacks.lambda_callback import LambdaCallback as LambdaCallback
from phalanx._src.train.callbacks.lr_scheduler import LearningRateScheduler as LearningRateScheduler
from phalanx._src.train.callbacks.model_checkpoint import ModelCheckpoint as ModelCheckpoint
from phalanx._src.train.callbacks.progbar import ProgbarLogger as ProgbarLogger
from phalanx._src.train.callbacks.reduce_lr_on_plateau import (
    ReduceLROnPlateau as ReduceLROnPlateau,
)
from phalanx._src.train.callbacks.tensorboard import TensorBoard as TensorBoard
from phalanx._src.train.callbacks.terminate_on_nan import TerminateOnNaN as TerminateOnNaN

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
