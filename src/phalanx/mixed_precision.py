"""Mixed precision: dtype policies and Keras's dynamic loss scaling."""

from __future__ import annotations

from phalanx._src.train.api.precision import LossScaleState as LossScaleState
from phalanx._src.train.api.precision import Policy as Policy
from phalanx._src.train.api.precision import all_finite as all_finite
from phalanx._src.train.api.precision import current_loss_scale as current_loss_scale
from phalanx._src.train.api.precision import get as get
from phalanx._src.train.api.precision import global_policy as global_policy
from phalanx._src.train.api.precision import loss_scale_optimizer as loss_scale_optimizer
from phalanx._src.train.api.precision import scale_loss as scale_loss
from phalanx._src.train.api.precision import set_global_policy as set_global_policy
from phalanx._src.train.api.precision import unscale_grads as unscale_grads

__all__ = [
    "LossScaleState",
    "Policy",
    "all_finite",
    "current_loss_scale",
    "get",
    "global_policy",
    "loss_scale_optimizer",
    "scale_loss",
    "set_global_policy",
    "unscale_grads",
]
