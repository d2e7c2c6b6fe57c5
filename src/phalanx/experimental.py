"""TF's `tf.distribute.experimental` names that TF programs pass to a strategy.

XLA chooses the collective on every platform, so these options are validated and kept
(`strategy.communication_options`) and change no number: see `phalanx.Strategy`.
"""

from __future__ import annotations

from phalanx._src.strategy.communication import (
    CollectiveCommunication as CollectiveCommunication,
)
from phalanx._src.strategy.communication import (
    CommunicationImplementation as CommunicationImplementation,
)
from phalanx._src.strategy.communication import CommunicationOptions as CommunicationOptions

__all__ = [
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
]
