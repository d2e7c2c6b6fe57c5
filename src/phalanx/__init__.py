"""phalanx: tf.distribute's programming model, on JAX.

Resolve the hardware, open a strategy scope, build the model, then `fit` it, or write a
custom loop whose step runs once per replica:

    import phalanx
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = ...                      # Flax NNX module, replicated
    per_replica = strategy.run(step, args=(model, optimizer, batch))
    loss = strategy.reduce("sum", per_replica, axis=None)
"""

from phalanx import callbacks as callbacks
from phalanx import cluster as cluster
from phalanx import data as data
from phalanx import datasets as datasets
from phalanx import experimental as experimental
from phalanx import image as image
from phalanx import losses as losses
from phalanx import metrics as metrics
from phalanx import mixed_precision as mixed_precision
from phalanx import optimizers as optimizers
from phalanx import train as train
from phalanx import tune as tune
from phalanx._src import compilation_cache as _compilation_cache
from phalanx._src.compilation_cache import set_compilation_cache as set_compilation_cache
from phalanx._src.strategy.aggregation import (
    register_variable_aggregation as register_variable_aggregation,
)
from phalanx._src.strategy.communication import CrossDeviceOps as CrossDeviceOps
from phalanx._src.strategy.communication import (
    HierarchicalCopyAllReduce as HierarchicalCopyAllReduce,
)
from phalanx._src.strategy.communication import NcclAllReduce as NcclAllReduce
from phalanx._src.strategy.communication import ReductionToOneDevice as ReductionToOneDevice
from phalanx._src.strategy.distribute import InputContext as InputContext
from phalanx._src.strategy.function import function as function
from phalanx._src.strategy.loss import compute_average_loss as compute_average_loss
from phalanx._src.strategy.loss import scale_regularization_loss as scale_regularization_loss
from phalanx._src.strategy.padding import PaddedBatchWarning as PaddedBatchWarning
from phalanx._src.strategy.reduce_op import ReduceOp as ReduceOp
from phalanx._src.strategy.replica_context import ReplicaContext as ReplicaContext
from phalanx._src.strategy.replica_context import get_replica_context as get_replica_context
from phalanx._src.strategy.strategy import Strategy as Strategy
from phalanx._src.strategy.strategy import get_strategy as get_strategy
from phalanx._src.strategy.strategy import has_strategy as has_strategy
from phalanx._src.strategy.values import PerReplica as PerReplica
from phalanx._src.strategy.values import get_batch_mask as get_batch_mask
from phalanx._src.train.checkpoint.manager import CheckpointManager as CheckpointManager
from phalanx._src.train.checkpoint.tf_checkpoint import Checkpoint as Checkpoint
from phalanx._src.train.checkpoint.tf_checkpoint import latest_checkpoint as latest_checkpoint
from phalanx._src.train.model import Model as Model

__version__ = "0.1.0"

_compilation_cache.configure_from_environment()  # on by default: fast restarts

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "InputContext",
    "Model",
    "NcclAllReduce",
    "PaddedBatchWarning",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "Strategy",
    "compute_average_loss",
    "function",
    "get_batch_mask",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "latest_checkpoint",
    "register_variable_aggregation",
    "scale_regularization_loss",
    "set_compilation_cache",
]
